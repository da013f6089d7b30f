package placement

import (
	"math"
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

func llama8b(t testing.TB) costmodel.Profile {
	t.Helper()
	p, err := costmodel.ProfileByName("llama3-8b")
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
		QueueMs:        3000 * (prof.Prefill.Millis(5100, 0) / 5100),
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
// of 16) cached on a warm worker, against a cold idle worker (~132 ms). The
// warm worker keeps the request exactly until its wait exceeds the saving
// plus the recomputation's cost to the queue: wait > (1 + n̄)·saving, where n̄
// is the mean queued requests (here half the warm worker's queue in requests
// of our size).
func TestKVDirAffinityCrossover(t *testing.T) {
	prof := llama8b(t)
	const P = 5100
	req := Request{SessionKey: "s", PromptTokens: P, BlockSize: 16}
	warmPrefill := prof.Prefill.Millis(P-4896, 4896)
	cold := prof.Prefill.Millis(P, 0)
	saving := cold - warmPrefill
	if cold < 125 || cold > 140 || saving < 110 {
		t.Fatalf("profile: cold %.1f ms, saving %.1f ms; want ~132 and ~117", cold, saving)
	}
	rate := cold / P
	// Largest queue (tokens) the warm worker may have and still win.
	moves := func(q int) bool { return float64(q)*rate > (1+float64(q)/P/2)*saving }
	qStar := 0
	for !moves(qStar + 1) {
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
		if d.Worker != "warm" {
			t.Fatalf("queue %d: picked %s (warm wait %.3f ms, saving %.3f ms, charge %.3f ms); want warm", q, d.Worker, d.Scores[1].WaitMs, saving, d.Scores[0].ExtraMs)
		}
		if d.PredictedCachedTokens != 4896 {
			t.Fatalf("PredictedCachedTokens = %d, want 4896", d.PredictedCachedTokens)
		}
	}
	for _, q := range []int{qStar + 1, 2 * qStar} {
		d := mustPick(t, p, req, cands(q))
		if d.Worker != "cold" {
			t.Fatalf("queue %d: picked %s; want cold", q, d.Worker)
		}
		if want := float64(q) / P / 2 * saving; d.PredictedCachedTokens != 0 || math.Abs(d.Scores[0].ExtraMs-want) > 1e-6 || math.Abs(d.Scores[0].TotalMs-cold-want) > 1e-6 {
			t.Fatalf("cold decision %+v; want charge %.3f", d, want)
		}
	}
	// On an idle cluster the rule is the seed document's: any wait on the warm
	// worker larger than the saving moves the request. Running decodes on the
	// warm worker add to its wait.
	busy := cands(0)
	busy[1].Load.Running = 256
	if d := mustPick(t, p, req, busy); (d.Scores[1].WaitMs > saving) != (d.Worker == "cold") {
		t.Fatalf("256 running decodes on the warm worker: wait %.1f ms, saving %.1f ms, picked %s", d.Scores[1].WaitMs, saving, d.Worker)
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
	const P = 5100
	req := Request{SessionKey: "s", PromptTokens: P, BlockSize: 16}
	saving := prof.Prefill.Millis(P, 0) - prof.Prefill.Millis(P-4896, 4896)
	rate := prof.Prefill.Millis(P, 0) / P
	p, err := NewKVDir(Options{Seed: 1, TieTolerance: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	const waiting = 3
	charge := func(q int) float64 { return max(waiting, (waiting+float64(q)/P)/2) * saving }
	qStar := 0 // largest warm queue (tokens) that keeps the request
	for float64(qStar+1)*rate <= saving+charge(qStar+1) {
		qStar++
	}
	cands := func(q int) []Candidate {
		return []Candidate{
			{Worker: "cold", Load: Load{Waiting: waiting}},
			{Worker: "warm", MatchedBlocks: 306, Load: Load{QueuedPrefillTokens: q}},
		}
	}
	if idle := int(saving / rate); qStar < 3*idle {
		t.Fatalf("crossover at %d queued tokens, want well past the idle one (%d)", qStar, idle)
	}
	for _, q := range []int{qStar / 3, qStar} {
		d := mustPick(t, p, req, cands(q))
		if d.Worker != "warm" {
			t.Fatalf("queue %d (wait %.1f ms, charge %.1f ms): picked %s, want warm", q, d.Scores[1].WaitMs, d.Scores[0].ExtraMs, d.Worker)
		}
		if math.Abs(d.Scores[0].ExtraMs-charge(q)) > 1e-6 {
			t.Fatalf("charge %.3f ms, want %.3f", d.Scores[0].ExtraMs, charge(q))
		}
	}
	if d := mustPick(t, p, req, cands(qStar+1)); d.Worker != "cold" {
		t.Fatalf("queue %d: picked %s, want cold", qStar+1, d.Worker)
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
		if spill < 0 && d.Index == 0 {
			// Staying is right while the warm worker's wait is below the saving
			// plus the charge a miss would pay elsewhere.
			w, c := d.Scores[0], d.Scores[1]
			if w.WaitMs > c.ColdPrefillMs-w.PrefillMs+c.ExtraMs+c.WaitMs+1e-9 {
				t.Fatalf("request %d: stayed on the hot worker with wait %.1f ms > saving + charge", i, w.WaitMs)
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
	big, err := costmodel.ProfileByName("llama3-70b")
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
	if _, err := NewKVDir(Options{Profile: costmodel.Profile{Name: "bad"}}); err == nil {
		t.Fatal("invalid profile accepted")
	}
	if _, err := p.Pick(Request{PromptTokens: 0, BlockSize: 16}, workers(2)); err == nil {
		t.Fatal("empty prompt accepted")
	}
}

// TestKVDirPickIntoReusesBuffer checks that PickInto over a buffer left
// dirty by a larger earlier call (every cost field set, more candidates)
// decides and scores exactly as Pick does with fresh slices, call after
// call: two policies with the same seed, one through each.
func TestKVDirPickIntoReusesBuffer(t *testing.T) {
	fresh, err := NewKVDir(Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	reused, err := NewKVDir(Options{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	busy := Candidate{Worker: "busy", MatchedBlocks: 300, HostBlocks: 100, DiskBlocks: 50,
		Load: Load{Running: 12, Waiting: 3, KVUsage: 0.97, QueuedPrefillTokens: 9000, Busy: 0.8, CapacityTokens: 200000}}
	idle := Candidate{Worker: "idle"}
	calls := []struct {
		req   Request
		cands []Candidate
	}{
		{Request{SessionKey: "s1", PromptTokens: 5100, BlockSize: 16}, []Candidate{busy, idle, busy, idle, busy}},
		{Request{SessionKey: "s2", PromptTokens: 5100, BlockSize: 16}, []Candidate{idle, {Worker: "warm", MatchedBlocks: 318}}},
		{Request{SessionKey: "s1", PromptTokens: 900, BlockSize: 16}, []Candidate{busy}},
		{Request{PromptTokens: 5100, BlockSize: 16}, []Candidate{idle, idle, idle}},
	}
	buf := make([]Score, 8)
	for i := range buf {
		buf[i] = Score{Worker: "stale", MatchedTokens: 1, Retain: 1, CachedTokens: 1, LoadedTokens: 1, TransferMs: 1, QueueMs: 1,
			KVWaitMs: 1, InterferenceMs: 1, WaitMs: 1, PrefillMs: 1, ColdPrefillMs: 1, ExtraMs: 1, FutureMs: 1, TotalMs: 1}
	}
	for i, c := range calls {
		want, err := fresh.Pick(c.req, c.cands)
		if err != nil {
			t.Fatal(err)
		}
		got, err := reused.PickInto(c.req, c.cands, buf)
		if err != nil {
			t.Fatal(err)
		}
		if got.Worker != want.Worker || got.Index != want.Index || got.PredictedCachedTokens != want.PredictedCachedTokens ||
			len(got.Scores) != len(c.cands) || &got.Scores[0] != &buf[0] {
			t.Fatalf("call %d: PickInto %+v, Pick %+v (scores in the buffer: %v)", i, got, want, len(got.Scores) > 0 && &got.Scores[0] == &buf[0])
		}
		for j := range want.Scores {
			if got.Scores[j] != want.Scores[j] {
				t.Fatalf("call %d, candidate %d: PickInto scored\n%+v\nPick\n%+v", i, j, got.Scores[j], want.Scores[j])
			}
		}
	}
	// A buffer too small is not written to: the scores are a new slice.
	small := make([]Score, 1)
	d, err := reused.PickInto(calls[0].req, calls[0].cands, small)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Scores) != len(calls[0].cands) || small[0] != (Score{}) {
		t.Fatalf("small buffer: %d scores, buffer %+v", len(d.Scores), small[0])
	}
}
