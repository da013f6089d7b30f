package placement

import (
	"math/rand/v2"
	"sync"
)

// SGLang is a baseline of the SGLang router's "cache_aware" policy.
//
// Sources (read for facts only): github.com/sgl-project/sglang, sgl-router
// (src/router.rs select_worker_cache_aware, later src/policies/cache_aware.rs)
// and sgl-router/py_src/sglang_router/launch_router.py RouterArgs defaults:
// cache_threshold = 0.5, balance_abs_threshold = 32, balance_rel_threshold =
// 1.0001, eviction_interval = 60 s, max_tree_size = 2^24. (Later releases of
// the Rust library default to 0.5/32/1.1 and the sgl-model-gateway CLI to
// 0.3/64/1.5; we use the Python RouterArgs defaults.) The rule, per request:
//
//  1. load(w) is the router's own running-request count for w. The system is
//     imbalanced when max−min > balance_abs_threshold AND
//     max > min·balance_rel_threshold; then the least-loaded worker wins.
//  2. Otherwise the router's approximate radix tree (text the router sent to
//     each worker) gives the longest prefix match and its worker; if
//     matched/len(text) > cache_threshold that worker wins,
//  3. else the worker with the smallest tree (fewest characters inserted for
//     it, "get_smallest_tenant") wins.
//
// After choosing, the request's text is inserted into the chosen worker's
// tree.
//
// Approximations:
//   - load is Load.InFlight (the router-side count, as in SGLang).
//   - The match ratio is min(MatchedBlocks·BlockSize, P)/P with the
//     directory's blocks standing in for the router's character tree; the
//     best match is the largest MatchedBlocks (ties at random).
//   - Tree size is kept inside the policy: each pick adds P − matched tokens
//     of the chosen worker (the part of the prompt new to its tree). SGLang's
//     LRU eviction (every 60 s down to max_tree_size) is not modelled.
//   - Ties (equal loads, equal tree sizes) are broken at random; SGLang takes
//     whichever its hash map yields first.
type SGLang struct {
	cacheThreshold float64
	absThreshold   int
	relThreshold   float64

	mu   sync.Mutex
	rng  *rand.Rand
	tree map[string]int64 // worker → tokens inserted into its approximate tree
	vals []float64        // scratch
}

// NewSGLang returns the SGLang cache-aware baseline with the published defaults.
func NewSGLang(opts Options) *SGLang {
	return &SGLang{cacheThreshold: 0.5, absThreshold: 32, relThreshold: 1.0001, rng: newRand(opts.Seed), tree: make(map[string]int64)}
}

// Name returns "sglang".
func (p *SGLang) Name() string { return "sglang" }

// Pick applies the cache-aware rule above.
func (p *SGLang) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cap(p.vals) < len(cands) {
		p.vals = make([]float64, len(cands))
	}
	vals := p.vals[:len(cands)]
	minL, maxL := cands[0].Load.InFlight, cands[0].Load.InFlight
	for i := range cands {
		minL, maxL = min(minL, cands[i].Load.InFlight), max(maxL, cands[i].Load.InFlight)
	}
	var best int
	switch {
	case maxL-minL > p.absThreshold && float64(maxL) > float64(minL)*p.relThreshold:
		for i := range cands {
			vals[i] = float64(cands[i].Load.InFlight)
		}
		best = pickBest(p.rng, vals, true)
	default:
		for i := range cands {
			vals[i] = float64(cands[i].MatchedBlocks)
		}
		best = pickBest(p.rng, vals, false)
		if p.matchRatio(req, &cands[best]) <= p.cacheThreshold {
			for i := range cands {
				vals[i] = float64(p.tree[cands[i].Worker])
			}
			best = pickBest(p.rng, vals, true)
		}
	}
	p.tree[cands[best].Worker] += int64(req.PromptTokens - p.matched(req, &cands[best]))
	return decide(req, cands, best), nil
}

// matched is the prompt tokens c's prefix match covers, at most P.
func (p *SGLang) matched(req Request, c *Candidate) int {
	return min(c.MatchedBlocks*req.BlockSize, req.PromptTokens)
}

func (p *SGLang) matchRatio(req Request, c *Candidate) float64 {
	if req.PromptTokens <= 0 {
		return 0
	}
	return float64(p.matched(req, c)) / float64(req.PromptTokens)
}
