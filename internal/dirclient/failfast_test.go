package dirclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// TestFailFastGivesUpAfterOneRound checks that a FailFast read at nodes
// that refuse connections ends after one attempt per node, before its
// deadline, with a Refused UnreachableError naming every node; that the
// same read without FailFast keeps retrying them until the deadline; and
// that a FailFast read at a live node is answered as usual.
func TestFailFastGivesUpAfterOneRound(t *testing.T) {
	dead := []string{deadAddr(t), deadAddr(t)}
	c := newClient(t, Config{Addrs: dead})
	var at attempts
	c.onAttempt = at.hook

	// A deadline far beyond the test's: returning at all proves the call
	// did not wait for it.
	ctx, cancel := context.WithTimeout(FailFast(t.Context()), time.Hour)
	defer cancel()
	_, err := c.MatchChain(ctx, []uint64{1, 2}, 16, false)
	var ue *UnreachableError
	if !errors.As(err, &ue) || !ue.Refused || len(ue.Attempts) != 2 || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fail-fast match at refusing nodes: %v", err)
	}
	for _, a := range dead {
		if !strings.Contains(err.Error(), a) {
			t.Errorf("the error does not name %s: %v", a, err)
		}
	}
	if got := at.take(); len(got) != 2 {
		t.Fatalf("fail-fast attempts: %v, want one per node", got)
	}

	// Without FailFast the client retries until the deadline.
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	_, err = c.MatchChain(ctx2, []uint64{1, 2}, 16, false)
	if !errors.As(err, &ue) || ue.Refused || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("match without fail-fast: %v", err)
	}
	if got := at.take(); len(got) <= 2 {
		t.Fatalf("attempts without fail-fast: %v, want retries", got)
	}

	// A live node answers a fail-fast read.
	cl := dirtest.New(t, 1, dirConfig(node.Tokens{}))
	lc := newClient(t, Config{Addrs: append([]string{dead[0]}, cl.APIAddrs()...)})
	if _, err := lc.MatchChain(FailFast(testCtx(t, 20*time.Second)), []uint64{1}, 16, false); err != nil {
		t.Fatalf("fail-fast match with a live node: %v", err)
	}
}
