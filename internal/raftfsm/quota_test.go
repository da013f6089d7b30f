package raftfsm_test

import (
	"strings"
	"testing"

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
