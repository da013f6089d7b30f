package raftfsm

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Metrics are the state machine's Prometheus metrics. A nil *Metrics
// records nothing.
type Metrics struct {
	applyLatency *prometheus.HistogramVec
	eventsTotal  *prometheus.CounterVec
	quotaDrops   *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		applyLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvdir_fsm_apply_seconds",
			Help:    "Time to apply one command to the state machine, by command type.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		}, []string{"command"}),
		eventsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvdir_fsm_events_applied_total",
			Help: "Block events applied to the index, by kind (stored and removed count blocks; cleared and layout count events).",
		}, []string{"kind"}),
		quotaDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvdir_fsm_quota_dropped_blocks_total",
			Help: "Stored blocks not kept because their worker was at its block quota, by worker (only workers that reached it have a series).",
		}, []string{"worker"}),
	}
	reg.MustRegister(m.applyLatency, m.eventsTotal, m.quotaDrops)
	return m
}

func (m *Metrics) applied(t kvdirv1.CommandType, d time.Duration) {
	if m != nil {
		m.applyLatency.WithLabelValues(commandName(t)).Observe(d.Seconds())
	}
}

func (m *Metrics) events(kind string, n int) {
	if m != nil {
		m.eventsTotal.WithLabelValues(kind).Add(float64(n))
	}
}

func (m *Metrics) quotaDropped(worker string, n uint64) {
	if m != nil {
		m.quotaDrops.WithLabelValues(worker).Add(float64(n))
	}
}

// commandName is the command type's short lower-case name.
func commandName(t kvdirv1.CommandType) string {
	const prefix = len("COMMAND_TYPE_")
	if n, ok := kvdirv1.CommandType_name[int32(t)]; ok && len(n) > prefix {
		return strings.ToLower(n[prefix:])
	}
	return "unknown"
}
