package raftfsm_test

import (
	"math"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestPublishSequencing(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")

	r := h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	if r.WorkerId != "w" || r.Epoch != 1 || r.FirstSeq != 1 || r.LastSeq != 1 ||
		r.AppliedSeq != 1 || r.CurrentEpoch != 1 || r.RaftIndex != h.idx {
		t.Fatalf("APPLIED response %v", r)
	}
	if d := depth(t, h.f, "w", 1, 2); d != 2 {
		t.Fatalf("depth %d after first batch, want 2", d)
	}

	// Each refused batch below must change nothing.
	unchanged := func(what string, before uint64) {
		t.Helper()
		if h.f.Digest() != before {
			t.Fatalf("%s changed the state", what)
		}
		if w := mustWorker(t, h.f, "w"); w.AppliedSeq != 1 {
			t.Fatalf("%s: applied_seq %d, want 1", what, w.AppliedSeq)
		}
	}

	before := h.f.Digest()
	// A re-sent batch (its events would add a block if applied).
	r = h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3)), stDuplicate)
	if r.AppliedSeq != 1 || r.CurrentEpoch != 1 {
		t.Fatalf("DUPLICATE response %v", r)
	}
	unchanged("duplicate", before)

	r = h.publish1(batch("w", 1, 3, 4, stored(0, gpu, 9), stored(0, gpu, 10)), stGap)
	if r.AppliedSeq != 1 || r.Message == "" {
		t.Fatalf("GAP response %v", r)
	}
	unchanged("gap", before)

	h.publish1(batch("w", 1, 2, 3, stored(2, gpu, 3), stored(2, gpu, 3)), stApplied)
	if d := depth(t, h.f, "w", 1, 2, 3); d != 3 {
		t.Fatalf("depth %d, want 3", d)
	}
	before = h.f.Digest()
	// A batch wholly at or below applied_seq is a duplicate, even if it does
	// not line up with earlier batches.
	h.publish1(batch("w", 1, 1, 3, stored(0, gpu, 8), stored(0, gpu, 8), stored(0, gpu, 8)), stDuplicate)
	h.publish1(batch("w", 1, 2, 2, stored(0, gpu, 8)), stDuplicate)
	// A batch that overlaps applied_seq and goes past it is a gap.
	r = h.publish1(batch("w", 1, 3, 5, stored(0, gpu, 8), stored(0, gpu, 8), stored(0, gpu, 8)), stGap)
	if r.AppliedSeq != 3 {
		t.Fatalf("overlap GAP response %v", r)
	}
	if h.f.Digest() != before || mustWorker(t, h.f, "w").AppliedSeq != 3 {
		t.Fatalf("duplicate or overlapping batches changed the state")
	}
	h.publish1(batch("w", 1, 4, 4), stApplied) // events are optional
	if w := mustWorker(t, h.f, "w"); w.AppliedSeq != 4 {
		t.Fatalf("applied_seq %d, want 4", w.AppliedSeq)
	}
}

func TestPublishStaleEpoch(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.register("w")
	h.publish1(batch("w", 2, 1, 2, stored(0, gpu, 5), stored(5, gpu, 6)), stApplied)
	before := h.f.Digest()
	r := h.publish1(batch("w", 1, 2, 2, stored(0, gpu, 1, 2)), stStale)
	if r.CurrentEpoch != 2 || r.AppliedSeq != 2 || r.Epoch != 1 {
		t.Fatalf("STALE_EPOCH response %v", r)
	}
	// Also a batch that would otherwise be next.
	h.publish1(batch("w", 1, 3, 3, stored(0, gpu, 1, 2)), stStale)
	if h.f.Digest() != before {
		t.Fatalf("stale batches changed the state")
	}
	if d := depth(t, h.f, "w", 1); d != 0 {
		t.Fatalf("block of a stale batch indexed")
	}
}

func TestPublishUnknownWorker(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("exp")
	h.register("dereg")
	h.register("live")
	h.publish1(batch("exp", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "exp", Epoch: 1})
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "dereg", Epoch: 1})
	before := h.f.Digest()
	for _, id := range []string{"nobody", "exp", "dereg"} {
		r := h.publish1(batch(id, 1, 2, 2, stored(0, gpu, 1, 2)), stUnknown)
		if r.WorkerId != id || r.Message == "" {
			t.Fatalf("UNKNOWN_WORKER response %v", r)
		}
	}
	h.publish1(batch("nobody", 1, 1, 1, stored(0, gpu, 3)), stUnknown)
	if h.f.Digest() != before {
		t.Fatalf("batches of unknown workers changed the state")
	}
	if len(match(t, h.f, 1)) != 0 || len(match(t, h.f, 3)) != 0 {
		t.Fatalf("blocks of unknown workers indexed")
	}
}

func TestPublishRejected(t *testing.T) {
	opts := raftfsm.Options{
		MaxBatchEvents: 3,
		MaxBatchBlocks: 6,
		Index:          radix.Options{MaxChain: 4},
	}
	ok := stored(3, gpu, 4) // a valid event ahead of the bad one
	cases := []struct {
		name string
		b    *kvdirv1.EventBatch
	}{
		{"first seq 0", batch("w", 1, 0, 3, stored(3, gpu, 4))},
		{"last before first", batch("w", 1, 3, 2, stored(3, gpu, 4))},
		{"epoch from the future", batch("w", 2, 2, 2, stored(3, gpu, 4))},
		{"zero hash stored", batch("w", 1, 2, 2, ok, stored(4, gpu, 5, 0, 6))},
		{"zero hash removed", batch("w", 1, 2, 2, ok, removed(gpu, false, 1, 0))},
		{"unknown medium stored", batch("w", 1, 2, 2, ok, stored(4, kvdirv1.Medium(9), 5))},
		{"unknown medium removed", batch("w", 1, 2, 2, ok, removed(kvdirv1.Medium(-1), false, 1))},
		{"unknown medium removed all media", batch("w", 1, 2, 2, ok, removed(kvdirv1.Medium(5), true, 1))},
		{"too many events", batch("w", 1, 2, 2, ok, cleared(), cleared(), cleared())},
		{"too many blocks", batch("w", 1, 2, 2, stored(3, gpu, 4, 5, 6, 7), removed(gpu, false, 1, 2, 3))},
		{"piece longer than MaxChain", batch("w", 1, 2, 2, stored(3, gpu, 4, 5, 6, 7, 8))},
		{"removal longer than MaxChain", batch("w", 1, 2, 2, removed(gpu, false, 1, 2, 3, 4, 5))},
		{"event without kind", batch("w", 1, 2, 2, ok, &kvdirv1.Event{})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, opts)
			h.register("w")
			h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3)), stApplied)
			before := h.f.Digest()
			r := h.publish1(c.b, stRejected)
			if r.Message == "" {
				t.Errorf("REJECTED without a message")
			}
			if r.AppliedSeq != 1 || r.CurrentEpoch != 1 {
				t.Errorf("REJECTED response %v, want applied_seq 1 current_epoch 1", r)
			}
			if h.f.Digest() != before {
				t.Fatalf("rejected batch changed the state")
			}
			if d := depth(t, h.f, "w", 1, 2, 3, 4); d != 3 {
				t.Fatalf("depth %d after a rejected batch, want 3", d)
			}
			// applied_seq did not move: the next batch is still 2.
			h.publish1(batch("w", 1, 2, 2, stored(3, gpu, 4)), stApplied)
			if d := depth(t, h.f, "w", 1, 2, 3, 4); d != 4 {
				t.Fatalf("depth %d after the next valid batch, want 4", d)
			}
		})
	}
}

func TestPublishLimitsInclusive(t *testing.T) {
	h := newHarness(t, raftfsm.Options{MaxBatchEvents: 3, MaxBatchBlocks: 6, Index: radix.Options{MaxChain: 4}})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3, 4), stored(4, gpu, 5, 6), cleared()), stApplied)
	h.publish1(batch("w", 1, 2, 2, stored(0, gpu, 1, 2, 3, 4), removed(cpu, false, 1, 2)), stApplied)
	if d := depth(t, h.f, "w", 1, 2, 3, 4); d != 4 {
		t.Fatalf("depth %d, want 4", d)
	}
}

func TestPublishSeveralBatches(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("a")
	h.register("b")
	h.register("b") // epoch 2
	rs := h.publish(
		batch("a", 1, 1, 1, stored(0, gpu, 1)),
		batch("a", 1, 1, 1, stored(0, gpu, 1)),
		batch("zz", 1, 1, 1),
		batch("b", 1, 1, 1),
		batch("a", 1, 2, 3, stored(1, gpu, 2), stored(2, gpu, 3)),
		batch("a", 1, 5, 5),
		batch("b", 2, 1, 1, stored(0, cpu, 9)),
		batch("a", 1, 0, 0),
		batch("a", 1, 4, 4, stored(2, gpu, 3)),
	)
	want := []kvdirv1.PublishStatus{stApplied, stDuplicate, stUnknown, stStale, stApplied, stGap, stApplied, stRejected, stApplied}
	wantSeq := []uint64{1, 1, 0, 0, 3, 3, 1, 3, 4}
	for i, r := range rs {
		if r.Status != want[i] || r.AppliedSeq != wantSeq[i] || r.RaftIndex != h.idx {
			t.Errorf("response %d: %v, want status %v applied_seq %d raft_index %d", i, r, want[i], wantSeq[i], h.idx)
		}
	}
	if d := depth(t, h.f, "a", 1, 2, 3); d != 3 {
		t.Fatalf("a depth %d, want 3", d)
	}
	if m := match(t, h.f, 9)["b"]; m.Blocks != 1 || m.Media[radix.CPU] != 1 {
		t.Fatalf("b match %v", m)
	}
	if len(h.changes) != 3 { // the three registrations
		t.Fatalf("OnWorkersChanged calls %v: publish must not call it", h.changes)
	}
}

func TestPublishEventOrder(t *testing.T) {
	t.Run("store then remove", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3), removed(gpu, false, 1, 2, 3)), stApplied)
		if w := mustWorker(t, h.f, "w"); w.Blocks != 0 {
			t.Fatalf("holds %d blocks, want 0", w.Blocks)
		}
		if len(match(t, h.f, 1, 2, 3)) != 0 {
			t.Fatalf("removed blocks still matched")
		}
		if c := h.f.Counters(); c.Blocks != 0 {
			t.Fatalf("index keeps %d unheld blocks, want 0", c.Blocks)
		}
	})
	t.Run("remove then store", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3)), stApplied)
		h.publish1(batch("w", 1, 2, 2, removed(gpu, false, 3), stored(2, gpu, 3)), stApplied)
		if d := depth(t, h.f, "w", 1, 2, 3); d != 3 {
			t.Fatalf("depth %d, want 3", d)
		}
	})
	t.Run("store then remove tail", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3), removed(gpu, false, 3)), stApplied)
		if d := depth(t, h.f, "w", 1, 2, 3); d != 2 {
			t.Fatalf("depth %d, want 2", d)
		}
	})
	t.Run("cleared then store", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.register("other")
		h.publish1(batch("other", 1, 1, 1, stored(0, gpu, 1)), stApplied)
		h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3), stored(0, cpu, 50)), stApplied)
		h.publish1(batch("w", 1, 2, 2, cleared(), stored(0, gpu, 10, 11)), stApplied)
		w := mustWorker(t, h.f, "w")
		if w.Blocks != 2 || w.GpuBlocks != 2 || w.CpuBlocks != 0 {
			t.Fatalf("after cleared+store: %v, want 2 GPU blocks", w)
		}
		if d := depth(t, h.f, "w", 1, 2, 3); d != 0 {
			t.Fatalf("cleared blocks still held (depth %d)", d)
		}
		if d := depth(t, h.f, "w", 10, 11); d != 2 {
			t.Fatalf("new blocks depth %d, want 2", d)
		}
		if d := depth(t, h.f, "other", 1); d != 1 {
			t.Fatalf("cleared touched another worker")
		}
	})
	t.Run("store then cleared", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2), cleared()), stApplied)
		if w := mustWorker(t, h.f, "w"); w.Blocks != 0 {
			t.Fatalf("holds %d blocks, want 0", w.Blocks)
		}
	})
	t.Run("out of order pieces", func(t *testing.T) {
		h := newHarness(t, raftfsm.Options{})
		h.register("w")
		h.publish1(batch("w", 1, 1, 1, stored(2, gpu, 3, 4)), stApplied)
		if d := depth(t, h.f, "w", 1, 2, 3, 4); d != 0 {
			t.Fatalf("detached piece matched (depth %d)", d)
		}
		h.publish1(batch("w", 1, 2, 2, stored(0, gpu, 1, 2)), stApplied)
		if d := depth(t, h.f, "w", 1, 2, 3, 4); d != 4 {
			t.Fatalf("depth %d after the missing parent arrived, want 4", d)
		}
	})
}

func TestPublishParentConflict(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	// Block 2 is indexed under 1; this piece names parent 7 for it. The
	// rest of the batch still applies.
	r := h.publish1(batch("w", 1, 2, 2, stored(0, gpu, 7), stored(7, gpu, 2, 3), stored(0, gpu, 20, 21)), stApplied)
	if r.Message == "" || r.AppliedSeq != 2 {
		t.Fatalf("conflict response %v, want a message and applied_seq 2", r)
	}
	if d := depth(t, h.f, "w", 20, 21); d != 2 {
		t.Fatalf("events after the conflict not applied (depth %d)", d)
	}
	if d := depth(t, h.f, "w", 1, 2); d != 2 {
		t.Fatalf("conflict disturbed the existing chain (depth %d)", d)
	}
	if d := depth(t, h.f, "w", 7, 2, 3); d != 1 {
		t.Fatalf("conflicting piece: depth %d along 7,2,3, want 1", d)
	}
}

func TestPublishMedia(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, cpu, 1, 2, 3)), stApplied)
	w := mustWorker(t, h.f, "w")
	if w.Blocks != 3 || w.CpuBlocks != 3 || w.GpuBlocks != 0 {
		t.Fatalf("after CPU store: blocks %d cpu %d gpu %d", w.Blocks, w.CpuBlocks, w.GpuBlocks)
	}
	if m := match(t, h.f, 1, 2, 3)["w"]; m.Blocks != 3 || m.Media[radix.CPU] != 3 || m.Media[radix.GPU] != 0 {
		t.Fatalf("match after CPU store %v", m)
	}

	// Unspecified means GPU; disk and remote have their own counts.
	h.publish1(batch("w", 1, 2, 2, stored(0, unsp, 1, 2), stored(2, disk, 3), stored(0, rmt, 1)), stApplied)
	w = mustWorker(t, h.f, "w")
	if w.Blocks != 3 || w.CpuBlocks != 3 || w.GpuBlocks != 2 || w.DiskBlocks != 1 || w.RemoteBlocks != 1 {
		t.Fatalf("after mixed stores: %v", w)
	}
	m := match(t, h.f, 1, 2, 3)["w"]
	if m.Media != [radix.NumMedia]int{2, 3, 0, 1} {
		t.Fatalf("match media %v, want [2 3 0 1]", m.Media)
	}

	// Removal on one medium leaves the others.
	h.publish1(batch("w", 1, 3, 3, removed(cpu, false, 1, 2, 3)), stApplied)
	w = mustWorker(t, h.f, "w")
	if w.CpuBlocks != 0 || w.GpuBlocks != 2 || w.DiskBlocks != 1 || w.RemoteBlocks != 1 || w.Blocks != 3 {
		t.Fatalf("after CPU removal: %v", w)
	}
	// Removal with GPU named but all_media set clears every medium.
	h.publish1(batch("w", 1, 4, 4, removed(gpu, true, 1, 2, 3)), stApplied)
	w = mustWorker(t, h.f, "w")
	if w.Blocks != 0 || w.GpuBlocks != 0 || w.DiskBlocks != 0 || w.RemoteBlocks != 0 {
		t.Fatalf("after all-media removal: %v", w)
	}
	if len(match(t, h.f, 1)) != 0 {
		t.Fatalf("blocks removed from all media still matched")
	}
}

func TestPublishUnspecifiedRemovalIsGPU(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1), stored(0, cpu, 1)), stApplied)
	h.publish1(batch("w", 1, 2, 2, removed(unsp, false, 1)), stApplied)
	w := mustWorker(t, h.f, "w")
	if w.GpuBlocks != 0 || w.CpuBlocks != 1 {
		t.Fatalf("after unspecified-medium removal: gpu %d cpu %d, want 0 1", w.GpuBlocks, w.CpuBlocks)
	}
}

func TestWorkerChainsAndCounters(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3), stored(1, gpu, 5)), stApplied)
	chains := h.f.WorkerChains("w", 0)
	want := []radix.Chain{{Tail: 3, Depth: 3}, {Tail: 5, Depth: 2}}
	if !slices.Equal(chains, want) {
		t.Fatalf("WorkerChains %v, want %v", chains, want)
	}
	if c := h.f.Counters(); c.Blocks != 4 || c.Workers != 1 || c.Sessions != 0 {
		t.Fatalf("Counters %+v", c)
	}
}

// A batch whose sequence range spans more numbers than it has events is
// refused: one claiming last_seq 2^64-1 would otherwise make every later
// honest batch of the worker a DUPLICATE.
func TestPublishSeqRangeBoundedByEvents(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	before := h.f.Digest()
	r := h.publish1(batch("w", 1, 1, math.MaxUint64, stored(0, gpu, 1)), stRejected)
	if r.Message == "" || r.AppliedSeq != 0 {
		t.Fatalf("REJECTED response %v, want a message and applied_seq 0", r)
	}
	h.publish1(batch("w", 1, 1, 3, stored(0, gpu, 1), stored(1, gpu, 2)), stRejected)
	h.publish1(batch("w", 1, 1, 2), stRejected) // an empty batch carries one number
	if h.f.Digest() != before {
		t.Fatalf("refused batches changed the state")
	}
	// The honest stream goes on.
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.publish1(batch("w", 1, 2, 3, stored(1, gpu, 2), stored(2, gpu, 3)), stApplied)
	h.publish1(batch("w", 1, 4, 4), stApplied)
	if w := mustWorker(t, h.f, "w"); w.AppliedSeq != 4 {
		t.Fatalf("applied_seq %d, want 4", w.AppliedSeq)
	}
}
