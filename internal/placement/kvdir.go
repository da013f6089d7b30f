package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/kvdir/kvdir/internal/engine"
)

// KVDir places a request on the worker with the lowest expected time to first
// token (DESIGN.md §5). For each candidate w, with P = PromptTokens:
//
//	matched(w)  = min(MatchedBlocks·BlockSize, P−1)
//	cached(w)   = round(matched(w) · Retain(KVUsage))
//	new(w)      = P − cached(w)
//	prefill(w)  = Prefill.Millis(new(w), cached(w))
//	queue(w)    = Prefill.Millis(QueuedPrefillTokens, 0), or 0 if nothing is queued
//	steps(w)    = ⌈(QueuedPrefillTokens + new(w)) / ChunkTokens⌉
//	interf(w)   = steps(w) · Decode.Extra(Running, Running·DecodeContext)
//	wait(w)     = queue(w) + interf(w)
//	ttft(w)     = wait(w) + prefill(w)
//	extra(w)    = Waiting(w) · (prefill(w) − min over candidates of prefill)
//	cost(w)     = ttft(w) + extra(w)
//
// interf is the decode batch riding along with every chunked-prefill step
// until our prefill is done: each such step costs the chunk plus the decodes'
// extra (calibration README, mixed steps). queue charges the queued tokens as
// one cold prefill, which slightly overstates the attention term when they
// belong to several requests.
//
// The worker with the lowest cost wins; candidates within TieTolerance
// (relative) of the best are ties, broken uniformly at random.
//
// ttft alone is the seed document's rule made exact: a warm worker keeps the
// request as long as its extra wait is smaller than the prefill its cache
// saves, and loses it as soon as the wait exceeds the saving; the same rule
// spills a hot shared prefix to a second worker once the first one's queue
// costs more than the prefix saves. It is exact for an idle destination.
//
// extra(w) is what the rule leaves out when the destination is busy: the
// prefill a cache miss recomputes is work added to w's queue, and every
// request waiting there is delayed by it. (For a single queue, extra work x
// delays the others by x·ρ/(1−ρ) in all, which is x times the mean number
// of requests in the queue; Waiting is that number as the engine last
// reported it.) Without it, a saturated cluster's transient queue
// differences, which later placements even out anyway, always outweigh the
// saving, the policy degenerates to least-load and recomputes prefixes until
// the cluster drowns (kvbench sim on the Mooncake trace: 14 % hit rate).
// With it, moving a request away from its prefix must save more than the
// recomputation costs everyone behind it: wait(a) − wait(b) > (1 +
// Waiting(b)) · saving.
//
// QueuedPrefillTokens (the router's accounting of work sent and not yet
// started) measures the wait in time; Waiting, the engine's queue length,
// only counts who would suffer the extra work.
type KVDir struct {
	prof    engine.Profile
	tol     float64
	chunk   int
	context int

	mu  sync.Mutex
	rng *rand.Rand
}

// NewKVDir returns a kvdir policy configured by opts (Profile, Seed,
// TieTolerance, ChunkTokens, DecodeContext).
func NewKVDir(opts Options) (*KVDir, error) {
	prof := opts.Profile
	if prof.Name == "" {
		var err error
		if prof, err = engine.ProfileByName("llama3-8b"); err != nil {
			return nil, err
		}
	}
	if err := prof.Validate(); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	p := &KVDir{prof: prof, tol: opts.TieTolerance, chunk: opts.ChunkTokens, context: opts.DecodeContext, rng: newRand(opts.Seed)}
	if p.tol <= 0 {
		p.tol = 0.01
	}
	if p.chunk <= 0 {
		p.chunk = 2048
	}
	if p.context <= 0 {
		p.context = 4096
	}
	return p, nil
}

// Name returns "kvdir".
func (p *KVDir) Name() string { return "kvdir" }

// Retain is the probability that a worker's matched blocks are still cached
// when the request runs, given its KV-cache usage u: 1 below 90 % usage,
// falling linearly to 0.5 at 100 %.
//
// vLLM evicts only free (unreferenced) blocks, least recently used first, and
// only when it needs room: below about 90 % usage the free pool absorbs the
// few hundred milliseconds until our request is scheduled, so a match
// survives. Near full, a finished session's prefix is exactly the kind of
// block that goes first; at 100 % we count it as a coin flip rather than
// lost, since the directory reported it present a moment ago.
func Retain(u float64) float64 {
	switch {
	case !(u >= 0.9): // also NaN
		return 1
	case u >= 1:
		return 0.5
	}
	return 1 - 5*(u-0.9)
}

// Score returns cand's cost breakdown for req.
func (p *KVDir) Score(req Request, cand Candidate) Score {
	var s Score
	p.score(&s, req, &cand, p.prof.Prefill.Millis(req.PromptTokens, 0))
	return s
}

// score fills s for c; cold is the request's prefill without cache.
func (p *KVDir) score(s *Score, req Request, c *Candidate, cold float64) {
	s.Worker, s.MatchedTokens, s.Retain = c.Worker, matchedTokens(req, c), Retain(c.Load.KVUsage)
	cached := int(math.Round(float64(s.MatchedTokens) * s.Retain))
	s.CachedTokens = float64(cached)
	newTok := req.PromptTokens - cached
	s.PrefillMs = p.prof.Prefill.Millis(newTok, cached)
	s.ColdPrefillMs = cold
	q := max(c.Load.QueuedPrefillTokens, 0)
	if q > 0 {
		s.QueueMs = p.prof.Prefill.Millis(q, 0)
	}
	if r := c.Load.Running; r > 0 {
		steps := (q + newTok + p.chunk - 1) / p.chunk
		s.InterferenceMs = float64(max(steps, 1)) * p.prof.Decode.Extra(r, r*p.context)
	}
	s.WaitMs = s.QueueMs + s.InterferenceMs
	s.TotalMs = s.WaitMs + s.PrefillMs
}

// addExtra charges s with the delay its extra prefill (over minPrefill)
// imposes on the requests waiting on its worker.
func addExtra(s *Score, c *Candidate, minPrefill float64) {
	if w := c.Load.Waiting; w > 0 && s.PrefillMs > minPrefill {
		s.ExtraMs = float64(w) * (s.PrefillMs - minPrefill)
		s.TotalMs += s.ExtraMs
	}
}

// Pick returns the candidate with the lowest expected time to first token,
// with every candidate's breakdown in Decision.Scores.
func (p *KVDir) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	if req.PromptTokens < 1 {
		return Decision{}, fmt.Errorf("placement: kvdir: prompt of %d tokens", req.PromptTokens)
	}
	scores := make([]Score, len(cands))
	cold := p.prof.Prefill.Millis(req.PromptTokens, 0)
	minPrefill := math.Inf(1)
	for i := range cands {
		p.score(&scores[i], req, &cands[i], cold)
		minPrefill = min(minPrefill, scores[i].PrefillMs)
	}
	best := math.Inf(1)
	for i := range cands {
		addExtra(&scores[i], &cands[i], minPrefill)
		best = min(best, scores[i].TotalMs)
	}
	limit := best * (1 + p.tol)
	ties := 0
	for i := range scores {
		if scores[i].TotalMs <= limit {
			ties++
		}
	}
	k := 0
	if ties > 1 {
		p.mu.Lock()
		k = p.rng.IntN(ties)
		p.mu.Unlock()
	}
	for i := range scores {
		if scores[i].TotalMs <= limit {
			if k == 0 {
				return Decision{Worker: cands[i].Worker, Index: i, PredictedCachedTokens: int(scores[i].CachedTokens), Scores: scores}, nil
			}
			k--
		}
	}
	panic("placement: kvdir: no candidate within the tie band") // unreachable
}
