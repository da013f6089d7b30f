package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Request outcomes, the outcome label of kvdir_router_requests_total.
const (
	OutcomeOK          = "ok"           // the engine answered 2xx
	OutcomeUpstream4xx = "upstream-4xx" // the engine answered 4xx (passed through)
	OutcomeUpstream5xx = "upstream-5xx" // the engine answered 5xx (passed through)
	OutcomeBroken      = "broken"       // the engine's response broke after the first byte
	OutcomeCancelled   = "cancelled"    // the client went away
	OutcomeRejected    = "rejected"     // the router refused the request (4xx of its own)
	OutcomeFailed      = "failed"       // no worker could take the request (5xx of the router)
)

// metrics are the router's Prometheus series, all prefixed kvdir_router_.
type metrics struct {
	reg            *prometheus.Registry
	requests       *prometheus.CounterVec
	decision       prometheus.Histogram
	dirLookup      *prometheus.HistogramVec
	matches        *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	retries        *prometheus.CounterVec
	predicted      *prometheus.CounterVec
	engineCached   *prometheus.CounterVec
	promptTokens   *prometheus.CounterVec
	ttft           *prometheus.HistogramVec
	workers        prometheus.GaugeFunc
	inflight       *prometheus.GaugeVec
	sessionsLost   *prometheus.CounterVec
	sessionBatches *prometheus.CounterVec
	scrapeFailures *prometheus.CounterVec
	modelsFailures *prometheus.CounterVec
	bodiesReading  prometheus.Gauge

	intentsSent, intentsReceived, intentsDropped prometheus.Counter
}

func newMetrics(numWorkers func() float64) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_requests_total",
			Help: "Requests by chosen worker (\"none\" if none), policy and outcome."}, []string{"worker", "policy", "outcome"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvdir_router_decision_seconds",
			Help:    "Time to place a request: render, tokenize, hash, directory match and score.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14)}),
		dirLookup: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvdir_router_directory_lookup_seconds",
			Help:    "Directory match calls, successful or not, by directory group.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 12)}, []string{"group"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_fallbacks_total",
			Help: "Requests placed without the directory, by directory group (of the request's model) and reason."}, []string{"group", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_retries_total",
			Help: "Requests placed again after a worker failed before its first response byte, by reason."}, []string{"reason"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_predicted_cached_tokens_total",
			Help: "Prompt tokens the policy expected the chosen worker to serve from its cache."}, []string{"worker"}),
		engineCached: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_engine_cached_tokens_total",
			Help: "Prompt tokens the engine reported served from its cache (usage.prompt_tokens_details.cached_tokens)."}, []string{"worker"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_prompt_tokens_total",
			Help: "Prompt tokens routed, as the router rendered them."}, []string{"worker"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvdir_router_upstream_ttft_seconds",
			Help:    "Time from sending a request upstream to its first response body byte.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16)}, []string{"worker"}),
		workers: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvdir_router_workers",
			Help: "Workers known to the router."}, numWorkers),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvdir_router_inflight",
			Help: "Requests this router sent to a worker and has not seen finish."}, []string{"worker"}),
		sessionsLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_session_records_dropped_total",
			Help: "Session records not written to the directory (it failed or the queue was full), by directory group."}, []string{"group"}),
		sessionBatches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_session_batches_total",
			Help: "RecordSessions calls, by directory group and result."}, []string{"group", "result"}),
		scrapeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_engine_scrape_failures_total",
			Help: "Failed scrapes of an engine's /metrics, by worker and reason (unreachable, status, unknown-exposition, read)."}, []string{"worker", "reason"}),
		modelsFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_engine_models_failures_total",
			Help: "Failed reads of an engine's /v1/models (the last list is kept), by worker and reason (unreachable, status, read)."}, []string{"worker", "reason"}),
	}
	m.bodiesReading = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvdir_router_request_bodies_reading",
		Help: "Requests whose body the router is still receiving (slow or stalled clients show here until --body-timeout)."})
	m.matches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_matches_total",
		Help: "Directory look-ups by directory group and what answered them: local (the router's replica of the directory) or directory (a node, over gRPC)."}, []string{"group", "source"})
	m.intentsSent = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_router_intents_sent_total",
		Help: "Placement intents (and updates of them) this router sent to the directory's Share stream."})
	m.intentsReceived = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_router_intents_received_total",
		Help: "Other routers' placement intents (and updates) received from the directory's Share stream."})
	m.intentsDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_router_intents_dropped_total",
		Help: "This router's placement intents dropped before they expired (over its bound of live intents)."})
	m.reg.MustRegister(m.bodiesReading, m.intentsSent, m.intentsReceived, m.intentsDropped)
	m.reg.MustRegister(m.matches, m.modelsFailures, m.requests, m.decision, m.dirLookup, m.fallbacks, m.retries, m.predicted, m.engineCached,
		m.promptTokens, m.ttft, m.workers, m.inflight, m.sessionsLost, m.sessionBatches, m.scrapeFailures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
