package node

import (
	"context"
	"errors"
	"testing"
	"time"
)

// stuckFuture never completes, like a leadership transfer whose target
// does not catch up.
type stuckFuture struct{ ch chan struct{} }

func (f stuckFuture) Error() error { <-f.ch; return nil }

type doneFuture struct{ err error }

func (f doneFuture) Error() error { return f.err }

// TestWaitFutureBounded checks that the shutdown hand-over cannot hold a
// node past half of its shutdown budget, nor past the fixed bound.
func TestWaitFutureBounded(t *testing.T) {
	f := stuckFuture{ch: make(chan struct{})}
	defer close(f.ch)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := waitFuture(ctx, f, time.Hour); err == nil {
		t.Fatal("a stuck future reported success")
	}
	if el := time.Since(start); el > 350*time.Millisecond {
		t.Fatalf("waited %v with a 400 ms budget; want about half of it", el)
	}
	start = time.Now()
	if err := waitFuture(context.Background(), f, 50*time.Millisecond); err == nil || time.Since(start) > time.Second {
		t.Fatalf("no deadline: waited %v (err %v); want the 50 ms bound", time.Since(start), err)
	}
	want := errors.New("no target")
	if err := waitFuture(context.Background(), doneFuture{want}, time.Second); !errors.Is(err, want) {
		t.Fatalf("completed future: %v, want %v", err, want)
	}
}
