package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// KVDir places a request on the worker with the lowest expected time to first
// token (docs/architecture.md, section 4). For each candidate w, with P = PromptTokens:
//
//	matched(w)  = min(MatchedBlocks·BlockSize, P−1)
//	cached(w)   = round(matched(w) · survive(KVUsage))
//	new(w)      = P − cached(w)
//	prefill(w)  = Prefill.Millis(new(w), cached(w))
//	rate        = Prefill.Millis(R, 0) / R, with R = max(P, ChunkTokens)
//	queue(w)    = QueuedPrefillTokens · rate
//	kvwait(w)   = f · meanOutput/2 · Decode(Running), f the share of the running
//	              requests' KV blocks that must free for the queued and new tokens
//	steps(w)    = ⌈(QueuedPrefillTokens + new(w)) / ChunkTokens⌉
//	interf(w)   = steps(w) · Decode.Extra(Running, Running·DecodeContext)
//	wait(w)     = max(queue(w), kvwait(w)) + interf(w)
//	ttft(w)     = wait(w) + prefill(w)
//	n(w)        = Waiting(w) + QueuedPrefillTokens(w) / P
//	b(w)        = u/(1−u), u = min(Busy(w), 0.9)
//	extra(w)    = max(n(w), mean over candidates of n, b(w)) · (prefill(w) − min over candidates of prefill)
//	future(w)   = later · b(w) · service, for a session not seen recently (else 0)
//	displace(w) = D(w) · rate · (1 + later) · (1 + b(w)), "kvdir-displace" only
//	cost(w)     = ttft(w) + extra(w) + future(w) + displace(w)
//
// interf is the decode batch riding along with every chunked-prefill step
// until our prefill is done: each such step costs the chunk plus the decodes'
// extra (calibration README, mixed steps). queue charges the queued tokens at
// the per-token cost of a cold prefill of our own size: they belong to many
// requests, each prefilled on its own, so pricing them as one prefill of
// their sum (as an earlier version did) grows with the square of the queue;
// at 400 k queued tokens one more token then cost about 2 ms while a cached
// token saves about 0.25 ms, and kvdir gave up reuse to even out queues.
//
// survive is learned (ObserveCache): per band of KV usage, the fraction of
// matched tokens the engines really served, starting from the prior curve
// Retain. A fixed curve misjudged busy engines: vLLM's usage counts only
// blocks that running requests hold, and near 100 % a session's finished
// prefix mostly survives the wait (the engine stops admitting rather than
// evicting), so the curve's coin flip made kvdir move sessions off their
// prefixes and recompute them just when the cluster had no time to spare.
//
// b(w) is the mean number of requests in an M/M/1 queue whose server is busy
// the fraction Busy of the time (the router's own accounting: some request
// here is waiting for its first token): extra work added to a worker that
// busy delays that many requests on average, even if its queue is empty at
// this instant.
//
// future(w) prices where a new session's later requests will queue: they
// carry its prefix and follow it, so a first turn chooses the session's home.
// later is the expected number of its later requests (requests over
// distinct session keys recently seen, minus one: memoryless session
// lengths), service the mean modelled prefill of the placed requests, and
// b(w)·service the mean wait of a request arriving at w. Without it kvdir sent
// every new session to the worker already holding its tenant's system
// prompt, saving that prompt's prefill once and paying in queueing for the
// session's whole life (kvbench sim, agent sessions, 8 × llama3-70b, a
// quarter of the trace's rate: two of eight replicas served nothing, the
// busiest 22 %). A session already seen has a home whose busy fraction
// already counts it, so comparing busy fractions would only reward moving
// it on noise; its placement is left to the present costs.
//
// displace(w) prices the cache content the placement pushes out (ledger):
// D(w) is how many tokens of other sessions' content, valued by the chance
// they come back, no longer fit in the caches once the request's new
// content is on w (and, if the session moves, freed on its latest worker),
// beyond what the cluster's whole KV could not hold anyway. Each is
// prefilled again at each of the session's expected reuses and delays the
// requests behind it. The session's latest worker is never charged, so the
// term only weighs moving or homing content. Without it kvdir homed groups
// sharing a long prompt on whichever worker was a few percent cheaper at
// that moment; workers left with three groups' prompts in room for fewer
// thrashed (kvbench sim, shared prefixes, 16 × llama3-8b, KV half the
// working set). Score, which sees one candidate, leaves it out. The term
// is the policy "kvdir-displace", not the default: on the evaluation set
// (bench/testdata/evalset.json, eight seeds) it raised the shared prefixes
// on 16 × llama3-8b 2.0 times and lowered the demo trace on 8 × llama3-8b
// by 4.5 % (docs/benchmarks.md, "A displacement term").
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
// extra(w) is what the rule leaves out when the cluster is busy: the
// prefill a cache miss recomputes is work added to w's queue, and the
// requests that queue behind it are delayed by it. For a single queue, extra
// work x delays the others by x·ρ/(1−ρ) in all, x times the mean number of
// requests in the queue; n(w) estimates that number (the engine's queue plus
// the router's queued prefill counted in requests of our size), and the
// cluster's mean stands in for it on a worker that is idle only for the
// moment. Without extra, a busy cluster's transient queue differences, which
// later placements even out anyway, outweigh the saving; the policy drifts
// to least-load and recomputes prefixes until the cluster drowns. (kvbench
// sim, Mooncake trace, 8 x llama3-70b, KV 2x the working set: 14 % hit rate
// before this term, the linear queue price and the router's speculative
// entries held until the first token; 33 % with the term alone; 53.6 % with
// all three. At half the trace's rate, reuse captured 0.82 with n(w) alone
// and 0.91 with the cluster's mean.) With it, moving a request away from its prefix
// must save more than the recomputation costs the requests behind it:
// wait(a) − wait(b) > (1 + n) · saving. On an idle cluster n = 0 and the rule
// is the seed document's.
type KVDir struct {
	prof    costmodel.Profile
	tol     float64
	chunk   int
	context int

	displace    bool          // the displacement term (Options.Displace)
	live        ProfileSource // if set, read into prof per call (see current)
	*kvdirState               // shared by the per-call copies
}

var _ ScorePicker = (*KVDir)(nil)

// kvdirState is the policy's mutable state, behind a pointer so that a
// per-call copy of KVDir (current) shares it.
type kvdirState struct {
	mu  sync.Mutex
	rng *rand.Rand
	fut future
	led ledger
	// surv and meanOut are read on every Pick and written by ObserveCache.
	surv survival
	// meanOut is the mean generated tokens per request (outcomes, decayed);
	// outWeight the decayed count behind it.
	meanOut, outWeight float64
}

// current returns p with the live profile, if there is one, for one call:
// a copy, so concurrent calls each price with one consistent profile.
func (p *KVDir) current() *KVDir {
	if p.live == nil {
		return p
	}
	q := *p
	q.prof = p.live.Profile()
	return &q
}

// Profile returns the profile the policy prices with now.
func (p *KVDir) Profile() costmodel.Profile { return p.current().prof }

// NewKVDir returns a kvdir policy configured by opts (Profile or
// LiveProfile, Seed, TieTolerance, ChunkTokens, DecodeContext).
func NewKVDir(opts Options) (*KVDir, error) {
	prof := opts.Profile
	if prof.Name == "" {
		var err error
		if prof, err = costmodel.ProfileByName(costmodel.DefaultProfileName); err != nil {
			return nil, err
		}
	}
	if opts.LiveProfile != nil {
		prof = opts.LiveProfile.Profile()
	}
	if err := prof.Validate(); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	p := &KVDir{prof: prof, tol: opts.TieTolerance, chunk: opts.ChunkTokens, context: opts.DecodeContext,
		displace: opts.Displace, live: opts.LiveProfile, kvdirState: &kvdirState{rng: newRand(opts.Seed)}}
	if p.tol <= 0 {
		p.tol = 0.01
	}
	if p.chunk <= 0 {
		p.chunk = 2048
	}
	if p.context <= 0 {
		p.context = DefaultDecodeContext
	}
	return p, nil
}

// Name returns "kvdir", or "kvdir-displace" with the displacement term.
func (p *KVDir) Name() string {
	if p.displace {
		return "kvdir-displace"
	}
	return "kvdir"
}

// Retain is the prior probability that a worker's matched blocks are still
// cached when the request runs, given its KV-cache usage u: 1 below 90 %
// usage, falling linearly to 0.5 at 100 %. The policy starts from it and
// learns the real curve from outcomes (KVDir.ObserveCache).
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

// ObserveCache teaches the policy what became of a placement's expected hit
// (see CacheOutcome): the eviction-survival discount follows what the
// engines really served instead of the prior curve Retain.
func (p *KVDir) ObserveCache(o CacheOutcome) {
	p.mu.Lock()
	p.surv.observe(o)
	if o.OutputTokens > 0 {
		p.outWeight = p.outWeight*futureDecay + 1
		p.meanOut += (float64(o.OutputTokens) - p.meanOut) / p.outWeight
	}
	p.mu.Unlock()
}

// Score returns cand's cost breakdown for req.
func (p *KVDir) Score(req Request, cand Candidate) Score {
	p = p.current()
	var s Score
	p.mu.Lock()
	surv, meanOut := p.surv, p.meanOut
	p.mu.Unlock()
	p.score(&s, req, &cand, p.prof.Prefill.Millis(req.PromptTokens, 0), p.rate(req), &surv, meanOut)
	return s
}

// queuedRequests estimates the requests waiting for their prefill on c: the
// engine's queue plus the router's queued prefill in requests of our size.
func queuedRequests(req Request, c *Candidate) float64 {
	return float64(max(c.Load.Waiting, 0)) + float64(max(c.Load.QueuedPrefillTokens, 0))/float64(max(req.PromptTokens, 1))
}

// rate is the modelled prefill cost of one queued token, in milliseconds.
func (p *KVDir) rate(req Request) float64 {
	r := max(req.PromptTokens, p.chunk)
	return p.prof.Prefill.Millis(r, 0) / float64(r)
}

// score fills s for c; cold is the request's prefill without cache.
func (p *KVDir) score(s *Score, req Request, c *Candidate, cold, rate float64, surv *survival, meanOut float64) {
	s.Worker, s.MatchedTokens, s.Retain = c.Worker, matchedTokens(req, c), surv.retain(c.Load.KVUsage)
	cached, loaded, transfer := p.tieredCache(req, c, int(math.Round(float64(s.MatchedTokens)*s.Retain)))
	s.CachedTokens, s.LoadedTokens, s.TransferMs = float64(cached), float64(loaded), transfer
	newTok := req.PromptTokens - cached
	s.PrefillMs = p.prof.Prefill.Millis(newTok, cached)
	s.ColdPrefillMs = cold
	q := max(c.Load.QueuedPrefillTokens, 0)
	if q > 0 {
		s.QueueMs = float64(q) * rate
	}
	if r := c.Load.Running; r > 0 {
		steps := (q + newTok + p.chunk - 1) / p.chunk
		s.InterferenceMs = float64(max(steps, 1)) * p.prof.Decode.Extra(r, r*p.context)
	}
	s.KVWaitMs = p.kvWait(req, c, q+newTok, meanOut)
	s.WaitMs = max(s.QueueMs, s.KVWaitMs) + s.InterferenceMs
	s.TotalMs = s.WaitMs + s.TransferMs + s.PrefillMs // tiers.go: the load delays us, not the queue
}

// kvWait estimates how long tokens more uncached tokens (the queued ones
// and ours) wait for KV blocks on c: an engine admits a prefill only into
// free blocks, and blocks held by running requests come free as they
// finish. If the deficit is a fraction f of the blocks the running
// requests hold, about f of them must finish first, which takes f times
// their mean remaining decode: half the mean output at the current decode
// step time. 0 when the worker's capacity or the mean output is unknown.
func (p *KVDir) kvWait(req Request, c *Candidate, tokens int, meanOut float64) float64 {
	capBlocks, r, u := c.Load.CapacityTokens/max(req.BlockSize, 1), c.Load.Running, c.Load.KVUsage
	if capBlocks <= 0 || r <= 0 || !(u > 0) || req.BlockSize <= 0 || !(meanOut > 0) {
		return 0
	}
	u = min(u, 1)
	need := float64((tokens + req.BlockSize - 1) / req.BlockSize)
	free := float64(capBlocks) * (1 - u)
	if need <= free {
		return 0
	}
	frac := (need - free) / (float64(capBlocks) * u)
	return min(frac, 1) * meanOut / 2 * p.prof.Decode.Millis(r, r*p.context)
}

// addExtra charges s with the delay its extra prefill (over minPrefill)
// imposes on the requests waiting on its worker.
func addExtra(s *Score, req Request, c *Candidate, minPrefill, mean float64) {
	n := max(queuedRequests(req, c), mean, backlog(c.Load.Busy))
	if n > 0 && s.PrefillMs > minPrefill {
		s.ExtraMs = n * (s.PrefillMs - minPrefill)
		s.TotalMs += s.ExtraMs
	}
}

// Pick returns the candidate with the lowest expected time to first token,
// with every candidate's breakdown in Decision.Scores.
func (p *KVDir) Pick(req Request, cands []Candidate) (Decision, error) {
	return p.PickInto(req, cands, nil)
}

// PickInto is Pick with the breakdown written into scores (ScorePicker):
// Decision.Scores is scores[:len(cands)] when scores has the capacity,
// else a new slice. What scores held before does not matter.
func (p *KVDir) PickInto(req Request, cands []Candidate, scores []Score) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	if req.PromptTokens < 1 {
		return Decision{}, fmt.Errorf("placement: kvdir: prompt of %d tokens", req.PromptTokens)
	}
	p = p.current()
	if cap(scores) >= len(cands) {
		scores = scores[:len(cands)]
		clear(scores) // score and addExtra leave some fields as they find them
	} else {
		scores = make([]Score, len(cands))
	}
	cold, rate := p.prof.Prefill.Millis(req.PromptTokens, 0), p.rate(req)
	p.mu.Lock()
	surv, meanOut := p.surv, p.meanOut
	later, service, fresh := p.fut.observe(req.SessionKey)
	var entry *ledgerEntry
	if p.displace {
		entry = p.led.lookup(req.SessionKey)
	}
	p.mu.Unlock()
	minPrefill := math.Inf(1)
	for i := range cands {
		p.score(&scores[i], req, &cands[i], cold, rate, &surv, meanOut)
		minPrefill = min(minPrefill, scores[i].PrefillMs)
	}
	if p.displace && req.SessionKey != "" {
		p.mu.Lock()
		d := p.led.view(entry, cands)
		for i := range cands {
			addDisplace(&scores[i], &cands[i], p.led.displaced(&d, &cands[i], req.PromptTokens, scores[i].CachedTokens), rate, later)
		}
		p.mu.Unlock()
	}
	var mean float64
	for i := range cands {
		mean += queuedRequests(req, &cands[i])
	}
	mean /= float64(len(cands))
	best := math.Inf(1)
	for i := range cands {
		addExtra(&scores[i], req, &cands[i], minPrefill, mean)
		if fresh {
			addFuture(&scores[i], &cands[i], later, service)
		}
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
				p.mu.Lock()
				p.fut.served(scores[i].PrefillMs)
				if p.displace {
					p.led.placed(req.SessionKey, cands[i].Worker, req.PromptTokens, int(scores[i].CachedTokens))
				}
				p.mu.Unlock()
				return Decision{Worker: cands[i].Worker, Index: i, PredictedCachedTokens: int(scores[i].CachedTokens), Scores: scores}, nil
			}
			k--
		}
	}
	panic("placement: kvdir: no candidate within the tie band") // unreachable
}
