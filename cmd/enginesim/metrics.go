package main

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// ttftBuckets are vLLM's time_to_first_token_seconds buckets.
var ttftBuckets = []float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
}

// metrics exports vLLM's metric names, labelled model_name and engine. The
// gauges and counters are read from the engine at scrape time (they restart
// from zero with the engine, as a real restart's would); the TTFT histogram
// is observed by the completion handlers in modelled seconds.
type metrics struct {
	reg     *prometheus.Registry
	ttft    prometheus.Histogram
	handler http.Handler
	// oversized counts for the whole process: one rank of several
	// behind one server exports it (see addRanks).
	oversized prometheus.Collector
}

type statsCollector struct {
	s                                   *server
	running, waiting, usage             *prometheus.Desc
	cacheConfig                         *prometheus.Desc
	queries, hits, preemptions, genToks *prometheus.Desc
}

func newMetrics(s *server) *metrics {
	if s.cfg.metricsFormat == "sglang" {
		return newSGLangMetrics(s)
	}
	labels := prometheus.Labels{"model_name": s.cfg.model, "engine": s.engineLabel()}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, nil, labels)
	}
	c := &statsCollector{
		s:           s,
		running:     desc("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:     desc("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:       desc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:     desc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        desc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preemptions: desc("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine."),
		genToks:     desc("vllm:generation_tokens_total", "Number of generation tokens processed."),
		cacheConfig: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			[]string{"block_size", "num_gpu_blocks"}, labels),
	}
	return newMetricsOf(c, "vllm:time_to_first_token_seconds", labels)
}

// newMetricsOf registers collector c and a TTFT histogram named ttftName
// with labels, and serves them.
func newMetricsOf(c prometheus.Collector, ttftName string, labels prometheus.Labels) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        ttftName,
			Help:        "Histogram of time to first token in seconds (modelled engine time).",
			Buckets:     ttftBuckets,
			ConstLabels: labels,
		}),
	}
	oversized := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kvdir_enginesim_zmtp_oversized_total",
		Help: "ZMQ connections closed because the peer declared a message over --kv-events-max-message-bytes.",
	}, func() float64 { return float64(kvevents.OversizedMessages()) })
	m.oversized = oversized
	m.reg.MustRegister(c, m.ttft, oversized)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.usage, c.queries, c.hits, c.preemptions, c.genToks, c.cacheConfig} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.current().runner.Stats()
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(st.Waiting))
	ch <- prometheus.MustNewConstMetric(c.usage, prometheus.GaugeValue, st.KVUsage)
	ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, float64(st.PrefixQueries))
	ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(st.PrefixHits))
	ch <- prometheus.MustNewConstMetric(c.preemptions, prometheus.CounterValue, float64(st.Preemptions))
	ch <- prometheus.MustNewConstMetric(c.genToks, prometheus.CounterValue, float64(st.GeneratedTokens))
	ch <- prometheus.MustNewConstMetric(c.cacheConfig, prometheus.GaugeValue, 1,
		strconv.Itoa(c.s.cfg.blockSize), strconv.Itoa(st.CapacityBlocks))
}
