package memreturn

import (
	"context"
	"testing"
	"time"
)

// fake drives a Watcher with a manual clock, activity and allocation.
type fake struct {
	now      time.Time
	activity uint64
	alloc    uint64
	frees    int
}

func newFake(t *testing.T) (*fake, *Watcher) {
	t.Helper()
	f := &fake{now: time.Unix(1000, 0)}
	w := New(Config{Activity: func() uint64 { return f.activity },
		now: func() time.Time { return f.now }, allocated: func() uint64 { return f.alloc }, free: func() { f.frees++ }})
	return f, w
}

func TestReturnsOnceWhenABurstEnds(t *testing.T) {
	f, w := newFake(t)
	// A burst: activity moves, garbage piles up.
	for range 10 {
		f.now = f.now.Add(100 * time.Millisecond)
		f.activity++
		f.alloc += 16 << 20
		if w.Step() {
			t.Fatal("returned memory while the activity was still moving")
		}
	}
	f.now = f.now.Add(DefaultIdle / 2)
	if w.Step() {
		t.Fatal("returned memory before the node was idle for DefaultIdle")
	}
	f.now = f.now.Add(DefaultIdle)
	if !w.Step() || f.frees != 1 {
		t.Fatalf("no return after a burst of %d MiB and %v idle (frees %d)", f.alloc>>20, DefaultIdle, f.frees)
	}
	f.now = f.now.Add(DefaultEvery * 2)
	if w.Step() || f.frees != 1 {
		t.Fatal("returned memory again with nothing allocated since")
	}
}

func TestSmallBurstsAndShortIntervalsAreLeftToTheRuntime(t *testing.T) {
	f, w := newFake(t)
	f.activity++
	f.alloc += DefaultMinGarbage / 2
	w.Step()
	f.now = f.now.Add(time.Minute)
	if w.Step() {
		t.Fatalf("returned memory after only %d MiB allocated", f.alloc>>20)
	}
	f.alloc += DefaultMinGarbage
	if !w.Step() {
		t.Fatal("no return once enough was allocated")
	}
	// Another burst right after the return: wait for DefaultEvery.
	f.activity++
	f.alloc += 2 * DefaultMinGarbage
	w.Step()
	f.now = f.now.Add(2 * DefaultIdle)
	if w.Step() {
		t.Fatalf("returned twice within %v", DefaultEvery)
	}
	f.now = f.now.Add(DefaultEvery)
	if !w.Step() || f.frees != 2 {
		t.Fatalf("no second return %v after the first (frees %d)", DefaultEvery, f.frees)
	}
}

func TestRunReturnsRealMemory(t *testing.T) {
	var activity uint64
	returned := make(chan uint64, 1)
	w := New(Config{Activity: func() uint64 { return activity }, Idle: 20 * time.Millisecond, MinGarbage: 1 << 20,
		OnReturn: func(n uint64) {
			select {
			case returned <- n:
			default:
			}
		}})
	for range 64 {
		sink = make([]byte, 64<<10)
	}
	sink = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go w.Run(ctx)
	select {
	case n := <-returned:
		if n < 1<<20 {
			t.Fatalf("returned after %d bytes allocated, want >= 1 MiB", n)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return memory within 10 s of an idle process that allocated 4 MiB")
	}
}

// sink keeps the test's allocations from being optimised away.
var sink []byte
