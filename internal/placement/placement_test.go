package placement

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func mustNew(t testing.TB, name string, opts Options) Policy {
	t.Helper()
	p, err := New(name, opts)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return p
}

func mustPick(t testing.TB, p Policy, req Request, cands []Candidate) Decision {
	t.Helper()
	d, err := p.Pick(req, cands)
	if err != nil {
		t.Fatalf("%s.Pick: %v", p.Name(), err)
	}
	if d.Worker != cands[d.Index].Worker {
		t.Fatalf("%s: Worker %q but Index %d is %q", p.Name(), d.Worker, d.Index, cands[d.Index].Worker)
	}
	return d
}

func workers(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i].Worker = fmt.Sprintf("w%d", i)
	}
	return c
}

var basicReq = Request{SessionKey: "s", PromptTokens: 1000, BlockSize: 16}

func TestRegistry(t *testing.T) {
	for _, name := range Names() {
		p := mustNew(t, name, Options{Seed: 1})
		if p.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, p.Name())
		}
		if _, err := p.Pick(basicReq, nil); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("%s: Pick with no candidates: err = %v, want ErrNoCandidates", name, err)
		}
		if _, err := p.Pick(Request{PromptTokens: 10, BlockSize: -1}, workers(2)); err == nil {
			t.Errorf("%s: negative block size accepted", name)
		}
	}
	_, err := New("nope", Options{})
	if !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown name: err = %v", err)
	}
	for _, name := range Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not list %q", err, name)
		}
	}
	if _, err := New("session-hash", Options{HashBalanceFactor: 50}); err == nil {
		t.Error("hash balance factor 50 accepted")
	}
}

func TestRoundRobinCycles(t *testing.T) {
	p := mustNew(t, "round-robin", Options{})
	cands := workers(3)
	for i := range 7 {
		if d := mustPick(t, p, basicReq, cands); d.Index != i%3 {
			t.Fatalf("pick %d: index %d, want %d", i, d.Index, i%3)
		}
	}
}

func TestRandomSeeded(t *testing.T) {
	cands := workers(5)
	seq := func(seed int64) []int {
		p := mustNew(t, "random", Options{Seed: seed})
		out := make([]int, 200)
		for i := range out {
			out[i] = mustPick(t, p, basicReq, cands).Index
		}
		return out
	}
	a, b, c := seq(7), seq(7), seq(8)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("same seed, different sequences")
	}
	if fmt.Sprint(a) == fmt.Sprint(c) {
		t.Fatal("different seeds, same sequence")
	}
	seen := map[int]bool{}
	for _, i := range a {
		seen[i] = true
	}
	if len(seen) != len(cands) {
		t.Fatalf("200 picks covered %d of %d workers", len(seen), len(cands))
	}
}

func TestLeastLoad(t *testing.T) {
	p := mustNew(t, "least-load", Options{Seed: 3})
	cands := workers(4)
	cands[0].Load = Load{Running: 3}
	cands[1].Load = Load{Waiting: 1, InFlight: 1} // 2
	cands[2].Load = Load{Running: 1, InFlight: 1} // 2
	cands[3].Load = Load{Running: 2, Waiting: 1}  // 3
	count := map[int]int{}
	for range 400 {
		count[mustPick(t, p, basicReq, cands).Index]++
	}
	if count[0]+count[3] != 0 || count[1] < 150 || count[2] < 150 {
		t.Fatalf("picks %v, want only 1 and 2, about evenly", count)
	}
	cands[2].Load.InFlight = 0
	if d := mustPick(t, p, basicReq, cands); d.Index != 2 {
		t.Fatalf("picked %d, want 2 (load 1)", d.Index)
	}
}

func TestPrefix(t *testing.T) {
	p := mustNew(t, "prefix", Options{Seed: 3})
	cands := workers(4)
	cands[0].MatchedBlocks, cands[0].Load = 10, Load{Running: 1}
	cands[1].MatchedBlocks, cands[1].Load = 40, Load{Running: 9}
	cands[2].MatchedBlocks, cands[2].Load = 40, Load{Running: 2}
	cands[3].MatchedBlocks = 0
	d := mustPick(t, p, basicReq, cands)
	if d.Index != 2 {
		t.Fatalf("picked %d, want 2 (longest match, least load)", d.Index)
	}
	if d.PredictedCachedTokens != 640 {
		t.Fatalf("PredictedCachedTokens = %d, want 640", d.PredictedCachedTokens)
	}
	cands[1].MatchedBlocks = 100 // 1,600 tokens > prompt: capped at prompt-1
	d = mustPick(t, p, basicReq, cands)
	if d.Index != 1 || d.PredictedCachedTokens != 999 {
		t.Fatalf("got %d with %d cached, want 1 with 999", d.Index, d.PredictedCachedTokens)
	}
}

func TestConcurrentUse(t *testing.T) {
	cands := workers(8)
	for _, name := range Names() {
		p := mustNew(t, name, Options{Seed: 1})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 200 {
					req := basicReq
					req.SessionKey = fmt.Sprint(g, i)
					if _, err := p.Pick(req, cands); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}
