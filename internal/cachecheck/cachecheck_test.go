package cachecheck_test

import (
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/cachecheck"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// acc counts turns into a fresh accounting, decaying as the directory does.
func acc(turns ...cachecheck.Turn) *kvdirv1.CacheAccounting {
	a := &kvdirv1.CacheAccounting{}
	for _, t := range turns {
		cachecheck.Add(a, t)
		cachecheck.Decay(a)
	}
	return a
}

func repeat(n int, t cachecheck.Turn) []cachecheck.Turn {
	out := make([]cachecheck.Turn, n)
	for i := range out {
		out[i] = t
	}
	return out
}

var (
	cold        = cachecheck.Turn{Predicted: 0, Reported: 0, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true}
	healthy     = cachecheck.Turn{Predicted: 96, Reported: 96, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true}
	unpredicted = cachecheck.Turn{Predicted: 0, Reported: 96, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true}
	overPred    = cachecheck.Turn{Predicted: 96, Reported: 0, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true}
)

func TestHealthyWorkerIsNeverFlagged(t *testing.T) {
	// Two-turn sessions: a cold first turn, a fully predicted second one,
	// with an occasional eviction and an occasional race with the events.
	var turns []cachecheck.Turn
	for i := range 200 {
		turns = append(turns, cold, healthy)
		if i%7 == 0 {
			turns = append(turns, overPred)
		}
		if i%9 == 0 {
			turns = append(turns, unpredicted)
		}
	}
	a := &kvdirv1.CacheAccounting{}
	for i, tr := range turns {
		cachecheck.Add(a, tr)
		cachecheck.Decay(a)
		if k := cachecheck.Evaluate(a); k != cachecheck.KindNone {
			t.Fatalf("turn %d: healthy worker flagged %q: %s", i, k, cachecheck.Summary(a))
		}
	}
	if a.Turns >= 2*cachecheck.Window {
		t.Fatalf("accounting not decayed: %d turns", a.Turns)
	}
}

func TestColdCacheIsNotAMismatch(t *testing.T) {
	if k := cachecheck.Evaluate(acc(repeat(100, cold)...)); k != cachecheck.KindNone {
		t.Fatalf("a cold cache flagged %q", k)
	}
	// Nor a directory that holds nothing of the worker yet while the
	// engine already serves its own prefix cache (the agent just started).
	noBlocks := unpredicted
	noBlocks.DirHoldsBlocks = false
	if k := cachecheck.Evaluate(acc(repeat(100, noBlocks)...)); k != cachecheck.KindNone {
		t.Fatalf("hits before the directory holds any block flagged %q", k)
	}
	if k := cachecheck.Evaluate(nil); k != cachecheck.KindNone {
		t.Fatalf("no accounting flagged %q", k)
	}
}

func TestUnmatchedEventsNeedMinTurns(t *testing.T) {
	a := acc(repeat(cachecheck.MinTurns-1, unpredicted)...)
	if k := cachecheck.Evaluate(a); k != cachecheck.KindNone {
		t.Fatalf("%d unpredicted hits flagged %q before MinTurns", a.HitTurns, k)
	}
	cachecheck.Add(a, unpredicted)
	if k := cachecheck.Evaluate(a); k != cachecheck.KindUnmatched {
		t.Fatalf("%d unpredicted hits: %q, want %q", a.HitTurns, k, cachecheck.KindUnmatched)
	}
	// Mixed with cold turns (every session's first), still flagged: cold
	// turns are not hits.
	var mixed []cachecheck.Turn
	for range 10 {
		mixed = append(mixed, cold, unpredicted)
	}
	if k := cachecheck.Evaluate(acc(mixed...)); k != cachecheck.KindUnmatched {
		t.Fatalf("half cold, half unpredicted: %q, want %q", k, cachecheck.KindUnmatched)
	}
}

func TestUnmatchedEventsClearWhenFixed(t *testing.T) {
	a := acc(repeat(2*cachecheck.Window, unpredicted)...)
	if cachecheck.Evaluate(a) != cachecheck.KindUnmatched {
		t.Fatalf("not flagged: %s", cachecheck.Summary(a))
	}
	for i := range 4 * cachecheck.Window {
		cachecheck.Add(a, healthy)
		cachecheck.Decay(a)
		if cachecheck.Evaluate(a) == cachecheck.KindNone {
			if i < cachecheck.MinTurns {
				t.Fatalf("cleared after only %d healthy turns", i+1)
			}
			return
		}
	}
	t.Fatalf("still flagged after %d healthy turns: %s", 4*cachecheck.Window, cachecheck.Summary(a))
}

func TestOverPrediction(t *testing.T) {
	if k := cachecheck.Evaluate(acc(repeat(cachecheck.MinTurns, overPred)...)); k != cachecheck.KindOverPredicted {
		t.Fatalf("over-predicted turns: %q, want %q", k, cachecheck.KindOverPredicted)
	}
	// Served a bit less than predicted (the last partial block) is fine.
	near := cachecheck.Turn{Predicted: 96, Reported: 80, BlockSize: 16, DirHoldsBlocks: true}
	if k := cachecheck.Evaluate(acc(repeat(50, near)...)); k != cachecheck.KindNone {
		t.Fatalf("slightly short turns flagged %q", k)
	}
}

func TestLikelyCause(t *testing.T) {
	for _, c := range []struct {
		name string
		kind cachecheck.Kind
		e    cachecheck.Evidence
		want cachecheck.Cause
	}{
		{"model name", cachecheck.KindUnmatched, cachecheck.Evidence{RequestModel: "llama3-8b", RegisteredModel: "llama3-8b-instruct",
			HashedBlockSize: 16, RegisteredBlockSize: 16, SaltKnown: true}, cachecheck.CauseModelName},
		{"registered block size", cachecheck.KindUnmatched, cachecheck.Evidence{RequestModel: "m", RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 32, SaltKnown: true}, cachecheck.CauseBlockSize},
		{"learned block size wins over registered", cachecheck.KindUnmatched, cachecheck.Evidence{RequestModel: "m", RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16, LearnedBlockSize: 64, SaltKnown: true}, cachecheck.CauseBlockSize},
		{"directory's block size view", cachecheck.KindUnmatched, cachecheck.Evidence{RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16, BlockSizeMismatches: 3}, cachecheck.CauseBlockSize},
		{"cache salt", cachecheck.KindUnmatched, cachecheck.Evidence{RequestModel: "m", RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16, Salted: true, SaltKnown: true}, cachecheck.CauseCacheSalt},
		{"hash seed", cachecheck.KindUnmatched, cachecheck.Evidence{RequestModel: "m", RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16, SaltKnown: true}, cachecheck.CauseHashSeed},
		{"directory alone", cachecheck.KindUnmatched, cachecheck.Evidence{RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16}, cachecheck.CauseNamespace},
		{"over-prediction", cachecheck.KindOverPredicted, cachecheck.Evidence{RequestModel: "m", RegisteredModel: "m",
			HashedBlockSize: 16, RegisteredBlockSize: 16, SaltKnown: true}, cachecheck.CauseEvents},
		{"not flagged", cachecheck.KindNone, cachecheck.Evidence{RequestModel: "a", RegisteredModel: "b"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := cachecheck.LikelyCause(c.kind, c.e)
			if got != c.want {
				t.Fatalf("LikelyCause = %q, want %q", got, c.want)
			}
			if got != "" && got.Advice() == "" {
				t.Fatalf("no advice for %q", got)
			}
		})
	}
	if !strings.Contains(string(cachecheck.CauseNamespace), string(cachecheck.CauseModelName)) {
		t.Fatalf("the directory's cause %q does not name %q", cachecheck.CauseNamespace, cachecheck.CauseModelName)
	}
}

func TestBlockSizeMismatchCounted(t *testing.T) {
	a := acc(cachecheck.Turn{Predicted: 0, Reported: 0, BlockSize: 16, RegisteredBlockSize: 32})
	if a.BlockSizeMismatches != 1 || a.LastBlockSize != 16 {
		t.Fatalf("accounting %v", a)
	}
}

// The directory names a cause from the routers' session records as a
// router does from its own window: most turns hashed under another model
// mean the model name, most salted turns the cache salt.
func TestFromAccountingNamesTheCause(t *testing.T) {
	for _, c := range []struct {
		name string
		turn cachecheck.Turn
		want cachecheck.Cause
	}{
		{"model", cachecheck.Turn{Reported: 64, BlockSize: 16, DirHoldsBlocks: true, ModelDiffers: true}, cachecheck.CauseModelName},
		{"salt", cachecheck.Turn{Reported: 64, BlockSize: 16, DirHoldsBlocks: true, Salted: true}, cachecheck.CauseCacheSalt},
		{"neither", cachecheck.Turn{Reported: 64, BlockSize: 16, DirHoldsBlocks: true}, cachecheck.CauseHashSeed},
	} {
		a := &kvdirv1.CacheAccounting{}
		for range cachecheck.MinTurns {
			cachecheck.Add(a, c.turn)
		}
		k := cachecheck.Evaluate(a)
		if got := cachecheck.LikelyCause(k, cachecheck.FromAccounting(a, "m", 16, 16)); got != c.want {
			t.Errorf("%s: cause %q, want %q", c.name, got, c.want)
		}
	}
}
