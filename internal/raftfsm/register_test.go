package raftfsm_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestRegisterEpochs(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	spec := &kvdirv1.WorkerSpec{
		Id: "w1", Address: "http://a", Model: "llama", BlockSize: 16,
		Engine: kvdirv1.EngineKind_ENGINE_KIND_VLLM, Labels: map[string]string{"zone": "z1"},
	}
	for want := uint64(1); want <= 3; want++ {
		if got := h.registerSpec(spec); got != want {
			t.Fatalf("registration %d: epoch %d", want, got)
		}
		w := mustWorker(t, h.f, "w1")
		if w.Epoch != want || w.State != wsActive || w.RegisteredIndex != h.idx || w.AppliedSeq != 0 {
			t.Fatalf("after registration %d: epoch %d state %v registered_index %d (want %d) applied_seq %d",
				want, w.Epoch, w.State, w.RegisteredIndex, h.idx, w.AppliedSeq)
		}
		if !proto.Equal(w.Spec, spec) {
			t.Fatalf("spec %v, want %v", w.Spec, spec)
		}
	}
	if h.f.AppliedIndex() != h.idx {
		t.Fatalf("AppliedIndex %d, want %d", h.f.AppliedIndex(), h.idx)
	}
	// The FSM keeps its own copy of the spec.
	spec.Labels["zone"] = "changed"
	if w := mustWorker(t, h.f, "w1"); w.Spec.Labels["zone"] != "z1" {
		t.Fatalf("stored spec aliases the command's: label %q", w.Spec.Labels["zone"])
	}
}

func TestRegisterResetsSequence(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	e := h.register("w")
	if w := mustWorker(t, h.f, "w"); w.AppliedSeq != 0 {
		t.Fatalf("applied_seq %d after re-registration, want 0", w.AppliedSeq)
	}
	r := h.publish1(batch("w", e, 1, 1, stored(0, gpu, 1)), stApplied)
	if r.AppliedSeq != 1 || r.CurrentEpoch != 2 {
		t.Fatalf("response %v, want applied_seq 1 at epoch 2", r)
	}
}

func TestRegisterClearsBlocks(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w1")
	h.register("w2")
	h.publish1(batch("w1", 1, 1, 1, stored(0, gpu, 1, 2, 3), stored(0, cpu, 7)), stApplied)
	h.publish1(batch("w2", 1, 1, 1, stored(0, gpu, 1, 2, 3)), stApplied)
	if w := mustWorker(t, h.f, "w1"); w.Blocks != 4 {
		t.Fatalf("w1 holds %d blocks before re-registration, want 4", w.Blocks)
	}
	h.register("w1")
	w1 := mustWorker(t, h.f, "w1")
	if w1.Blocks != 0 || w1.GpuBlocks != 0 || w1.CpuBlocks != 0 {
		t.Fatalf("w1 after re-registration: blocks %d gpu %d cpu %d, want 0", w1.Blocks, w1.GpuBlocks, w1.CpuBlocks)
	}
	m := match(t, h.f, 1, 2, 3)
	if _, ok := m["w1"]; ok || m["w2"].Blocks != 3 || len(m) != 1 {
		t.Fatalf("Match after re-registration: %v, want only w2 with 3 blocks", m)
	}
	if len(match(t, h.f, 7)) != 0 {
		t.Fatalf("block 7 still matched after its only holder re-registered")
	}
	if w2 := mustWorker(t, h.f, "w2"); w2.Blocks != 3 {
		t.Fatalf("w2 holds %d blocks, want 3", w2.Blocks)
	}
}

func TestRegisterInvalid(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	cases := []struct {
		name string
		spec *kvdirv1.WorkerSpec
	}{
		{"no spec", nil},
		{"empty id", &kvdirv1.WorkerSpec{BlockSize: 16}},
		{"id too long", &kvdirv1.WorkerSpec{Id: long(257), BlockSize: 16}},
		{"block size 65537", &kvdirv1.WorkerSpec{Id: "w", BlockSize: 65537}},
		{"address too long", &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, Address: long(2049)}},
		{"model too long", &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, Model: long(1025)}},
		{"data-parallel rank 256", &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, DataParallelRank: proto.Uint32(256)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, raftfsm.Options{})
			// An existing worker, with blocks, named like the refused specs.
			h.register("w")
			h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
			before := h.f.Digest()
			res := h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: c.spec})
			errResult(t, res, raftfsm.ErrInvalid)
			if h.f.Digest() != before {
				t.Fatalf("refused registration changed the state")
			}
			w := mustWorker(t, h.f, "w")
			if w.Epoch != 1 || w.Blocks != 2 || w.AppliedSeq != 1 {
				t.Fatalf("refused registration touched worker w: %v", w)
			}
			if n := len(h.f.Workers("", true)); n != 1 {
				t.Fatalf("%d workers after a refused registration, want 1", n)
			}
			if len(h.changes) != 1 { // the valid registration only
				t.Fatalf("OnWorkersChanged calls %v, want one (for the valid registration)", h.changes)
			}
		})
	}
}

func TestRegisterLimitsInclusive(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	for _, spec := range []*kvdirv1.WorkerSpec{
		{Id: strings.Repeat("i", 256), BlockSize: 1},
		{Id: "big", BlockSize: 1 << 16, Address: strings.Repeat("a", 2048), Model: strings.Repeat("m", 1024)},
		{Id: "rank", BlockSize: 16, DataParallelRank: proto.Uint32(255)},
	} {
		if e := h.registerSpec(spec); e != 1 {
			t.Fatalf("register %.10q: epoch %d", spec.Id, e)
		}
	}
}

func TestRegisterTooMany(t *testing.T) {
	h := newHarness(t, raftfsm.Options{Index: radix.Options{MaxWorkers: 2}})
	h.register("a")
	h.register("b")
	before := h.f.Digest()
	errResult(t, h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "c", BlockSize: 16}}), raftfsm.ErrTooMany)
	if h.f.Digest() != before {
		t.Fatalf("refused registration changed the state")
	}
	if _, ok := h.f.Worker("c"); ok {
		t.Fatalf("refused worker c is known")
	}
	// Re-registering a live worker does not add one.
	if e := h.register("a"); e != 2 {
		t.Fatalf("re-registration of a at the limit: epoch %d, want 2", e)
	}
	// A draining worker still counts.
	h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "b"})
	errResult(t, h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "c", BlockSize: 16}}), raftfsm.ErrTooMany)
	// An expired one does not.
	if res := h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "b", Epoch: 1}); res != nil {
		t.Fatalf("expire b: %v", res)
	}
	if e := h.register("c"); e != 1 {
		t.Fatalf("register c after b expired: epoch %d", e)
	}
}

// A gone worker coming back is a new live worker and must count against
// MaxWorkers like any other: otherwise more workers are alive than the index
// has slots for, and the extra worker's published blocks are silently lost
// while its batches report APPLIED.
func TestRegisterGoneWorkerCountsTowardLimit(t *testing.T) {
	h := newHarness(t, raftfsm.Options{Index: radix.Options{MaxWorkers: 2}})
	h.register("a")
	h.register("b")
	h.publish1(batch("a", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.publish1(batch("b", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	if res := h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "a", Epoch: 1}); res != nil {
		t.Fatalf("expire a: %v", res)
	}
	h.register("c")
	h.publish1(batch("c", 1, 1, 1, stored(0, gpu, 1)), stApplied)

	res := h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "a", BlockSize: 16}})
	if _, ok := res.(*raftfsm.RegisterResult); ok {
		// Show the consequence before failing.
		r := h.publish(batch("a", 2, 1, 1, stored(0, gpu, 1)))[0]
		t.Fatalf("re-registration of expired worker a with 2 live workers and MaxWorkers 2 succeeded; "+
			"its next batch is %v but it holds %d blocks (want ErrTooMany)", r.Status, mustWorker(t, h.f, "a").Blocks)
	}
	errResult(t, res, raftfsm.ErrTooMany)
	if w := mustWorker(t, h.f, "a"); w.State != wsExpired {
		t.Fatalf("refused re-registration changed a's state to %v", w.State)
	}
}

// TestRegisterLargePool fills the default worker limit, which is no longer
// bound by the index's layout: 65,536 live workers, each holding a block of
// one shared chain, are matched together, survive a snapshot restore with
// the limit still counted, and the next live worker is refused until one
// retires.
func TestRegisterLargePool(t *testing.T) {
	testkit.SkipIfShort(t, "registers 65,536 workers")
	const n = radix.DefaultMaxWorkers
	if n < 1<<16 {
		t.Fatalf("default worker limit %d, want at least 65,536", n)
	}
	h := newHarness(t, raftfsm.Options{})
	for i := range n {
		id := fmt.Sprintf("w%05d", i)
		h.register(id)
		if i%4096 == 0 || i == n-1 {
			h.publish1(batch(id, 1, 1, 1, stored(0, gpu, 7)), stApplied)
		}
	}
	if m := match(t, h.f, 7); len(m) != n/4096+1 || m["w65535"].Blocks != 1 {
		t.Fatalf("match over the pool: %d workers", len(m))
	}
	g := raftfsm.New(raftfsm.Options{})
	if err := restore(g, snapshotBytes(t, h.f)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*raftfsm.FSM{h.f, g} {
		h.f = f
		errResult(t, h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "extra", BlockSize: 16}}), raftfsm.ErrTooMany)
		if res := h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "w00001", Epoch: 1}); res != nil {
			t.Fatalf("expire: %v", res)
		}
		if e := h.register("extra"); e != 1 {
			t.Fatalf("register after an expiry: epoch %d", e)
		}
	}
}
