package main

import (
	"github.com/prometheus/client_golang/prometheus"
)

// SGLang's metric names and labels, as python/sglang/srt/metrics/collector.py
// declares them: the scheduler's gauges (SchedulerMetricsCollector) are
// labelled model_name, engine_type, tp_rank and pp_rank, plus dp_rank with
// data parallelism; the tokenizer's counters and TTFT histogram
// (TokenizerMetricsCollector) model_name only, cached_tokens_total also
// cache_source.
const (
	sglRunning    = "sglang:num_running_reqs"
	sglQueue      = "sglang:num_queue_reqs"
	sglTokenUsage = "sglang:token_usage"
	sglHitRate    = "sglang:cache_hit_rate"
	sglPrompt     = "sglang:prompt_tokens_total"
	sglGenerated  = "sglang:generation_tokens_total"
	sglCached     = "sglang:cached_tokens_total"
	sglTTFT       = "sglang:time_to_first_token_seconds"
)

// sglangCollector reads the engine's stats under SGLang's names.
type sglangCollector struct {
	s                              *server
	running, queue, usage, hitRate *prometheus.Desc
	prompt, generated, cached      *prometheus.Desc
}

// newSGLangMetrics exports the engine's stats under SGLang's names
// (--metrics-format sglang). token_usage is the fraction of KV blocks in
// use; cache_hit_rate, prompt_tokens_total and cached_tokens_total are
// the prefix cache's cumulative looked-up and hit tokens (SGLang counts
// them per prefill batch and per finished request; the simulator's
// totals are what they add up to).
func newSGLangMetrics(s *server) *metrics {
	sched := prometheus.Labels{"model_name": s.cfg.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
	if s.cfg.dpRank > 0 {
		sched["dp_rank"] = s.engineLabel()
	}
	tok := prometheus.Labels{"model_name": s.cfg.model}
	device := prometheus.Labels{"model_name": s.cfg.model, "cache_source": "device"}
	c := &sglangCollector{
		s:         s,
		running:   prometheus.NewDesc(sglRunning, "The number of running requests.", nil, sched),
		queue:     prometheus.NewDesc(sglQueue, "The number of requests in the waiting queue.", nil, sched),
		usage:     prometheus.NewDesc(sglTokenUsage, "The token usage.", nil, sched),
		hitRate:   prometheus.NewDesc(sglHitRate, "The prefix cache hit rate.", nil, sched),
		prompt:    prometheus.NewDesc(sglPrompt, "Number of prefill tokens processed.", nil, tok),
		generated: prometheus.NewDesc(sglGenerated, "Number of generation tokens processed.", nil, tok),
		cached:    prometheus.NewDesc(sglCached, "Number of cached prompt tokens by source (device/host/storage).", nil, device),
	}
	return newMetricsOf(c, sglTTFT, tok)
}

// Describe implements prometheus.Collector.
func (c *sglangCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.queue, c.usage, c.hitRate, c.prompt, c.generated, c.cached} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *sglangCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.current().runner.Stats()
	hit := 0.0
	if st.PrefixQueries > 0 {
		hit = float64(st.PrefixHits) / float64(st.PrefixQueries)
	}
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(st.Waiting))
	ch <- prometheus.MustNewConstMetric(c.usage, prometheus.GaugeValue, st.KVUsage)
	ch <- prometheus.MustNewConstMetric(c.hitRate, prometheus.GaugeValue, hit)
	ch <- prometheus.MustNewConstMetric(c.prompt, prometheus.CounterValue, float64(st.PrefixQueries))
	ch <- prometheus.MustNewConstMetric(c.generated, prometheus.CounterValue, float64(st.GeneratedTokens))
	ch <- prometheus.MustNewConstMetric(c.cached, prometheus.CounterValue, float64(st.PrefixHits))
}
