package enginemetrics

import "strconv"

// Metric names of SGLang read here (python/sglang/srt/metrics/collector.py:
// SchedulerMetricsCollector and TokenizerMetricsCollector). The scheduler's
// gauges are labelled model_name, engine_type, tp_rank, pp_rank (and
// moe_ep_rank), plus dp_rank when data parallelism is on; the tokenizer's
// counters are the API server's, labelled model_name only.
const (
	sglRunning    = "sglang:num_running_reqs"    // gauge: requests running
	sglQueue      = "sglang:num_queue_reqs"      // gauge: requests in the waiting queue
	sglTokenUsage = "sglang:token_usage"         // gauge: fraction of the KV pool's tokens in use
	sglHitRate    = "sglang:cache_hit_rate"      // gauge: prefix-cache hit rate of recent prefill batches
	sglPrompt     = "sglang:prompt_tokens_total" // counter: prefill (prompt) tokens processed
	sglCached     = "sglang:cached_tokens_total" // counter: prompt tokens served from the prefix cache
	labelSGLRank  = "dp_rank"
)

// sglangAcc accumulates SGLang's series. The scheduler's gauges are kept
// per data-parallel rank as the largest over that rank's series (every
// tensor- or pipeline-parallel rank of one scheduler may report the same
// queue), then summed over ranks (running, waiting) or maxed (usage,
// hit rate).
type sglangAcc struct {
	ranks         map[string]*sglRank
	order         []string
	prompt, cache float64
	model         string
	seen          int
}

type sglRank struct{ running, waiting, usage, hitRate float64 }

func newSGLangAcc() *sglangAcc { return &sglangAcc{ranks: map[string]*sglRank{}} }

// add takes one sample; o.ByRank keeps only the scheduler gauges of rank
// o.Rank (the tokenizer's counters are the whole server's and are kept).
func (a *sglangAcc) add(name string, labels []byte, value float64, o Options) {
	switch name {
	case sglPrompt:
		a.prompt += value
		return
	case sglCached:
		a.cache += value
		return
	case sglRunning, sglQueue, sglTokenUsage, sglHitRate:
	default:
		return
	}
	rank, ok := lookupLabel(labels, labelSGLRank)
	if !ok {
		rank = "0"
	}
	if o.ByRank {
		if n, err := strconv.Atoi(rank); err != nil || n != o.Rank {
			return
		}
	}
	r := a.ranks[rank]
	if r == nil {
		r = &sglRank{}
		a.ranks[rank] = r
		a.order = append(a.order, rank)
	}
	v := max(value, 0)
	switch name {
	case sglRunning:
		r.running = max(r.running, v)
	case sglQueue:
		r.waiting = max(r.waiting, v)
	case sglTokenUsage:
		r.usage = max(r.usage, v)
	case sglHitRate:
		r.hitRate = max(r.hitRate, v)
		return // not a load gauge
	}
	a.seen++
	if a.model == "" {
		a.model = labelValue(labels, "model_name")
	}
}

// load maps SGLang's metrics onto Load:
//
//   - Running: sglang:num_running_reqs, summed over dp_rank;
//   - Waiting: sglang:num_queue_reqs, summed over dp_rank;
//   - KVUsage: sglang:token_usage (the fraction of KV-pool tokens in use),
//     the largest over dp_rank, clamped to [0, 1];
//   - HitRate: sglang:cache_hit_rate, the largest over dp_rank, clamped;
//   - PrefixQueries, PrefixHits: sglang:prompt_tokens_total and
//     sglang:cached_tokens_total, cumulative tokens, summed over series;
//   - Model: the model_name label.
func (a *sglangAcc) load() Load {
	out := Load{Kind: KindSGLang, Model: a.model, PrefixQueries: a.prompt, PrefixHits: a.cache}
	var usage, hit float64
	for _, k := range a.order {
		r := a.ranks[k]
		out.Running += int(r.running)
		out.Waiting += int(r.waiting)
		usage, hit = max(usage, r.usage), max(hit, r.hitRate)
	}
	out.KVUsage = min(usage, 1)
	out.HitRate = min(hit, 1)
	return out
}
