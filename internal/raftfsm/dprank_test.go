package raftfsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestRegisterKeepsDataParallelRank checks that a worker's data-parallel
// rank is part of its stored spec, survives a snapshot, and stays unset
// for a worker registered without one (rank 0 and no rank differ).
func TestRegisterKeepsDataParallelRank(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.registerSpec(&kvdirv1.WorkerSpec{Id: "eng-dp0", Address: "http://e:8000", BlockSize: 16, DataParallelRank: proto.Uint32(0)})
	h.registerSpec(&kvdirv1.WorkerSpec{Id: "eng-dp1", Address: "http://e:8000", BlockSize: 16, DataParallelRank: proto.Uint32(1)})
	h.registerSpec(&kvdirv1.WorkerSpec{Id: "solo", Address: "http://s:8000", BlockSize: 16})

	check := func(f *raftfsm.FSM, when string) {
		t.Helper()
		for id, want := range map[string]*uint32{"eng-dp0": proto.Uint32(0), "eng-dp1": proto.Uint32(1), "solo": nil} {
			got := mustWorker(t, f, id).GetSpec().DataParallelRank
			if (got == nil) != (want == nil) || (got != nil && *got != *want) {
				t.Fatalf("%s: worker %s rank %v, want %v", when, id, got, want)
			}
		}
	}
	check(h.f, "after register")

	f2 := raftfsm.New(raftfsm.Options{})
	if err := restore(f2, snapshotBytes(t, h.f)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	check(f2, "after restore")
}
