package placement

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// Dynamo is a baseline of NVIDIA Dynamo's KV router cost function.
//
// Sources (read for facts only): github.com/ai-dynamo/dynamo,
// lib/llm/src/kv_router/scheduler.rs (later lib/kv-router/src/scheduling/
// selector.rs, DefaultWorkerSelector::select_worker) and
// docs/router/kv_cache_routing.md: --kv-overlap-score-weight defaults to 1,
// --router-temperature defaults to 0. For each worker w, in blocks:
//
//	prefill_blocks(w) = (isl − overlap(w)·block_size + active_prefill_tokens(w)) / block_size
//	decode_blocks(w)  = active_blocks(w) + new_blocks(request, w)
//	logit(w)          = overlap_score_weight · prefill_blocks(w) + decode_blocks(w)
//
// Lower wins; with temperature 0 the minimal logits are taken and one is chosen
// at random (softmax_sample's temperature-0 branch).
//
// Approximations (Candidate does not carry Dynamo's per-worker block
// accounting):
//   - overlap(w) is MatchedBlocks, capped at the prompt.
//   - active_prefill_tokens(w) is Load.QueuedPrefillTokens (uncached prompt
//     tokens routed to w and not yet started), which is what Dynamo counts.
//   - active_blocks(w) is Running·DecodeContext/BlockSize: each running
//     sequence is assumed to hold DecodeContext tokens (Options.DecodeContext,
//     default 4096) of KV. Dynamo counts the distinct blocks of its own active
//     sequences; KVUsage × capacity would also do but the capacity is unknown.
//   - new_blocks is ⌈P/BlockSize⌉ for every worker (Dynamo subtracts blocks
//     already shared with w's active sequences, which we cannot see); being
//     the same for all workers it does not change the choice.
type Dynamo struct {
	overlapWeight float64
	context       int

	mu   sync.Mutex
	rng  *rand.Rand
	vals []float64 // scratch
}

// NewDynamo returns the Dynamo KV-router baseline (overlap weight 1,
// temperature 0; DecodeContext from opts, default 4096).
func NewDynamo(opts Options) *Dynamo {
	c := opts.DecodeContext
	if c <= 0 {
		c = 4096
	}
	return &Dynamo{overlapWeight: 1, context: c, rng: newRand(opts.Seed)}
}

// Name returns "dynamo".
func (p *Dynamo) Name() string { return "dynamo" }

// Logit returns cand's cost for req (lower wins); req.BlockSize must be ≥ 1.
func (p *Dynamo) Logit(req Request, c Candidate) float64 {
	b := float64(req.BlockSize)
	overlapTok := min(c.MatchedBlocks*req.BlockSize, req.PromptTokens)
	prefill := float64(req.PromptTokens-overlapTok+max(c.Load.QueuedPrefillTokens, 0)) / b
	active := float64(max(c.Load.Running, 0)) * float64(p.context) / b
	decode := active + float64(requestBlocks(req))
	return p.overlapWeight*prefill + decode
}

// Pick returns the lowest logit, ties at random.
func (p *Dynamo) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	if req.BlockSize < 1 {
		return Decision{}, fmt.Errorf("placement: dynamo: block size %d", req.BlockSize)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cap(p.vals) < len(cands) {
		p.vals = make([]float64, len(cands))
	}
	vals := p.vals[:len(cands)]
	for i := range cands {
		vals[i] = p.Logit(req, cands[i])
	}
	return decide(req, cands, pickBest(p.rng, vals, true)), nil
}
