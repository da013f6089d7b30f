package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// metrics are the node's Prometheus metrics (the state machine registers
// its own: kvdir_fsm_*).
type metrics struct {
	reg           prometheus.Registerer
	commitLatency *prometheus.HistogramVec
	publishes     *prometheus.CounterVec
	groupSize     prometheus.Histogram
	matchLatency  prometheus.Histogram
	matchDepth    prometheus.Histogram
	rpcs          *prometheus.CounterVec
	rpcLatency    *prometheus.HistogramVec

	intentsReceived *prometheus.CounterVec
	intentsSent     *prometheus.CounterVec
	intentsDropped  *prometheus.CounterVec

	streamRefusals *prometheus.CounterVec
	loadsClamped   prometheus.Counter
	refusedIDs     prometheus.Counter
	memReturns     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		reg: reg,
		commitLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvdir_raft_commit_seconds",
			Help:    "Time from proposing a command on the leader to its being applied, by command.",
			Buckets: prometheus.ExponentialBuckets(1e-4, 2, 16),
		}, []string{"command"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvdir_publish_batches_total",
			Help: "Event batches answered on this node, by outcome.",
		}, []string{"status"}),
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvdir_publish_group_batches",
			Help:    "Event batches committed together in one Raft entry by the leader.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		matchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvdir_match_seconds",
			Help:    "Time to serve a Match on this node, hashing included.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20),
		}),
		matchDepth: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvdir_match_depth_blocks",
			Help:    "Deepest match of each Match request, in blocks.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 16),
		}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvdir_grpc_server_handled_total",
			Help: "gRPC calls completed on this node, by method and status code.",
		}, []string{"method", "code"}),
		rpcLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvdir_grpc_server_handling_seconds",
			Help:    "Time to handle a gRPC call (streams: their whole life), by method.",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 12),
		}, []string{"method"}),
	}
	m.intentsReceived = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvdir_intents_received_total",
		Help: "Placement intents received, from this node's routers (router) or relayed by another node (relay).",
	}, []string{"source"})
	m.intentsSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvdir_intents_sent_total",
		Help: "Placement intents sent, to this node's routers (router) or relayed to another node (node).",
	}, []string{"to"})
	m.intentsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvdir_intents_dropped_total",
		Help: "Placement intents not kept: over the node's bounds (bound, the oldest dropped) or older than the version held (stale).",
	}, []string{"reason"})
	m.streamRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvdir_stream_limit_refusals_total",
		Help: "Streams refused because their credential or role held its limit on this node, by method and holder: WatchWorkers, Follow and Share over --max-streams-per-credential, an agent credential's Publish over 4 per worker of --max-workers-per-credential.",
	}, []string{"method", "holder"})
	m.loadsClamped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvdir_heartbeat_loads_clamped_total",
		Help: "Heartbeats whose load held a non-finite or negative KV-cache usage, recorded as 0 (NaN, negative) or 1 (+Inf).",
	})
	m.refusedIDs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvdir_register_invalid_total",
		Help: "Registrations refused before proposing: a worker id, model, address or label with control characters, non-printable runes or invalid UTF-8, or a spec past the directory's size and range limits.",
	})
	m.memReturns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvdir_memory_returns_total",
		Help: "Times the node collected and returned its freed memory to the operating system at the end of a burst of applied entries (internal/memreturn).",
	})
	reg.MustRegister(m.commitLatency, m.publishes, m.groupSize, m.matchLatency, m.matchDepth, m.rpcs, m.rpcLatency,
		m.intentsReceived, m.intentsSent, m.intentsDropped, m.streamRefusals, m.loadsClamped, m.refusedIDs, m.memReturns)
	return m
}

// streamRefused counts a stream refused over the per-credential limit.
func (m *metrics) streamRefused(method, holder string) {
	m.streamRefusals.WithLabelValues(method, holder).Inc()
}

// intentDropped counts placement intents the node did not keep.
func (m *metrics) intentDropped(reason string, n int) {
	m.intentsDropped.WithLabelValues(reason).Add(float64(n))
}

// watchNode registers gauges read from the node at scrape time.
func (m *metrics) watchNode(n *Node) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	stat := func(key string) func() float64 {
		return func() float64 { return float64(parseUint(n.raft.Stats()[key])) }
	}
	m.reg.MustRegister(
		gauge("kvdir_raft_leader", "1 if this node is the Raft leader.", func() float64 {
			if n.IsLeader() {
				return 1
			}
			return 0
		}),
		gauge("kvdir_raft_state", "Raft state: 0 follower, 1 candidate, 2 leader, 3 shutdown.", func() float64 {
			return float64(n.raft.State())
		}),
		gauge("kvdir_raft_term", "Current Raft term.", stat("term")),
		gauge("kvdir_raft_commit_index", "Raft commit index.", func() float64 { return float64(n.raft.CommitIndex()) }),
		gauge("kvdir_raft_applied_index", "Last log index applied to the state machine.", func() float64 {
			return float64(n.fsm.AppliedIndex())
		}),
		gauge("kvdir_raft_last_log_index", "Last index in the Raft log.", func() float64 { return float64(n.raft.LastIndex()) }),
		gauge("kvdir_raft_last_snapshot_index", "Index of the last Raft snapshot.", stat("last_snapshot_index")),
		gauge("kvdir_raft_last_contact_seconds", "Time since this follower last heard from the leader.", func() float64 {
			if n.IsLeader() || n.raft.LastContact().IsZero() {
				return 0
			}
			return time.Since(n.raft.LastContact()).Seconds()
		}),
		gauge("kvdir_index_entries", "(block, worker) entries in the index.", func() float64 {
			return float64(n.fsm.Counters().Entries)
		}),
		gauge("kvdir_index_blocks", "Distinct blocks some worker holds.", func() float64 {
			return float64(n.fsm.Counters().Blocks)
		}),
		gauge("kvdir_index_bytes", "Approximate memory of the index, in bytes.", func() float64 {
			return float64(n.fsm.Counters().ApproxBytes)
		}),
		gauge("kvdir_index_orphan_blocks", "Blocks of out-of-order pieces waiting for their parent.", func() float64 {
			return float64(n.fsm.Counters().OrphanBlocks)
		}),
		gauge("kvdir_sessions", "Sessions recorded.", func() float64 { return float64(n.fsm.Counters().Sessions) }),
		gauge("kvdir_intents", "Placement intents held (soft state, every router's).", func() float64 { return float64(n.share.intents.len()) }),
		gauge("kvdir_share_routers", "Routers connected to this node's Share stream.", func() float64 { return float64(n.share.routerCount()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvdir_write_failing", Help: "1 while writes on this node are failing (e.g. its disk)."},
			func() float64 {
				if n.writeErr.get() != nil {
					return 1
				}
				return 0
			}),
		&workersByState{n: n, desc: prometheus.NewDesc("kvdir_workers", "Workers by state.", []string{"state"}, nil)},
	)
}

// workersByState collects the number of workers in each state.
type workersByState struct {
	n    *Node
	desc *prometheus.Desc
}

func (c *workersByState) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *workersByState) Collect(ch chan<- prometheus.Metric) {
	counts := map[kvdirv1.WorkerState]int{}
	for _, w := range c.n.fsm.Workers("", true) {
		counts[w.State]++
	}
	for _, s := range []kvdirv1.WorkerState{
		kvdirv1.WorkerState_WORKER_STATE_ACTIVE, kvdirv1.WorkerState_WORKER_STATE_DRAINING,
		kvdirv1.WorkerState_WORKER_STATE_EXPIRED, kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED,
	} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), stateLabel(s))
	}
}

func stateLabel(s kvdirv1.WorkerState) string {
	const prefix = len("WORKER_STATE_")
	return kvdirv1.WorkerState_name[int32(s)][prefix:]
}

func (m *metrics) publish(r *kvdirv1.PublishResponse) {
	const prefix = len("PUBLISH_STATUS_")
	name := kvdirv1.PublishStatus_name[int32(r.Status)]
	if len(name) > prefix {
		name = name[prefix:]
	}
	m.publishes.WithLabelValues(name).Inc()
}

func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	m.rpcs.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	m.rpcLatency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
	return resp, err
}

func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	err := h(srv, ss)
	m.rpcs.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	m.rpcLatency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
	return err
}
