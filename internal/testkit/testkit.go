// Package testkit is the shared test harness of kvdir: waits on conditions
// with deadlines, a logger writing into a test's output, free loopback
// addresses, child processes built from the repository's commands, and the
// rule that tests needing more than Go skip under -short.
//
// Its helpers without a testing.TB (Poll, LoopbackAddrs, LoopbackPorts,
// Proc, Build) are also used by non-test code: the process fleet
// (internal/testkit/fleet) the benchmarks run on, and the chaos harness.
// The in-process directory cluster is internal/testkit/dirtest.
package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// pollInterval is the least time between two checks of a condition.
const pollInterval = 10 * time.Millisecond

// Poll checks cond until it holds, ctx ends or timeout passes. cond
// returns whether it holds and, if not, what it saw; the error names what
// was awaited and the last thing seen. Between two checks Poll waits 10 ms
// or as long as the check took, whichever is longer, so that an expensive
// check (a docker exec, a gRPC call to a busy node) takes at most half of
// the time.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	return poll(ctx, timeout, what, cond, func(took time.Duration) time.Duration { return max(pollInterval, took) })
}

// PollEvery is Poll with a fixed wait (at least 10 ms) between checks
// instead of one as long as the check: for an expensive check whose first
// success is itself the figure measured (a time to converge), which would
// otherwise come up to two checks late.
func PollEvery(ctx context.Context, timeout, every time.Duration, what string, cond func() (bool, string)) error {
	return poll(ctx, timeout, what, cond, func(time.Duration) time.Duration { return max(pollInterval, every) })
}

// poll is Poll and PollEvery: wait returns the pause after a check that
// took the given time.
func poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string), wait func(took time.Duration) time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		began := time.Now()
		ok, saw := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if saw == "" {
				return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
			}
			return fmt.Errorf("timed out after %v waiting for %s; last seen: %s", timeout, what, saw)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(wait(time.Since(began))):
		}
	}
}

// Eventually is Poll for tests: it fails t if cond does not hold within
// timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := Poll(context.Background(), timeout, what, cond); err != nil {
		t.Fatal(err)
	}
}

// SkipIfShort skips t under -short, saying why: the unit tier runs no
// child process, real binary or tool beyond Go (python3, haproxy, docker).
func SkipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s; skipped with -short", why)
	}
}
