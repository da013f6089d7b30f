package placement

import (
	"math"
	"testing"

	"github.com/kvdir/kvdir/internal/engine"
)

func llama8b(t testing.TB) engine.Profile {
	t.Helper()
	p, err := engine.ProfileByName("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRetain(t *testing.T) {
	for _, c := range []struct{ u, want float64 }{
		{0, 1}, {0.5, 1}, {0.89, 1}, {0.9, 1}, {0.95, 0.75}, {1, 0.5}, {1.2, 0.5}, {math.NaN(), 1},
	} {
		if got := Retain(c.u); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Retain(%v) = %v, want %v", c.u, got, c.want)
		}
	}
}

func TestKVDirScoreFormulas(t *testing.T) {
	prof := llama8b(t)
	p, err := NewKVDir(Options{})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptTokens: 5100, BlockSize: 16}
	c := Candidate{Worker: "a", MatchedBlocks: 306, Load: Load{KVUsage: 0.95, QueuedPrefillTokens: 3000, Running: 10}}
	s := p.Score(req, c)
	if math.Abs(s.Retain-0.75) > 1e-12 {
		t.Fatalf("Retain = %v, want 0.75", s.Retain)
	}
	cached := math.Round(4896 * 0.75)
	newTok := 5100 - int(cached)
	steps := float64((3000 + newTok + 2047) / 2048)
	want := Score{
		Worker: "a", MatchedTokens: 4896, Retain: s.Retain, CachedTokens: cached,
		QueueMs:        prof.Prefill.Millis(3000, 0),
		InterferenceMs: steps * prof.Decode.Extra(10, 10*4096),
		PrefillMs:      prof.Prefill.Millis(newTok, int(cached)),
		ColdPrefillMs:  prof.Prefill.Millis(5100, 0),
	}
	want.WaitMs = want.QueueMs + want.InterferenceMs
	want.TotalMs = want.WaitMs + want.PrefillMs
	if s != want {
		t.Fatalf("score\n got %+v\nwant %+v", s, want)
	}
}

// The seed document's turn 2: 5,100 prompt tokens, 4,896 of them (306 blocks
// of 16) cached on a warm worker, against a cold idle worker (~132 ms).
func TestKVDirAffinityCrossover(t *testing.T) {
	prof := llama8b(t)
	req := Request{SessionKey: "s", PromptTokens: 5100, BlockSize: 16}
	warmPrefill := prof.Prefill.Millis(5100-4896, 4896)
	cold := prof.Prefill.Millis(5100, 0)
	saving := cold - warmPrefill
	if cold < 125 || cold > 140 || saving < 110 {
		t.Fatalf("profile: cold %.1f ms, saving %.1f ms; want ~132 and ~117", cold, saving)
	}
	// Largest queue (tokens) the warm worker may have and still win.
	qStar := 0
	for prof.Prefill.Millis(qStar+1, 0) < saving {
		qStar++
	}
	t.Logf("cold %.2f ms, warm prefill %.2f ms, saving %.2f ms, crossover at %d queued tokens", cold, warmPrefill, saving, qStar)

	p, err := NewKVDir(Options{Seed: 1, TieTolerance: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	cands := func(q int) []Candidate {
		return []Candidate{
			{Worker: "cold", Load: Load{}},
			{Worker: "warm", MatchedBlocks: 306, Load: Load{QueuedPrefillTokens: q}},
		}
	}
	for _, q := range []int{0, qStar / 2, qStar} {
		d := mustPick(t, p, req, cands(q))
		w := d.Scores[1]
		if d.Worker != "warm" || !(w.WaitMs < saving) {
			t.Fatalf("queue %d: picked %s with wait %.3f ms vs saving %.3f ms; want warm", q, d.Worker, w.WaitMs, saving)
		}
		if d.PredictedCachedTokens != 4896 {
			t.Fatalf("PredictedCachedTokens = %d, want 4896", d.PredictedCachedTokens)
		}
	}
	for _, q := range []int{qStar + 1, 2 * qStar} {
		d := mustPick(t, p, req, cands(q))
		w := d.Scores[1]
		if d.Worker != "cold" || !(w.WaitMs > saving) {
			t.Fatalf("queue %d: picked %s with wait %.3f ms vs saving %.3f ms; want cold", q, d.Worker, w.WaitMs, saving)
		}
		if d.PredictedCachedTokens != 0 || math.Abs(d.Scores[0].TotalMs-cold) > 1e-9 {
			t.Fatalf("cold decision %+v", d)
		}
	}

	// Running decodes on the warm worker add to its wait and move the
	// crossover down.
	busy := cands(qStar)
	busy[1].Load.Running = 64
	if d := mustPick(t, p, req, busy); d.Worker != "cold" {
		t.Fatalf("warm worker with 64 running decodes at the crossover queue: picked %s", d.Worker)
	}
	// Near-full KV cache discounts the match: at usage 1.0 only half is expected.
	full := cands(0)
	full[1].Load.KVUsage = 1
	d := mustPick(t, p, req, full)
	if d.Worker != "warm" || d.PredictedCachedTokens != 2448 {
		t.Fatalf("full cache: %s with %d cached, want warm with 2448", d.Worker, d.PredictedCachedTokens)
	}
}

// TestKVDirBusyDestination checks the recomputation charge: a cache miss on
// a worker with n requests waiting must save more than (1+n) times the
// prefill it recomputes, so the warm worker keeps the request past the idle
// crossover, and loses it past the raised one.
func TestKVDirBusyDestination(t *testing.T) {
	prof := llama8b(t)
	req := Request{SessionKey: "s", PromptTokens: 5100, BlockSize: 16}
	saving := prof.Prefill.Millis(5100, 0) - prof.Prefill.Millis(5100-4896, 4896)
	p, err := NewKVDir(Options{Seed: 1, TieTolerance: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	const waiting = 3
	// Smallest warm queue (tokens) whose wait exceeds (1+waiting)·saving, when
	// the cold worker has an empty token queue but 3 requests waiting.
	qStar := 0
	for prof.Prefill.Millis(qStar+1, 0) < (1+waiting)*saving {
		qStar++
	}
	cands := func(q int) []Candidate {
		return []Candidate{
			{Worker: "cold", Load: Load{Waiting: waiting}},
			{Worker: "warm", MatchedBlocks: 306, Load: Load{QueuedPrefillTokens: q}},
		}
	}
	for _, q := range []int{qStar / 3, qStar} {
		d := mustPick(t, p, req, cands(q))
		if d.Worker != "warm" {
			t.Fatalf("queue %d (wait %.1f ms, charge %.1f ms): picked %s, want warm", q, d.Scores[1].WaitMs, d.Scores[0].ExtraMs, d.Worker)
		}
		if math.Abs(d.Scores[0].ExtraMs-waiting*saving) > 1e-6 {
			t.Fatalf("charge %.3f ms, want %d x %.3f", d.Scores[0].ExtraMs, waiting, saving)
		}
	}
	if d := mustPick(t, p, req, cands(qStar+200)); d.Worker != "cold" {
		t.Fatalf("queue %d: picked %s, want cold", qStar+200, d.Worker)
	}
	// The warm worker itself pays no charge: it recomputes least.
	if d := mustPick(t, p, req, cands(0)); d.Scores[1].ExtraMs != 0 {
		t.Fatalf("warm worker charged %.3f ms", d.Scores[1].ExtraMs)
	}
}

func TestKVDirTiesRandom(t *testing.T) {
	req := Request{PromptTokens: 2000, BlockSize: 16}
	cands := workers(4)
	cands[3].Load.QueuedPrefillTokens = 5000
	run := func(seed int64) []int {
		p, _ := NewKVDir(Options{Seed: seed})
		var out []int
		for range 200 {
			out = append(out, mustPick(t, p, req, cands).Index)
		}
		return out
	}
	a, b := run(5), run(5)
	count := map[int]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed, different tie breaks")
		}
		count[a[i]]++
	}
	if count[3] != 0 || count[0] < 40 || count[1] < 40 || count[2] < 40 {
		t.Fatalf("picks %v: want workers 0..2 about evenly, never 3", count)
	}
}

// A hot shared prefix (a 4,000-token system prompt) held by one worker: as
// requests pile up in its queue, kvdir spills to a cold worker exactly when
// the queue costs more than the prefix saves; once the second worker holds
// the prefix too, the two share the stream.
func TestKVDirHotPrefixSpills(t *testing.T) {
	p, err := NewKVDir(Options{Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptTokens: 4200, BlockSize: 16}
	cands := workers(3)
	cands[0].MatchedBlocks = 250 // 4,000 tokens
	spill := -1
	per := map[string]int{}
	for i := range 80 {
		d := mustPick(t, p, req, cands)
		per[d.Worker]++
		if spill < 0 && d.Index != 0 {
			spill = i
			w, c := d.Scores[0], d.Scores[d.Index]
			if !(w.WaitMs > (c.PrefillMs-w.PrefillMs)*0.99) {
				t.Fatalf("spilled at %d with warm wait %.1f ms < saving %.1f ms", i, w.WaitMs, c.PrefillMs-w.PrefillMs)
			}
			cands[d.Index].MatchedBlocks = 250 // the directory now sees it there
		}
		if spill < 0 && i > 0 {
			prev := d.Scores[0]
			if prev.WaitMs > prev.ColdPrefillMs {
				t.Fatalf("request %d: stayed on the hot worker with wait %.1f ms > cold prefill", i, prev.WaitMs)
			}
		}
		cands[d.Index].Load.QueuedPrefillTokens += req.PromptTokens - d.PredictedCachedTokens
	}
	t.Logf("spilled after %d requests; placements %v", spill, per)
	if spill < 5 {
		t.Fatalf("spilled after %d requests, want the hot worker to take several first", spill)
	}
	if per["w0"] < 20 || per[cands[1].Worker]+per[cands[2].Worker] < 20 {
		t.Fatalf("placements %v: want the stream shared by two warm workers", per)
	}
}

func TestKVDirProfileOption(t *testing.T) {
	big, err := engine.ProfileByName("llama3-70b")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewKVDir(Options{Profile: big})
	if err != nil {
		t.Fatal(err)
	}
	s := p.Score(Request{PromptTokens: 5100, BlockSize: 16}, Candidate{Worker: "x"})
	if s.ColdPrefillMs < 1000 {
		t.Fatalf("70b cold prefill %.0f ms, want > 1 s", s.ColdPrefillMs)
	}
	if _, err := NewKVDir(Options{Profile: engine.Profile{Name: "bad"}}); err == nil {
		t.Fatal("invalid profile accepted")
	}
	if _, err := p.Pick(Request{PromptTokens: 0, BlockSize: 16}, workers(2)); err == nil {
		t.Fatal("empty prompt accepted")
	}
}
