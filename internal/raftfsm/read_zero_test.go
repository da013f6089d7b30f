package raftfsm_test

import (
	"fmt"
	"testing"

	"github.com/kvdir/kvdir/internal/raftfsm"
)

// noPanic runs fn, turning a panic into an error.
func noPanic(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	fn()
	return nil
}

// zeroHashState is an FSM whose block table has been populated (and, if
// clear, emptied again), so that every shard of it has slots.
func zeroHashState(t *testing.T, clear bool) *harness {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	hs := make([]uint64, 4000)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, hs...)), stApplied)
	if clear {
		h.publish1(batch("w", 1, 2, 2, cleared()), stApplied)
	}
	return h
}

// Hash 0 is the root, never a block: a chain starting with it matches
// nothing. (Found by FuzzApply: testdata/fuzz/FuzzApply/87be626f79368435.)
func TestMatchChainStartingWithZero(t *testing.T) {
	for _, clear := range []bool{false, true} {
		h := zeroHashState(t, clear)
		err := noPanic(func() {
			m, _, err := h.f.Match(nil, []uint64{0, 1, 2})
			if err == nil && len(m) != 0 {
				t.Errorf("blocks cleared %v: Match([0 1 2]) = %v, want no worker", clear, m)
			}
		})
		if err != nil {
			t.Errorf("blocks cleared %v: Match([0 1 2]): %v", clear, err)
		}
	}
}

// A session recorded with tail 0 (RecordSessions accepts it) has no chain.
func TestSessionChainZeroTail(t *testing.T) {
	for _, clear := range []bool{false, true} {
		h := zeroHashState(t, clear)
		h.record(1, sess("s", "w", 0))
		r, _ := h.f.Session("s")
		err := noPanic(func() {
			if c, ok := h.f.SessionChain(r); ok {
				t.Errorf("blocks cleared %v: SessionChain(tail 0) = %d blocks, true; want false", clear, len(c))
			}
		})
		if err != nil {
			t.Errorf("blocks cleared %v: SessionChain(tail 0): %v", clear, err)
		}
	}
}
