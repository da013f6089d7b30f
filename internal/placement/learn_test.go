package placement

import (
	"math"
	"testing"
	"time"
)

func TestBusyMeter(t *testing.T) {
	m := NewBusyMeter(10 * time.Second)
	if v := m.Value(0); v != 0 {
		t.Fatalf("new meter: %v, want 0", v)
	}
	m.Add(0, 1)
	// Busy for one time constant: 1 - e^-1.
	if v, want := m.Value(10*time.Second), 1-math.Exp(-1); math.Abs(v-want) > 1e-9 {
		t.Fatalf("busy 10 s: %v, want %v", v, want)
	}
	m.Add(10*time.Second, -1)
	// Idle for another: decays by e^-1.
	if v, want := m.Value(20*time.Second), (1-math.Exp(-1))*math.Exp(-1); math.Abs(v-want) > 1e-9 {
		t.Fatalf("idle after: %v, want %v", v, want)
	}
	// Two pending, one starts: still busy.
	m.Add(20*time.Second, 2)
	m.Add(20*time.Second, -1)
	if v0, v1 := m.Value(20*time.Second), m.Value(30*time.Second); v1 <= v0 {
		t.Fatalf("one request still pending: busy fell from %v to %v", v0, v1)
	}
	// More starts than placements never go negative.
	m.Add(30*time.Second, -5)
	m.Add(40*time.Second, 1)
	if v := m.Value(40 * time.Second); v < 0 || v > 1 {
		t.Fatalf("value %v out of [0, 1]", v)
	}
}

func TestSurvivalLearnsFromOutcomes(t *testing.T) {
	var s survival
	if got, want := s.retain(0.95), Retain(0.95); got != want {
		t.Fatalf("no evidence: %v, want the prior %v", got, want)
	}
	// Engines at 95 % usage served every matched token: the estimate
	// moves from the prior (0.75) towards 1.
	for range 100 {
		s.observe(CacheOutcome{MatchedTokens: 8000, KVUsage: 0.95, CachedTokens: 8000})
	}
	if got := s.retain(0.95); got < 0.99 {
		t.Fatalf("after full hits at 95 %%: retain %v, want about 1", got)
	}
	// Another band is untouched.
	if got, want := s.retain(0.5), Retain(0.5); got != want {
		t.Fatalf("band 50 %%: %v, want the prior %v", got, want)
	}
	// Engines lose half: the estimate follows.
	for range 2000 {
		s.observe(CacheOutcome{MatchedTokens: 8000, KVUsage: 0.96, CachedTokens: 4000})
	}
	if got := s.retain(0.95); math.Abs(got-0.5) > 0.05 {
		t.Fatalf("after half hits: retain %v, want about 0.5", got)
	}
	// Cached beyond matched (a hit the directory did not know) counts as matched.
	var u survival
	u.observe(CacheOutcome{MatchedTokens: 100, KVUsage: 0.2, CachedTokens: 5000})
	if got := u.retain(0.2); got > 1 {
		t.Fatalf("retain %v > 1", got)
	}
}

func TestFutureCountsLaterRequests(t *testing.T) {
	var f future
	// Sessions of 4 requests each, interleaved.
	var later float64
	var fresh int
	for range 4 {
		for s := range 50 {
			l, _, isNew := f.observe("s" + string(rune('A'+s%26)) + string(rune('a'+s/26)))
			later = l
			if isNew {
				fresh++
			}
		}
	}
	if fresh != 50 {
		t.Fatalf("%d fresh sessions, want 50", fresh)
	}
	if math.Abs(later-3) > 0.2 {
		t.Fatalf("later requests per request %v, want about 3", later)
	}
}

// TestFreshSessionAvoidsBusyWorker: a new session's first request, whose
// only match is a short prefix on a busy worker, goes to an idle worker
// once sessions are known to return; a known session's request stays with
// its prefix.
func TestFreshSessionAvoidsBusyWorker(t *testing.T) {
	p, err := NewKVDir(Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Teach it that sessions have 8 requests and the mean prefill.
	for range 8 {
		for s := range 20 {
			p.fut.observe("warm" + string(rune('a'+s)))
		}
	}
	p.fut.served(500)
	cands := []Candidate{
		{Worker: "busy", MatchedBlocks: 8, Load: Load{Busy: 0.8}},
		{Worker: "idle", MatchedBlocks: 0, Load: Load{Busy: 0}},
	}
	req := Request{SessionKey: "new-session", PromptTokens: 4096, BlockSize: 16}
	d, err := p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "idle" {
		t.Fatalf("fresh session went to %s (scores %+v)", d.Worker, d.Scores)
	}
	if d.Scores[0].FutureMs <= 0 {
		t.Fatalf("busy worker's FutureMs %v, want > 0", d.Scores[0].FutureMs)
	}
	// The same session again, now holding most of its prompt on "busy":
	// no future charge, it stays with its prefix.
	cands[0].MatchedBlocks = 250
	d, err = p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "busy" || d.Scores[0].FutureMs != 0 {
		t.Fatalf("known session: went to %s, FutureMs %v", d.Worker, d.Scores[0].FutureMs)
	}
}

// TestKVWait: a worker whose running requests hold its KV cache makes a
// request wait for them to finish; one with room does not; without a
// known capacity or output length the term is off.
func TestKVWait(t *testing.T) {
	p, err := NewKVDir(Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptTokens: 8192, BlockSize: 16}
	full := Candidate{Worker: "full", Load: Load{Running: 8, KVUsage: 0.95, CapacityTokens: 16 * 4096}}
	roomy := Candidate{Worker: "roomy", Load: Load{Running: 8, KVUsage: 0.2, CapacityTokens: 16 * 4096}}
	if s := p.Score(req, full); s.KVWaitMs != 0 {
		t.Fatalf("no output length known yet: KVWaitMs %v, want 0", s.KVWaitMs)
	}
	for range 10 {
		p.ObserveCache(CacheOutcome{OutputTokens: 400})
	}
	sf, sr := p.Score(req, full), p.Score(req, roomy)
	if sr.KVWaitMs != 0 {
		t.Fatalf("room for the request: KVWaitMs %v, want 0", sr.KVWaitMs)
	}
	// 512 blocks needed, 204.8 free: 307.2 of the 3891.2 held must be
	// freed, about 8 % of 200 decode steps.
	step := p.prof.Decode.Millis(8, 8*p.context)
	want := (512 - 204.8) / 3891.2 * 200 * step
	if math.Abs(sf.KVWaitMs-want) > 1e-6*want {
		t.Fatalf("KVWaitMs %v, want %v", sf.KVWaitMs, want)
	}
	if sf.WaitMs < sf.KVWaitMs {
		t.Fatalf("WaitMs %v below KVWaitMs %v", sf.WaitMs, sf.KVWaitMs)
	}
	d, err := p.Pick(req, []Candidate{full, roomy})
	if err != nil || d.Worker != "roomy" {
		t.Fatalf("picked %s (%v), want roomy", d.Worker, err)
	}
}
