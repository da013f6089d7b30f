package testkit

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Second, "three calls", func() (bool, string) { n++; return n >= 3, "" }); err != nil || n != 3 {
		t.Fatalf("poll: %v after %d calls", err, n)
	}
	err := Poll(context.Background(), 30*time.Millisecond, "never", func() (bool, string) { return false, "still no" })
	if err == nil || !strings.Contains(err.Error(), "never") || !strings.Contains(err.Error(), "still no") {
		t.Fatalf("timeout error %v: want what was awaited and what was seen", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, time.Hour, "cancelled", func() (bool, string) { return false, "" }); err == nil {
		t.Fatal("a cancelled context did not end the wait")
	}
}

// TestPollEveryWaitsItsInterval: after a slow check PollEvery waits its
// own interval, not as long as the check took (as Poll does).
func TestPollEveryWaitsItsInterval(t *testing.T) {
	const slow = 300 * time.Millisecond
	var ended time.Time
	var gaps []time.Duration
	cond := func() (bool, string) {
		if !ended.IsZero() {
			gaps = append(gaps, time.Since(ended))
		}
		time.Sleep(slow) // the slow check itself, not a wait for a condition
		ended = time.Now()
		return len(gaps) >= 2, ""
	}
	if err := PollEvery(context.Background(), time.Minute, 10*time.Millisecond, "three checks", cond); err != nil {
		t.Fatal(err)
	}
	for _, g := range gaps {
		if g >= slow {
			t.Fatalf("gaps between checks %v: PollEvery waited as long as the check (%v)", gaps, slow)
		}
	}
	gaps, ended = nil, time.Time{}
	if err := Poll(context.Background(), time.Minute, "three checks", cond); err != nil {
		t.Fatal(err)
	}
	for _, g := range gaps {
		if g < slow {
			t.Fatalf("gaps between checks %v: Poll waited less than the check took (%v)", gaps, slow)
		}
	}
}

func TestFreeAddrsDistinct(t *testing.T) {
	addrs := FreeAddrs(t, 5)
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] || Port(a) == 0 || !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("addresses %v", addrs)
		}
		seen[a] = true
	}
}

func TestTail(t *testing.T) {
	if got := Tail("a\nb\nc\n", 2); got != "... (1 lines cut)\nb\nc" {
		t.Fatalf("tail: %q", got)
	}
	if got := Tail("a\n", 5); got != "a" {
		t.Fatalf("short tail: %q", got)
	}
}

func TestLoggerDropsAfterTest(t *testing.T) {
	var log interface{ Info(string, ...any) }
	t.Run("inner", func(t *testing.T) { log = Logger(t); log.Info("inside") })
	log.Info("after the test: dropped, no panic")
}
