package enginemetrics

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// trtllmStats is the part of one TensorRT-LLM iteration-stats entry read
// here. trtllm-serve's GET /metrics (tensorrt_llm/serve/openai_server.py,
// get_iteration_stats) answers a JSON array of the iteration stats
// gathered since the last call (llm.get_stats_async), each the executor's
// IterationStats as JSON: numActiveRequests, numQueuedRequests,
// kvCacheStats{maxNumBlocks, freeNumBlocks, usedNumBlocks, tokensPerBlock,
// reusedBlocks, missedBlocks, cacheHitRate}, and more not read here.
type trtllmStats struct {
	NumActiveRequests *float64 `json:"numActiveRequests"`
	NumQueuedRequests *float64 `json:"numQueuedRequests"`
	KVCacheStats      *struct {
		MaxNumBlocks   float64 `json:"maxNumBlocks"`
		FreeNumBlocks  float64 `json:"freeNumBlocks"`
		UsedNumBlocks  float64 `json:"usedNumBlocks"`
		TokensPerBlock float64 `json:"tokensPerBlock"`
		ReusedBlocks   float64 `json:"reusedBlocks"`
		MissedBlocks   float64 `json:"missedBlocks"`
		CacheHitRate   float64 `json:"cacheHitRate"`
	} `json:"kvCacheStats"`
}

// maxJSON bounds the JSON body read, whatever the caller's bound.
const maxJSON = 16 << 20

// parseTRTLLM maps TensorRT-LLM's iteration stats onto Load, from the
// last (latest) entry of the array (a single object is read as a
// one-entry array):
//
//   - Running: numActiveRequests;
//   - Waiting: numQueuedRequests;
//   - KVUsage: kvCacheStats.usedNumBlocks / kvCacheStats.maxNumBlocks
//     (maxNumBlocks - freeNumBlocks when usedNumBlocks is absent),
//     clamped to [0, 1];
//   - PrefixQueries, PrefixHits: (reusedBlocks + missedBlocks) and
//     reusedBlocks times tokensPerBlock, in tokens (0 when the engine does
//     not report block reuse);
//   - HitRate: kvCacheStats.cacheHitRate.
//
// An empty array means no iteration ran since the previous read: a zero
// load and ErrNoNewStats. The stats carry no data-parallel rank: only rank 0
// may be asked for.
func parseTRTLLM(br *bufio.Reader, o Options) (Load, error) {
	if o.ByRank && o.Rank != 0 {
		return Load{}, fmt.Errorf("%w: TensorRT-LLM iteration stats carry no data-parallel rank (asked for rank %d)", ErrUnknownExposition, o.Rank)
	}
	body, err := io.ReadAll(io.LimitReader(br, maxJSON+1))
	if err != nil {
		return Load{}, fmt.Errorf("read metrics: %w", err)
	}
	if len(body) > maxJSON {
		return Load{}, fmt.Errorf("TensorRT-LLM iteration stats: body over %d bytes", maxJSON)
	}
	var list []trtllmStats
	if err := json.Unmarshal(body, &list); err != nil {
		var one trtllmStats
		if err2 := json.Unmarshal(body, &one); err2 != nil {
			return Load{}, fmt.Errorf("%w: TensorRT-LLM iteration stats (a JSON array of numActiveRequests, numQueuedRequests, kvCacheStats): %v", ErrUnknownExposition, err)
		}
		list = []trtllmStats{one}
	}
	out := Load{Kind: KindTRTLLM}
	if len(list) == 0 {
		return out, ErrNoNewStats
	}
	st := list[len(list)-1]
	if st.NumActiveRequests == nil && st.NumQueuedRequests == nil && st.KVCacheStats == nil {
		return Load{}, fmt.Errorf("%w: TensorRT-LLM iteration stats without numActiveRequests, numQueuedRequests or kvCacheStats", ErrUnknownExposition)
	}
	out.Running = count(st.NumActiveRequests)
	out.Waiting = count(st.NumQueuedRequests)
	if kv := st.KVCacheStats; kv != nil {
		used := kv.UsedNumBlocks
		if used == 0 && kv.FreeNumBlocks > 0 {
			used = kv.MaxNumBlocks - kv.FreeNumBlocks
		}
		if kv.MaxNumBlocks > 0 {
			out.KVUsage = clamp01(used / kv.MaxNumBlocks)
		}
		if kv.TokensPerBlock > 0 {
			out.PrefixHits = max(kv.ReusedBlocks, 0) * kv.TokensPerBlock
			out.PrefixQueries = out.PrefixHits + max(kv.MissedBlocks, 0)*kv.TokensPerBlock
			if math.IsInf(out.PrefixQueries, 0) || math.IsNaN(out.PrefixQueries) {
				out.PrefixQueries, out.PrefixHits = 0, 0
			}
		}
		out.HitRate = clamp01(kv.CacheHitRate)
	}
	return out, nil
}

// count converts a request count: absent, negative or non-finite is 0.
func count(p *float64) int {
	if p == nil || math.IsNaN(*p) || *p <= 0 {
		return 0
	}
	if *p >= math.MaxInt32 {
		return math.MaxInt32
	}
	return int(*p)
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return min(max(v, 0), 1)
}
