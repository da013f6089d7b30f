package raftfsm_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
)

// streamOptions are small enough for the stream to hit the limits.
func streamOptions() raftfsm.Options {
	return raftfsm.Options{
		Index:          radix.Options{MaxWorkers: 5},
		MaxGoneWorkers: 2,
		MaxSessions:    20,
	}
}

// TestDeterminism applies one random stream to an FSM entry by entry and to
// another in random-sized ApplyBatch groups: every result matches the
// model's prediction, the two agree on every result, and their states are
// equal at every group boundary.
func TestDeterminism(t *testing.T) {
	for seed := range uint64(3) {
		g := newStreamGen(t, seed, 5, 2)
		cmds := g.stream(1500)
		a := newQuietFSM(t, streamOptions())
		b := newQuietFSM(t, streamOptions())
		r := rand.New(rand.NewPCG(seed, 1))
		for i := 0; i < len(cmds); {
			n := min(len(cmds)-i, 1+r.IntN(25))
			group := cmds[i : i+n]
			for _, c := range group {
				checkResult(t, c, a.Apply(cmdLog(c.idx, c.data)))
			}
			out := b.ApplyBatch(logsOf(group))
			for j, c := range group {
				checkResult(t, c, out[j])
			}
			if a.Digest() != b.Digest() || a.IndexDigest() != b.IndexDigest() {
				t.Fatalf("seed %d: digests differ after index %d", seed, group[n-1].idx)
			}
			i += n
		}
		g.checkModel(t, a)
		equalFSMs(t, a, b, g.chains, g.ids)
		if a.AppliedIndex() != cmds[len(cmds)-1].idx {
			t.Fatalf("AppliedIndex %d, want %d", a.AppliedIndex(), cmds[len(cmds)-1].idx)
		}
		if c := a.Counters(); c.Blocks == 0 || c.Sessions == 0 {
			t.Fatalf("seed %d: the stream left an empty state (%+v): the test exercises too little", seed, c)
		}
	}
}

// TestDeterminismSameResults checks that the two ways of applying give equal
// results entry by entry, including refusal messages.
func TestDeterminismSameResults(t *testing.T) {
	g := newStreamGen(t, 42, 5, 2)
	cmds := g.stream(800)
	a := newQuietFSM(t, streamOptions())
	b := newQuietFSM(t, streamOptions())
	ra := make([]any, len(cmds))
	for i, c := range cmds {
		ra[i] = a.Apply(cmdLog(c.idx, c.data))
	}
	rb := b.ApplyBatch(logsOf(cmds))
	for i := range cmds {
		if !sameResult(ra[i], rb[i]) {
			t.Fatalf("entry %d: Apply gave %v, ApplyBatch %v", cmds[i].idx, ra[i], rb[i])
		}
	}
	equalFSMs(t, a, b, g.chains, g.ids)
}
