package raftfsm_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// pair is a leader's state machine and a replica's, fed the same entries.
type pair struct {
	t          *testing.T
	lead, repl *harness
}

func newPair(t *testing.T) *pair {
	return &pair{t: t, lead: newHarness(t, raftfsm.Options{}), repl: newHarness(t, raftfsm.Options{})}
}

// apply applies one command to both and checks that they agree.
func (p *pair) apply(typ kvdirv1.CommandType, payload proto.Message) any {
	p.t.Helper()
	data := p.lead.data(typ, payload)
	res := p.lead.applyData(data)
	p.repl.applyData(data)
	if p.lead.f.Digest() != p.repl.f.Digest() {
		p.t.Fatalf("the replica's digest differs from the leader's")
	}
	return res
}

// publish proposes b as a leader does: cut past the quota with freed, and
// the cut carried in the command. It returns the response and the cut.
func (p *pair) publish(b *kvdirv1.EventBatch, freed uint64) (*kvdirv1.PublishResponse, uint64) {
	p.t.Helper()
	cut := p.lead.f.CutOverQuota(b, func(string) (uint64, bool) { return freed, true })
	res := p.apply(tPublish, &kvdirv1.PublishCommand{Batches: []*kvdirv1.EventBatch{b}, QuotaCut: []uint64{cut}})
	return res.(*raftfsm.PublishResult).Responses[0], cut
}

func seqChain(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

func quotaWorker(t *testing.T, p *pair, quota uint64) uint64 {
	t.Helper()
	c := regCmd("w", "", 0)
	c.BlockQuota = quota
	return p.apply(tRegister, c).(*raftfsm.RegisterResult).Epoch
}

func TestLeaderCutsPastQuota(t *testing.T) {
	p := newPair(t)
	e := quotaWorker(t, p, 10)
	check := func(what string, blocks, dropped uint64) {
		t.Helper()
		for _, f := range []*raftfsm.FSM{p.lead.f, p.repl.f} {
			if w := mustWorker(t, f, "w"); w.Blocks != blocks || w.DroppedBlocks != dropped {
				t.Fatalf("%s: blocks %d dropped %d, want %d, %d", what, w.Blocks, w.DroppedBlocks, blocks, dropped)
			}
		}
	}
	// Under the quota the leader cuts nothing, nor when the state machine
	// cuts the first time: it has not seen the worker over its quota yet.
	if _, cut := p.publish(batch("w", e, 1, 1, stored(0, gpu, seqChain(1, 6)...)), 0); cut != 0 {
		t.Fatalf("cut %d under the quota", cut)
	}
	if _, cut := p.publish(batch("w", e, 2, 2, stored(6, gpu, seqChain(7, 6)...)), 0); cut != 0 {
		t.Fatalf("cut %d before the worker was seen over its quota", cut)
	}
	check("the state machine cut", 10, 2)

	// Now the leader cuts, and every replica counts it.
	b := batch("w", e, 3, 3, stored(0, gpu, seqChain(100, 4)...))
	r, cut := p.publish(b, 0)
	if cut != 4 || len(b.Events[0].GetStored().Hashes) != 0 {
		t.Fatalf("cut %d, kept %d, want all 4 cut", cut, len(b.Events[0].GetStored().Hashes))
	}
	if r.Status != stApplied || !strings.Contains(r.Message, "4 blocks past the worker's quota") {
		t.Fatalf("response %v %q", r.Status, r.Message)
	}
	check("the leader cut", 10, 6)

	// Blocks that batches in flight may remove are room: the leader keeps
	// the head that may fit, and the state machine checks it again (here
	// nothing was removed, so it drops those too).
	b = batch("w", e, 4, 4, stored(0, gpu, seqChain(200, 5)...))
	if _, cut = p.publish(b, 2); cut != 3 || len(b.Events[0].GetStored().Hashes) != 2 {
		t.Fatalf("freed 2: cut %d kept %d, want 3, 2", cut, len(b.Events[0].GetStored().Hashes))
	}
	check("kept blocks still over", 10, 11)

	// A removal earlier in the batch is room too, and clearing is room
	// for everything after it.
	b = batch("w", e, 5, 6, removed(gpu, true, 9, 10), stored(0, gpu, seqChain(300, 3)...))
	if _, cut = p.publish(b, 0); cut != 1 {
		t.Fatalf("after removing 2 in the batch: cut %d, want 1", cut)
	}
	check("removed 2, stored 2 of 3", 10, 12)
	b = batch("w", e, 7, 8, cleared(), stored(0, gpu, seqChain(400, 3)...))
	if _, cut = p.publish(b, 0); cut != 0 {
		t.Fatalf("after clearing: cut %d", cut)
	}
	check("cleared", 3, 12)

	// Refusing to cut (a leader not caught up) and a batch of another
	// epoch leave the batch whole.
	fill := batch("w", e, 9, 9, stored(0, gpu, seqChain(500, 9)...))
	p.publish(fill, 0)
	check("filled again", 10, 14)
	b = batch("w", e, 10, 10, stored(0, gpu, seqChain(600, 3)...))
	if c := p.lead.f.CutOverQuota(b, func(string) (uint64, bool) { return 0, false }); c != 0 || len(b.Events[0].GetStored().Hashes) != 3 {
		t.Fatalf("cut %d without leave", c)
	}
	if c := p.lead.f.CutOverQuota(batch("w", e+1, 10, 10, stored(0, gpu, 1)), func(string) (uint64, bool) { return 0, true }); c != 0 {
		t.Fatalf("cut %d from a batch of another epoch", c)
	}

	// A refused batch does not count its cut.
	r, _ = p.publish(batch("w", e, 20, 20, stored(0, gpu, seqChain(700, 3)...)), 0)
	if r.Status != stGap {
		t.Fatalf("status %v, want a gap", r.Status)
	}
	check("gap", 10, 14)

	// A restored state machine knows the worker is over its quota.
	g := raftfsm.New(raftfsm.Options{Logger: discardLogger})
	if err := restore(g, snapshotBytes(t, p.lead.f)); err != nil {
		t.Fatal(err)
	}
	if c := g.CutOverQuota(batch("w", e, 10, 10, stored(0, gpu, 800, 801)), func(string) (uint64, bool) { return 0, true }); c != 2 {
		t.Fatalf("restored: cut %d, want 2", c)
	}
	// A new registration starts afresh.
	e = quotaWorker(t, p, 10)
	if c := p.lead.f.CutOverQuota(batch("w", e, 1, 1, stored(0, gpu, seqChain(1, 20)...)), func(string) (uint64, bool) { return 0, true }); c != 0 {
		t.Fatalf("re-registered: cut %d", c)
	}
}

// TestTrimBatchWireIsCutOverQuota checks that cutting an encoded batch
// gives what cutting the decoded batch gives.
func TestTrimBatchWireIsCutOverQuota(t *testing.T) {
	p := newPair(t)
	e := quotaWorker(t, p, 10)
	p.publish(batch("w", e, 1, 1, stored(0, gpu, seqChain(1, 12)...)), 0) // over: dropped 2
	yes := func(n uint64) func(string) (uint64, bool) {
		return func(string) (uint64, bool) { return n, true }
	}
	alloc := func(n int) []byte { return make([]byte, n) }
	layout := &kvdirv1.Event{Kind: &kvdirv1.Event_Layout{Layout: &kvdirv1.WorkerLayout{}}}
	for _, tc := range []struct {
		name  string
		b     *kvdirv1.EventBatch
		freed uint64
	}{
		{"all cut", batch("w", e, 2, 2, stored(0, gpu, seqChain(100, 256)...)), 0},
		{"several pieces", batch("w", e, 2, 4, stored(0, gpu, seqChain(100, 50)...), stored(149, cpu, seqChain(150, 7)...), layout), 0},
		{"head kept", batch("w", e, 2, 2, stored(0, gpu, seqChain(100, 9)...)), 4},
		{"removed first", batch("w", e, 2, 3, removed(gpu, false, 1, 2, 3), stored(0, gpu, seqChain(100, 9)...)), 0},
		{"cleared first", batch("w", e, 2, 3, stored(0, gpu, 100, 101), cleared(), stored(0, gpu, seqChain(200, 9)...)), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := proto.Marshal(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			out, cut, ok := p.lead.f.TrimBatchWire(src, yes(tc.freed), alloc)
			want := proto.Clone(tc.b).(*kvdirv1.EventBatch)
			wantCut := p.lead.f.CutOverQuota(want, yes(tc.freed))
			if !ok || cut != wantCut {
				t.Fatalf("trimmed %v, cut %d; CutOverQuota cut %d", ok, cut, wantCut)
			}
			got := new(kvdirv1.EventBatch)
			if err := proto.Unmarshal(out, got); err != nil {
				t.Fatalf("the trimmed batch does not decode: %v", err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("trimmed\n%v\nwant\n%v", got, want)
			}
			if len(out) >= len(src) {
				t.Fatalf("trimmed %d bytes of %d", len(out), len(src))
			}
		})
	}

	// Random batches of every kind of event.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		var evs []*kvdirv1.Event
		for range 1 + rng.IntN(6) {
			hs := seqChain(1+rng.IntN(1000), rng.IntN(40))
			switch rng.IntN(8) {
			case 0:
				evs = append(evs, removed(gpu, rng.IntN(2) == 0, hs...))
			case 1:
				evs = append(evs, cleared())
			case 2:
				evs = append(evs, layout)
			default:
				evs = append(evs, stored(uint64(rng.IntN(3)), cpu, hs...))
			}
		}
		b := batch("w", e, 2, 2, evs...)
		freed := uint64(rng.IntN(30))
		src, err := proto.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		want := proto.Clone(b).(*kvdirv1.EventBatch)
		wantCut := p.lead.f.CutOverQuota(want, yes(freed))
		out, cut, ok := p.lead.f.TrimBatchWire(src, yes(freed), alloc)
		if !ok {
			if wantCut != 0 {
				t.Fatalf("batch %d: left whole, CutOverQuota cut %d", i, wantCut)
			}
			continue
		}
		got := new(kvdirv1.EventBatch)
		if err := proto.Unmarshal(out, got); err != nil || cut != wantCut || !proto.Equal(got, want) {
			t.Fatalf("batch %d: cut %d (%v), want %d:\n%v\nwant\n%v", i, cut, err, wantCut, got, want)
		}
	}

	// Left whole: nothing to cut, a worker not over its quota, a leader
	// that may not cut, and batches CheckBatch must see whole.
	unpacked := protowire.AppendTag(nil, 2, protowire.Fixed64Type) // StoredBlocks.hashes, one by one
	unpacked = protowire.AppendFixed64(unpacked, 7)
	unpackedEvent := protowire.AppendTag(nil, 1, protowire.BytesType)
	unpackedEvent = protowire.AppendBytes(unpackedEvent, unpacked)
	unpackedBatch := protowire.AppendTag(nil, 1, protowire.BytesType)
	unpackedBatch = protowire.AppendString(unpackedBatch, "w")
	unpackedBatch = protowire.AppendTag(unpackedBatch, 2, protowire.VarintType)
	unpackedBatch = protowire.AppendVarint(unpackedBatch, e)
	unpackedBatch = protowire.AppendTag(unpackedBatch, 5, protowire.BytesType)
	unpackedBatch = protowire.AppendBytes(unpackedBatch, unpackedEvent)
	for _, tc := range []struct {
		name  string
		b     *kvdirv1.EventBatch
		src   []byte
		freed func(string) (uint64, bool)
	}{
		{name: "room enough", b: batch("w", e, 2, 2, stored(0, gpu, 1, 2)), freed: yes(5)},
		{name: "another worker", b: batch("v", 1, 2, 2, stored(0, gpu, 1, 2)), freed: yes(0)},
		{name: "another epoch", b: batch("w", e+1, 2, 2, stored(0, gpu, 1, 2)), freed: yes(0)},
		{name: "may not cut", b: batch("w", e, 2, 2, stored(0, gpu, 1, 2)), freed: func(string) (uint64, bool) { return 0, false }},
		{name: "reserved hash cut", b: batch("w", e, 2, 2, stored(0, gpu, 5, 0, 6)), freed: yes(1)},
		{name: "over the chain limit", b: batch("w", e, 2, 2, stored(0, gpu, seqChain(1, 100_000)...)), freed: yes(0)},
		{name: "unpacked hashes", src: unpackedBatch, freed: yes(0)},
		{name: "infinite room", b: batch("w", e, 2, 2, stored(0, gpu, 1, 2)), freed: yes(math.MaxUint64)},
	} {
		src := tc.src
		if src == nil {
			var err error
			if src, err = proto.Marshal(tc.b); err != nil {
				t.Fatal(err)
			}
		}
		if _, cut, ok := p.lead.f.TrimBatchWire(src, tc.freed, alloc); ok || cut != 0 {
			t.Errorf("%s: trimmed (cut %d)", tc.name, cut)
		}
	}
}
