package raftfsm_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func layoutEv(l *kvdirv1.WorkerLayout) *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Layout{Layout: l}}
}

// testLayout is a hybrid model's: a full-attention group of 64-token
// blocks, indexed, and a sliding-window group, not.
func testLayout() *kvdirv1.WorkerLayout {
	return &kvdirv1.WorkerLayout{BlockSizes: []uint32{64}, Groups: []*kvdirv1.KVGroup{
		{Index: 0, Kind: "full_attention", BlockSize: 64, Indexed: true},
		{Index: 1, Kind: "sliding_window", BlockSize: 64, SlidingWindow: 4096},
	}}
}

func TestLayoutApplied(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.changes = nil
	h.publish1(batch("w", 1, 1, 1, layoutEv(testLayout()), stored(0, gpu, 1, 2)), stApplied)
	if got := mustWorker(t, h.f, "w").GetLayout(); !proto.Equal(got, testLayout()) {
		t.Fatalf("layout after publish: %v, want %v", got, testLayout())
	}
	if len(h.changes) != 1 || !slices.Equal(h.changes[0].ids, []string{"w"}) {
		t.Fatalf("OnWorkersChanged after a layout: %v, want one call for w", h.changes)
	}
	// The same layout again changes nothing a watcher must hear of.
	h.changes = nil
	h.publish1(batch("w", 1, 2, 2, layoutEv(testLayout()), stored(2, gpu, 3)), stApplied)
	if len(h.changes) != 0 {
		t.Fatalf("OnWorkersChanged after the same layout: %v, want none", h.changes)
	}
	// A new layout replaces the old one whole.
	l2 := &kvdirv1.WorkerLayout{BlockSizes: []uint32{16, 64}}
	h.publish1(batch("w", 1, 3, 3, layoutEv(l2)), stApplied)
	if got := mustWorker(t, h.f, "w").GetLayout(); !proto.Equal(got, l2) {
		t.Fatalf("layout after a second one: %v, want %v", got, l2)
	}
	// Registration (a new epoch) clears it: the new epoch's agent sends it
	// again before any block.
	h.register("w")
	if got := mustWorker(t, h.f, "w").GetLayout(); got != nil {
		t.Fatalf("layout after re-registration: %v, want none", got)
	}
}

func TestLayoutRefused(t *testing.T) {
	groups := make([]*kvdirv1.KVGroup, raftfsm.MaxLayoutGroups+1)
	for i := range groups {
		groups[i] = &kvdirv1.KVGroup{Index: uint32(i)}
	}
	cases := []struct {
		name string
		l    *kvdirv1.WorkerLayout
		want string
	}{
		{"block size 0", &kvdirv1.WorkerLayout{BlockSizes: []uint32{0}}, "block size 0"},
		{"block size too big", &kvdirv1.WorkerLayout{BlockSizes: []uint32{1<<16 + 1}}, "not in [1, 65536]"},
		{"not ascending", &kvdirv1.WorkerLayout{BlockSizes: []uint32{64, 16}}, "ascending"},
		{"duplicate", &kvdirv1.WorkerLayout{BlockSizes: []uint32{16, 16}}, "ascending"},
		{"too many sizes", &kvdirv1.WorkerLayout{BlockSizes: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}}, "limit 16"},
		{"too many groups", &kvdirv1.WorkerLayout{Groups: groups}, "groups, limit"},
		{"group block size", &kvdirv1.WorkerLayout{Groups: []*kvdirv1.KVGroup{{BlockSize: 1 << 20}}}, "group 0 block size"},
		{"long kind", &kvdirv1.WorkerLayout{Groups: []*kvdirv1.KVGroup{{Kind: strings.Repeat("k", 200)}}}, "kind longer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, raftfsm.Options{})
			h.register("w")
			h.publish1(batch("w", 1, 1, 1, layoutEv(testLayout())), stApplied)
			digest := h.f.Digest()
			r := h.publish1(batch("w", 1, 2, 2, layoutEv(c.l), stored(0, gpu, 7)), kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED)
			if !strings.Contains(r.Message, c.want) {
				t.Fatalf("message %q, want it to contain %q", r.Message, c.want)
			}
			if h.f.Digest() != digest {
				t.Fatalf("a refused layout changed the state")
			}
		})
	}
}

func TestLayoutSurvivesSnapshot(t *testing.T) {
	h := smallState(t)
	f := newQuietFSM(t, raftfsm.Options{})
	if err := restore(f, snapshotBytes(t, h.f)); err != nil {
		t.Fatal(err)
	}
	if got := mustWorker(t, f, "w1").GetLayout(); !proto.Equal(got, testLayout()) {
		t.Fatalf("restored layout %v, want %v", got, testLayout())
	}
	if f.Digest() != h.f.Digest() {
		t.Fatalf("restored digest %x, want %x", f.Digest(), h.f.Digest())
	}
	// The layout is part of the digest: two states that differ only in it
	// differ.
	g := smallState(t)
	g.publish1(batch("w1", 1, 2, 2, layoutEv(&kvdirv1.WorkerLayout{BlockSizes: []uint32{16}})), stApplied)
	h.publish1(batch("w1", 1, 2, 2), stApplied)
	if g.f.Digest() == h.f.Digest() {
		t.Fatalf("digest does not cover the layout")
	}
}

func TestRegisterBlockSizeUnset(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.registerSpec(&kvdirv1.WorkerSpec{Id: "w", Model: "m"})
	if bs := mustWorker(t, h.f, "w").GetSpec().GetBlockSize(); bs != 0 {
		t.Fatalf("registered block size %d, want 0 (not told)", bs)
	}
}

// TestAccountingUsesLearnedBlockSize checks that the misconfiguration
// check's accounting compares a session's block size with the one learned
// from the worker's events: hashing in the learned 64 is no mismatch even
// though the agent registered 16; hashing in 16 is one.
func TestAccountingUsesLearnedBlockSize(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w") // block size 16
	h.publish1(batch("w", 1, 1, 1, layoutEv(testLayout()), stored(0, gpu, 1, 2)), stApplied)
	pred := uint32(64)
	r := sess("s", "w", 2)
	r.BlockSize, r.PredictedCachedTokens = 64, &pred
	h.record(5, r)
	if n := mustWorker(t, h.f, "w").GetCacheAccounting().GetBlockSizeMismatches(); n != 0 {
		t.Fatalf("a turn hashed in the learned block size counted %d mismatches, want 0", n)
	}
	r2 := sess("s2", "w", 2)
	r2.BlockSize, r2.PredictedCachedTokens = 16, &pred
	h.record(6, r2)
	if n := mustWorker(t, h.f, "w").GetCacheAccounting().GetBlockSizeMismatches(); n != 1 {
		t.Fatalf("a turn hashed in 16 beside a learned 64 counted %d mismatches, want 1", n)
	}
}
