// Package followbench measures a router's local replica of the directory
// (internal/follow) against a directory of three real processes on loopback
// (BoltDB on disk): how long a new replica takes from start to in sync at
// the full index shape (10 M (block, worker) entries), its memory per entry
// next to a state machine that applied every entry as a directory node
// does, and how far its view lags the leader while publishers churn block
// events at a steady rate (kvbench follow, make bench-follow).
//
// The run, in order: build cmd/directory and start three nodes (as
// bench/dirbench does); start a replica that follows a non-leader node from
// the empty state, so that it applies every entry the nodes apply (the
// "live" replica: the node state machine's memory); publish the index
// benchmark's shape as 64 workers, as fast as it is acknowledged; wait for
// the nodes and the live replica to agree; start new replicas of the same
// node one after another and time each from start to Synced (coldstart.go);
// then offer block events at each of a list of rates, and time every
// acknowledged batch from its acknowledgement by the leader until the live
// replica has applied its log entry (lag.go).
package followbench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/bench/dirbench"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
)

// Tool is the name the results carry.
const Tool = "follow"

// Targets the figures are held to.
const (
	TargetColdStartSeconds = 2
	TargetMemoryRatio      = 2
	TargetLagP99ms         = 100
	TargetLagRate          = 1_000_000
)

// Options shape a run. A zero field means its default (see Defaults); Log
// may be nil.
type Options struct {
	// Scale is the fraction of the full shape's 10 M entries to publish.
	Scale float64
	// BatchBlocks is the most blocks in one published batch; Inflight the
	// batches in flight per worker stream while filling.
	BatchBlocks int
	Inflight    int
	// ColdStarts is how many new replicas are timed from start to synced.
	ColdStarts int
	// LagRates are the block events per second offered, one phase each of
	// LagFor, while the live replica's lag is measured.
	LagRates []int
	LagFor   time.Duration
	// CPUProfile, if set, is a file for a CPU profile of the cold starts
	// (this process: the replica's side).
	CPUProfile string
	// NodeFlags are extra flags for every directory process.
	NodeFlags []string
	// Dir holds the binary and the nodes' data; empty: a temporary
	// directory, removed after.
	Dir string
	// Logs prints the nodes' logs at the end (they are printed on a failure
	// anyway).
	Logs bool
	Log  *slog.Logger
}

// Defaults are the options of the committed figures.
var Defaults = Options{Scale: 1, BatchBlocks: 2048, Inflight: 16, ColdStarts: 5,
	LagRates: []int{250_000, 500_000, 1_000_000, 2_000_000}, LagFor: 10 * time.Second}

func (o Options) withDefaults() Options {
	d := o
	benchopt.Default(&d.Scale, Defaults.Scale)
	benchopt.Default(&d.BatchBlocks, Defaults.BatchBlocks)
	benchopt.Default(&d.Inflight, Defaults.Inflight)
	benchopt.Default(&d.ColdStarts, Defaults.ColdStarts)
	benchopt.Default(&d.LagFor, Defaults.LagFor)
	if len(d.LagRates) == 0 {
		d.LagRates = Defaults.LagRates
	}
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// ColdStart is one new replica's start.
type ColdStart struct {
	// Seconds is from creating the replica until it was in sync.
	Seconds float64 `json:"seconds"`
	// WaitSeconds, ReceiveSeconds and ApplySeconds split the restore as
	// follow.RestoreStats does: until the first snapshot chunk (the node
	// encoding its state), the transfer, and the restore after the last
	// chunk.
	WaitSeconds    float64 `json:"wait_seconds"`
	ReceiveSeconds float64 `json:"receive_seconds"`
	ApplySeconds   float64 `json:"apply_seconds"`
	SnapshotBytes  int64   `json:"snapshot_bytes"`
	// HeapBytes is the live heap the replica added (after GC).
	HeapBytes int64 `json:"heap_bytes"`
}

// LagPhase is one offered rate's lag.
type LagPhase struct {
	OfferedPerSec  float64 `json:"offered_events_per_sec"`
	AchievedPerSec float64 `json:"achieved_events_per_sec"`
	// Sustained is whether the directory acknowledged at least 95 % of the
	// offered rate.
	Sustained bool  `json:"sustained"`
	Batches   int   `json:"batches"`
	Events    int64 `json:"events"`
	// Commit is publish to the leader's acknowledgement.
	CommitP50ms float64 `json:"commit_p50_ms"`
	CommitP99ms float64 `json:"commit_p99_ms"`
	// Lag is the leader's acknowledgement to the replica having applied
	// the batch's log entry.
	LagP50ms float64 `json:"lag_p50_ms"`
	LagP99ms float64 `json:"lag_p99_ms"`
	LagMaxms float64 `json:"lag_max_ms"`
	// PublishToReplica is publish to the replica having applied it.
	PublishToReplicaP99ms float64 `json:"publish_to_replica_p99_ms"`
	// LagEntries is the leader's commit index minus the replica's applied
	// index, sampled every LagSampleEvery.
	LagEntriesP50 float64 `json:"lag_entries_p50"`
	LagEntriesP99 float64 `json:"lag_entries_p99"`
	LagEntriesMax float64 `json:"lag_entries_max"`
	// BatchesPerEntry is the acknowledged batches per log entry the leader
	// wrote (it groups batches from all streams).
	BatchesPerEntry float64 `json:"batches_per_entry"`
	// NodeSnapshots is how many nodes took a Raft snapshot during the
	// phase (applies wait while a node captures its state).
	NodeSnapshots int `json:"node_snapshots"`
}

// Details are the envelope's details.
type Details struct {
	Nodes       int   `json:"nodes"`
	Workers     int   `json:"workers"`
	Entries     int64 `json:"entries"`
	Blocks      int64 `json:"distinct_blocks"`
	FillEvents  int64 `json:"fill_events"`
	BatchBlocks int   `json:"batch_blocks"`
	// FollowsLeader is false: the replicas follow a non-leader node, as a
	// router does that lists the nodes in another order.
	FollowsLeader bool `json:"follows_leader"`
	// LiveSnapshots is how many snapshots the live replica restored (1
	// when it applied every entry after the empty state).
	LiveSnapshots uint64      `json:"live_replica_snapshots"`
	ColdStarts    []ColdStart `json:"cold_starts"`
	LagPhases     []LagPhase  `json:"lag_phases"`
	// NodeHeapInuseBytes and NodeRSSBytes are the followed node process's
	// go_memstats_heap_inuse_bytes and process_resident_memory_bytes after
	// the fill (its Raft log cache and follow feed included).
	NodeHeapInuseBytes float64 `json:"node_heap_inuse_bytes"`
	NodeRSSBytes       float64 `json:"node_rss_bytes"`
	// ApproxBytesPerEntry is the index's own size estimate per entry.
	ApproxBytesPerEntry float64 `json:"index_approx_bytes_per_entry"`
	Method              string  `json:"method"`
}

// Measures are a run's numbers; their JSON names are the detail and figure
// names.
type Measures struct {
	Details
	FillEventsPerSec     float64 `json:"fill_events_per_sec"`
	ColdStartSeconds     float64 `json:"cold_start_seconds"`
	ColdStartMaxSeconds  float64 `json:"cold_start_max_seconds"`
	SnapshotBytes        int64   `json:"snapshot_bytes"`
	NodeBytesPerEntry    float64 `json:"node_fsm_bytes_per_entry"`
	ReplicaBytesPerEntry float64 `json:"replica_bytes_per_entry"`
	MemoryRatio          float64 `json:"replica_memory_ratio"`
	LagRate              float64 `json:"lag_events_per_sec"`
	LagP50ms             float64 `json:"view_lag_p50_ms"`
	LagP99ms             float64 `json:"view_lag_p99_ms"`
	LagEntriesP99        float64 `json:"view_lag_entries_p99"`
	MaxSustainedPerSec   float64 `json:"max_sustained_events_per_sec"`
}

// Results fills res (from benchjson.New) with m's figures and details.
func (m *Measures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "cold_start_seconds", Unit: "s", Target: benchjson.Max(TargetColdStartSeconds), Measured: m.ColdStartSeconds,
			Note: fmt.Sprintf("a new replica from start until in sync, median of %d", len(m.ColdStarts))},
		fig{Name: "cold_start_max_seconds", Unit: "s", Measured: m.ColdStartMaxSeconds, Note: "the slowest of them"},
		fig{Name: "snapshot_bytes", Unit: "B", Measured: float64(m.SnapshotBytes), Note: "the state snapshot the node streamed"},
		fig{Name: "fill_events_per_sec", Unit: "events/s", Measured: m.FillEventsPerSec, Note: "block events committed while filling the directory"},
		fig{Name: "node_fsm_bytes_per_entry", Unit: "B", Measured: m.NodeBytesPerEntry,
			Note: "heap of a state machine that applied every entry, as a node's, per (block, worker) entry"},
		fig{Name: "replica_bytes_per_entry", Unit: "B", Measured: m.ReplicaBytesPerEntry,
			Note: "heap a new replica added, restored from the snapshot, per entry (median)"},
		fig{Name: "replica_memory_ratio", Unit: "x", Target: benchjson.Max(TargetMemoryRatio), Measured: m.MemoryRatio,
			Note: "the larger of the two replicas' bytes per entry over the node state machine's"},
		fig{Name: "lag_events_per_sec", Unit: "events/s", Measured: m.LagRate, Note: "block events acknowledged in the lag phase the view lag figures are from"},
		fig{Name: "view_lag_p50_ms", Unit: "ms", Measured: m.LagP50ms, Note: "leader's acknowledgement of a batch until the replica applied it, p50"},
		fig{Name: "view_lag_p99_ms", Unit: "ms", Target: benchjson.Max(TargetLagP99ms), Measured: m.LagP99ms, Note: "same, p99"},
		fig{Name: "view_lag_entries_p99", Unit: "entries", Measured: m.LagEntriesP99, Note: "leader commit index minus replica applied index, sampled, p99"},
		fig{Name: "max_sustained_events_per_sec", Unit: "events/s", Measured: m.MaxSustainedPerSec,
			Note: "the highest rate acknowledged in a lag phase that kept up with its offered rate"},
	)
	return res.SetDetails(m.Details)
}

// Run starts the directory, measures and returns the results (without
// their command, which the caller knows). Every process it starts is
// stopped before it returns.
func Run(ctx context.Context, opts Options) (*benchjson.Results, error) {
	for _, r := range opts.LagRates {
		if r <= 0 {
			return nil, fmt.Errorf("lag rate %d: want a positive number of block events per second", r)
		}
	}
	return benchjson.Measure(Tool, func() (*Measures, error) { return measure(ctx, opts.withDefaults()) })
}

const method = "three cmd/directory processes on loopback; replicas (internal/follow, in the benchmark process) follow a non-leader node; " +
	"memory is the live heap after GC before and after a replica, divided by the index's (block, worker) entries; " +
	"lag is timed per acknowledged batch, from the leader's acknowledgement (which carries the batch's log index) until the live replica's applied index reached it"

func measure(ctx context.Context, cfg Options) (res *Measures, err error) {
	log := cfg.Log
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvdir-followbench-"); err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	c, err := dirbench.StartDirectory(dir, cfg.NodeFlags)
	if err != nil {
		return nil, err
	}
	defer func() {
		c.Stop()
		if cfg.Logs || err != nil {
			for _, n := range c.Nodes {
				fmt.Fprintf(os.Stderr, "---- %s\n%s\n", n.ID, n.Tail(40))
			}
		}
	}()
	li, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for a leader: %w", err)
	}
	leader, node := c.Nodes[li], c.Nodes[(li+1)%len(c.Nodes)]
	log.Info("cluster up", "leader", leader.ID, "followed", node.ID)
	res = &Measures{Details: Details{Nodes: len(c.Nodes), BatchBlocks: cfg.BatchBlocks, Method: method}}

	wl := radixtest.Generate(radixtest.Full.Scaled(cfg.Scale))
	res.Workers = wl.Shape.Workers
	work := dirbench.Batches(wl, cfg.BatchBlocks)
	base := liveHeap()

	live, err := startReplica(ctx, node.API, nil)
	if err != nil {
		return nil, fmt.Errorf("live replica: %w", err)
	}
	defer live.stop()
	var fill dirbench.Measures
	if err := dirbench.PublishAll(ctx, leader, work, cfg.Inflight, &fill); err != nil {
		return nil, fmt.Errorf("fill: %w", err)
	}
	res.FillEvents, res.FillEventsPerSec = fill.Events, fill.EventsPerSec
	log.Info("filled", "events", fill.Events, "events_per_sec", fill.EventsPerSec)
	if err := dirbench.Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	st, err := node.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", node.ID, err)
	}
	if err := live.caughtUp(ctx, st.AppliedIndex, st.Digest, time.Minute); err != nil {
		return nil, fmt.Errorf("live replica: %w", err)
	}
	res.Entries, res.Blocks = int64(st.Counters.Entries), int64(st.Counters.Blocks)
	if res.Entries == 0 {
		return nil, fmt.Errorf("the directory holds no entries after the fill")
	}
	res.LiveSnapshots = live.f.Snapshots()
	res.NodeBytesPerEntry = float64(liveHeap()-base) / float64(res.Entries)
	res.ApproxBytesPerEntry = float64(live.f.FSM().Counters().ApproxBytes) / float64(res.Entries)
	res.NodeHeapInuseBytes, res.NodeRSSBytes = nodeMemory(node.HTTP)
	log.Info("live replica in sync", "entries", res.Entries, "bytes_per_entry", res.NodeBytesPerEntry, "snapshots", res.LiveSnapshots)

	if cfg.CPUProfile != "" {
		pf, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			pf.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		defer pf.Close()
		defer pprof.StopCPUProfile()
	}
	if err := coldStarts(ctx, node.API, cfg.ColdStarts, res, log); err != nil {
		return nil, err
	}
	if cfg.CPUProfile != "" {
		pprof.StopCPUProfile()
	}

	if err := lagPhases(ctx, c, leader, live, work, cfg.LagRates, cfg.LagFor, res, log); err != nil {
		return nil, err
	}
	return res, nil
}

// liveHeap is the live heap after a full collection.
func liveHeap() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
