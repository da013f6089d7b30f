package placement

import (
	"fmt"
	"testing"
)

func keyReq(k string) Request { return Request{SessionKey: k, PromptTokens: 100, BlockSize: 16} }

func TestSessionHashSticky(t *testing.T) {
	p := mustNew(t, "session-hash", Options{})
	cands := workers(8)
	home := mustPick(t, p, keyReq("alice"), cands).Index
	for i := range cands {
		cands[i].Load.InFlight = 1
	}
	// Total 8 (+1 for this request): cap = ⌈9·1.5/8⌉ = 2, and home holds 1.
	for range 5 {
		if d := mustPick(t, p, keyReq("alice"), cands); d.Index != home {
			t.Fatalf("moved to %d while under the bound, home %d", d.Index, home)
		}
	}
	// Reordering candidates does not change the owner.
	rev := make([]Candidate, len(cands))
	for i := range cands {
		rev[len(cands)-1-i] = cands[i]
	}
	if d := mustPick(t, p, keyReq("alice"), rev); d.Worker != cands[home].Worker {
		t.Fatalf("reordered candidates: %s, want %s", d.Worker, cands[home].Worker)
	}
}

func TestSessionHashBound(t *testing.T) {
	p := mustNew(t, "session-hash", Options{HashBalanceFactor: 150})
	cands := workers(8)
	home := mustPick(t, p, keyReq("bob"), cands).Index
	// Where the key goes when home is gone: its ring successor.
	var rest []Candidate
	for i := range cands {
		if i != home {
			rest = append(rest, cands[i])
		}
	}
	succ := mustPick(t, p, keyReq("bob"), rest).Worker

	for i := range cands {
		cands[i].Load.InFlight = 2
	}
	// home at 3, others 2: total 17, cap = ⌈18·150/800⌉ = 4 → stays.
	cands[home].Load.InFlight = 3
	if d := mustPick(t, p, keyReq("bob"), cands); d.Index != home {
		t.Fatalf("home at 3 < cap 4: moved to %d", d.Index)
	}
	// home at 4: total 18, cap = ⌈19·150/800⌉ = 4 → full, spills to successor.
	cands[home].Load.InFlight = 4
	if d := mustPick(t, p, keyReq("bob"), cands); d.Worker != succ {
		t.Fatalf("home at cap: got %s, want ring successor %s", d.Worker, succ)
	}
	// Successor also full: goes further, never to a full worker.
	for i := range cands {
		if cands[i].Worker == succ {
			cands[i].Load.InFlight = 4
		}
	}
	d := mustPick(t, p, keyReq("bob"), cands)
	if d.Index == home || d.Worker == succ {
		t.Fatalf("went to a full worker %s", d.Worker)
	}

	// Disabled bound: always home.
	q := mustNew(t, "session-hash", Options{HashBalanceFactor: -1})
	cands[home].Load.InFlight = 1000
	if d := mustPick(t, q, keyReq("bob"), cands); d.Index != home {
		t.Fatalf("unbounded: moved to %d", d.Index)
	}
}

func spread(t *testing.T, p Policy, cands []Candidate, keys int) map[string]string {
	t.Helper()
	out := make(map[string]string, keys)
	for i := range keys {
		k := fmt.Sprintf("session-%d", i)
		out[k] = mustPick(t, p, keyReq(k), cands).Worker
	}
	return out
}

func TestSessionHashSpreadAndMovement(t *testing.T) {
	const keys = 10000
	p := mustNew(t, "session-hash", Options{})
	eight := workers(8)
	before := spread(t, p, eight, keys)
	count := map[string]int{}
	for _, w := range before {
		count[w]++
	}
	lo, hi := keys, 0
	chi2 := 0.0
	exp := float64(keys) / 8
	for _, c := range eight {
		n := count[c.Worker]
		lo, hi = min(lo, n), max(hi, n)
		chi2 += (float64(n) - exp) * (float64(n) - exp) / exp
	}
	t.Logf("8 workers, %d keys: min %d max %d ratio %.3f chi2 %.1f", keys, lo, hi, float64(hi)/float64(lo), chi2)
	if float64(hi)/float64(lo) > 1.2 {
		t.Errorf("max/min = %d/%d, want ≤ 1.2", hi, lo)
	}
	if chi2 > 24.32 { // χ² with 7 degrees of freedom, p = 0.001
		t.Errorf("χ² = %.1f, want ≤ 24.32", chi2)
	}

	nine := workers(9)
	after := spread(t, p, nine, keys)
	moved := 0
	for k, w := range after {
		if w != before[k] {
			moved++
			if w != "w8" {
				t.Fatalf("key %s moved from %s to %s, not to the new worker", k, before[k], w)
			}
		}
	}
	frac := float64(moved) / keys
	t.Logf("adding a 9th worker moved %.3f of keys (1/9 = %.3f)", frac, 1.0/9)
	if frac < 0.08 || frac > 0.15 {
		t.Errorf("moved fraction %.3f, want about 1/9", frac)
	}
}

func TestSessionHashFallbackKeys(t *testing.T) {
	p := mustNew(t, "session-hash", Options{})
	cands := workers(8)
	chain := Request{PromptTokens: 100, BlockSize: 16, ChainPrefix: []uint64{11, 22, 33}}
	first := mustPick(t, p, chain, cands).Index
	for range 5 {
		if d := mustPick(t, p, chain, cands); d.Index != first {
			t.Fatal("chain-prefix key is not sticky")
		}
	}
	seen := map[int]bool{}
	for i := range 64 {
		c := chain
		c.ChainPrefix = []uint64{uint64(i), 5}
		seen[mustPick(t, p, c, cands).Index] = true
	}
	if len(seen) < 6 {
		t.Errorf("64 chain prefixes reached only %d of 8 workers", len(seen))
	}
	none := Request{PromptTokens: 100, BlockSize: 16}
	for i := range 16 { // no key: round-robin
		if d := mustPick(t, p, none, cands); d.Index != i%8 {
			t.Fatalf("keyless pick %d went to %d", i, d.Index)
		}
	}
}
