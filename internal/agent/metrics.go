package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the agent's own Prometheus metrics (kvdir_agent_*).
type metrics struct {
	reg          *prometheus.Registry
	gaps         prometheus.Counter
	replays      *prometheus.CounterVec
	rebuilds     *prometheus.CounterVec
	partial      prometheus.Gauge
	resyncs      *prometheus.CounterVec
	restarts     prometheus.Counter
	batches      prometheus.Counter
	dropped      prometheus.Counter
	registers    prometheus.Counter
	refusals     *prometheus.CounterVec
	duplicates   prometheus.Counter
	decodeErrors prometheus.Counter
	malformed    prometheus.Counter
	heartbeats   *prometheus.CounterVec
	lag          prometheus.Histogram
	oversized    prometheus.Counter
	engineDowns  prometheus.Counter
}

// translatorCollector exports the Translator's counters.
type translatorCollector struct {
	a                         *Agent
	events, stored, removed   *prometheus.Desc
	problems, entries, clears *prometheus.Desc
}

func (c *translatorCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.stored
	ch <- c.removed
	ch <- c.problems
	ch <- c.entries
	ch <- c.clears
}

func (c *translatorCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.a.TranslatorStats()
	for k, v := range s.Events {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(v), k)
	}
	for k, v := range s.Problems {
		ch <- prometheus.MustNewConstMetric(c.problems, prometheus.CounterValue, float64(v), k)
	}
	ch <- prometheus.MustNewConstMetric(c.stored, prometheus.CounterValue, float64(s.BlocksStored))
	ch <- prometheus.MustNewConstMetric(c.removed, prometheus.CounterValue, float64(s.BlocksRemoved))
	ch <- prometheus.MustNewConstMetric(c.clears, prometheus.CounterValue, float64(s.Cleared))
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(s.MapEntries))
}

func newMetrics(a *Agent) *metrics {
	reg := prometheus.NewRegistry()
	// Every series names its worker, so that the agents of a
	// data-parallel engine can share one /metrics.
	labelled := prometheus.WrapRegistererWith(prometheus.Labels{"worker": a.cfg.WorkerID}, reg)
	f := func(c prometheus.Collector) { labelled.MustRegister(c) }
	m := &metrics{
		reg:          reg,
		gaps:         prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_gaps_total", Help: "Sequence gaps in the engine's event stream."}),
		replays:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_replays_total", Help: "Replay requests to the engine, by result."}, []string{"result"}),
		rebuilds:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_rebuilds_total", Help: "Rebuilds of the worker's view from the engine's replay buffer (at start-up and after every new registration), by result: complete, partial (the buffer could not cover the engine's cache) or startup_empty."}, []string{"result"}),
		partial:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvdir_agent_view_partial", Help: "1 while the directory's view of the worker may miss blocks the engine holds because the last rebuild could not cover its cache, else 0."}),
		resyncs:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_resyncs_total", Help: "Times the worker was cleared in the directory and rebuilt, by reason."}, []string{"reason"}),
		restarts:     prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_engine_restarts_total", Help: "Engine restarts detected (sequence going backwards)."}),
		batches:      prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_batches_published_total", Help: "Event batches handed to the directory publisher."}),
		dropped:      prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_batches_dropped_total", Help: "Batches dropped because the directory publisher's queue was full."}),
		registers:    prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_registrations_total", Help: "Successful worker registrations."}),
		refusals:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_publisher_stops_total", Help: "Directory publisher stops, by status."}, []string{"status"}),
		duplicates:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_duplicate_messages_total", Help: "Engine messages dropped as already processed."}),
		decodeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_decode_errors_total", Help: "Engine messages that could not be decoded or framed."}),
		malformed:    prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_skipped_engine_events_total", Help: "Engine events the decoder skipped (malformed or of unknown type)."}),
		heartbeats:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_heartbeats_total", Help: "Heartbeats, by result."}, []string{"result"}),
		oversized:    prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_zmtp_oversized_total", Help: "ZMQ connections to the engine (events or replay) closed because the peer declared a message over --kv-events-max-message-bytes."}),
		engineDowns:  prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_agent_engine_down_total", Help: "Times the engine's metrics endpoint stopped answering for --engine-down-after and the worker was deregistered until it answers again."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvdir_agent_publish_lag_seconds", Help: "Time from receiving the oldest event of a batch to handing the batch to the publisher.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	for _, c := range []prometheus.Collector{m.gaps, m.replays, m.rebuilds, m.partial, m.resyncs, m.restarts, m.batches, m.dropped,
		m.registers, m.refusals, m.duplicates, m.decodeErrors, m.malformed, m.heartbeats, m.lag, m.oversized, m.engineDowns} {
		f(c)
	}
	f(&translatorCollector{
		a:        a,
		events:   prometheus.NewDesc("kvdir_agent_events_decoded_total", "Engine events decoded, by kind.", []string{"kind"}, nil),
		stored:   prometheus.NewDesc("kvdir_agent_blocks_stored_total", "Blocks published as stored.", nil, nil),
		removed:  prometheus.NewDesc("kvdir_agent_blocks_removed_total", "Blocks published as removed.", nil, nil),
		problems: prometheus.NewDesc("kvdir_agent_problems_total", "Engine event data skipped (or, for block_size_mismatch, indexed under a block size other than --block-size), by kind.", []string{"kind"}, nil),
		entries:  prometheus.NewDesc("kvdir_agent_map_entries", "Entries in the engine-hash to content-hash map.", nil, nil),
		clears:   prometheus.NewDesc("kvdir_agent_engine_clears_total", "AllBlocksCleared events from the engine.", nil, nil),
	})
	f(collectors.NewGoCollector())
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Gatherer returns the agent's metrics, for a process serving several
// agents on one /metrics.
func (a *Agent) Gatherer() prometheus.Gatherer { return a.m.reg }

// Healthy reports what /healthz reports.
func (a *Agent) Healthy() bool { return a.healthy.Load() }
