package placement

import (
	"math/rand/v2"
	"sync"
)

// LLMD is a baseline of the llm-d inference scheduler's default scoring
// profile ("llm-d") and of a sticky variant ("llm-d-sticky").
//
// Sources (read for facts only):
//   - github.com/llm-d/llm-d-inference-scheduler and its deployment guides
//     (llm-d "inference-scheduling" well-lit path, EndpointPickerConfig
//     scheduling profile): prefix-cache-scorer weight 3, queue-scorer weight
//     2, kv-cache-utilization-scorer weight 2, max-score-picker.
//   - github.com/kubernetes-sigs/gateway-api-inference-extension (GIE), the
//     scorer plugins llm-d builds on (pkg/epp/scheduling/.../scorer):
//     queue scorer = (maxWaiting − waiting)/(maxWaiting − minWaiting) over
//     the candidates, 1 for all when they are equal; KV-cache utilization
//     scorer = 1 − KVCacheUsagePercent; prefix scorer = matched prefix
//     blocks / the request's prefix blocks. Each score is in [0,1]; the
//     profile's score is Σ weight·score and the max-score picker takes the
//     maximum, ties at random.
//   - GIE saturation detector (pkg/epp/saturationdetector config.go):
//     DefaultQueueDepthThreshold = 5, DefaultKVCacheUtilThreshold = 0.8; a
//     pod has capacity while waiting ≤ 5 and KV usage ≤ 0.8.
//
// Approximations:
//   - The prefix score uses the directory's MatchedBlocks over ⌈P/BlockSize⌉
//     (capped at 1), i.e. llm-d's "precise" (KV-event) prefix mode; the GIE
//     approximate mode hashes characters, which Candidate does not carry.
//   - Waiting is vllm:num_requests_waiting and KVUsage vllm:kv_cache_usage_perc,
//     the same metrics the scorers read.
//   - llm-d-sticky is NOT a single published llm-d plugin. It composes llm-d's
//     session affinity (stay on the session's previous pod) with GIE's
//     saturation-detector thresholds as the "until saturated" rule: keep the
//     session's previous worker while it is a candidate with Waiting ≤ 5 and
//     KVUsage ≤ 0.8; otherwise pick by the weighted sum above and remember
//     that worker for the session. The session → worker map is kept inside
//     the policy and is not bounded (no TTL), unlike a cookie.
type LLMD struct {
	sticky               bool
	wPrefix, wQueue, wKV float64
	queueThreshold       int     // sticky: saturated when Waiting > this
	kvThreshold          float64 // sticky: saturated when KVUsage > this

	mu     sync.Mutex
	rng    *rand.Rand
	prev   map[string]string // session key → previous worker (sticky only)
	scores []float64         // scratch
}

// NewLLMD returns the llm-d baseline; sticky selects "llm-d-sticky".
func NewLLMD(opts Options, sticky bool) *LLMD {
	p := &LLMD{sticky: sticky, wPrefix: 3, wQueue: 2, wKV: 2, queueThreshold: 5, kvThreshold: 0.8, rng: newRand(opts.Seed)}
	if sticky {
		p.prev = make(map[string]string)
	}
	return p
}

// Name returns "llm-d" or "llm-d-sticky".
func (p *LLMD) Name() string {
	if p.sticky {
		return "llm-d-sticky"
	}
	return "llm-d"
}

// WeightedScores returns each candidate's Σ weight·score (higher wins).
func (p *LLMD) WeightedScores(req Request, cands []Candidate) []float64 {
	return p.weighted(req, cands, make([]float64, len(cands)))
}

func (p *LLMD) weighted(req Request, cands []Candidate, out []float64) []float64 {
	minQ, maxQ := cands[0].Load.Waiting, cands[0].Load.Waiting
	for i := range cands {
		minQ, maxQ = min(minQ, cands[i].Load.Waiting), max(maxQ, cands[i].Load.Waiting)
	}
	nb := requestBlocks(req)
	for i := range cands {
		l := cands[i].Load
		prefix := 0.0
		if nb > 0 {
			prefix = float64(min(cands[i].MatchedBlocks, nb)) / float64(nb)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-l.Waiting) / float64(maxQ-minQ)
		}
		kv := 1 - min(max(l.KVUsage, 0), 1)
		out[i] = p.wPrefix*prefix + p.wQueue*queue + p.wKV*kv
	}
	return out
}

// Pick returns the maximum weighted score (ties at random); llm-d-sticky first
// keeps the session's previous worker while it is not saturated.
func (p *LLMD) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sticky && req.SessionKey != "" {
		if w, ok := p.prev[req.SessionKey]; ok {
			for i := range cands {
				l := cands[i].Load
				if cands[i].Worker == w && l.Waiting <= p.queueThreshold && l.KVUsage <= p.kvThreshold {
					return decide(req, cands, i), nil
				}
			}
		}
	}
	if cap(p.scores) < len(cands) {
		p.scores = make([]float64, len(cands))
	}
	scores := p.weighted(req, cands, p.scores[:len(cands)])
	best := pickBest(p.rng, scores, false)
	if p.sticky && req.SessionKey != "" {
		p.prev[req.SessionKey] = cands[best].Worker
	}
	return decide(req, cands, best), nil
}
