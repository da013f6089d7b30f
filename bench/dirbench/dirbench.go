// Package dirbench measures a directory cluster of three real processes on
// loopback (BoltDB on disk): block events committed through Raft per second
// by publishers emulating 64 workers, publish-to-commit latency, match
// latency over gRPC against a follower, snapshot time and size, and how long
// a restarted follower takes to catch up (kvbench directory, make
// bench-directory).
//
// The run, in order: build cmd/directory and start three nodes
// (dircluster); publish the index benchmark's shape as fast as it is
// acknowledged (publish.go); churn the last pieces at a steady rate to time
// commit latency (paced.go); wait for the nodes to agree (cluster.go); time
// matches against a follower with a health check as the baseline
// (match.go); snapshot the leader; kill and restart a follower
// (cluster.go).
package dirbench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Tool is the name the results carry.
const Tool = "directory"

// Nodes is the cluster's size.
const Nodes = 3

// Options shape a run. A zero field means its default (see Defaults); Log
// may be nil.
type Options struct {
	// Scale is the fraction of the full shape's 10 M entries to publish.
	Scale float64
	// BatchBlocks is the most blocks in one published batch.
	BatchBlocks int
	// Inflight is the batches in flight per worker stream.
	Inflight int
	// ConnPerWorker gives each worker of a pool comparison its own
	// connection, as each agent has one, instead of one shared by all.
	ConnPerWorker bool
	// Matches is the match queries timed against a follower.
	Matches int
	// ChainBlocks is the length of the matched chains, in blocks.
	ChainBlocks int
	// LatencyRate is the block events per second offered while commit
	// latency is measured, for LatencyFor.
	LatencyRate int
	LatencyFor  time.Duration
	// NodeFlags are extra flags for every directory process.
	NodeFlags []string
	// ProfileDir, if set, makes the pool comparison take a CPU profile of
	// every node while each pool publishes (the nodes run with --pprof),
	// for ProfileFor from the publish's start, into
	// ProfileDir/ROUND-POOL-TRY-NODE.pprof.
	ProfileDir string
	ProfileFor time.Duration
	// Rounds is how many times RunRaftTLS runs each transport (default
	// DefaultRounds).
	Rounds int
	// Dir holds the binary and the nodes' data; empty: a temporary
	// directory, removed after.
	Dir string
	// Logs prints the nodes' logs at the end (they are printed on a failure
	// anyway).
	Logs bool
	Log  *slog.Logger
}

// Defaults are the options of the committed figures.
var Defaults = Options{Scale: 1, BatchBlocks: 2048, Inflight: 16, Matches: 5000, ChainBlocks: 2048,
	LatencyRate: 1_000_000, LatencyFor: 10 * time.Second, ProfileFor: 2 * time.Second}

func (o Options) withDefaults() Options {
	d := o
	benchopt.Default(&d.Scale, Defaults.Scale)
	benchopt.Default(&d.BatchBlocks, Defaults.BatchBlocks)
	benchopt.Default(&d.Inflight, Defaults.Inflight)
	benchopt.Default(&d.Matches, Defaults.Matches)
	benchopt.Default(&d.ChainBlocks, Defaults.ChainBlocks)
	benchopt.Default(&d.LatencyRate, Defaults.LatencyRate)
	benchopt.Default(&d.LatencyFor, Defaults.LatencyFor)
	benchopt.Default(&d.ProfileFor, Defaults.ProfileFor)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// Details are the envelope's details: what was published, and how.
type Details struct {
	Nodes          int   `json:"nodes"`
	Workers        int   `json:"workers"`
	Entries        int64 `json:"entries"`
	Events         int64 `json:"events"`
	Batches        int   `json:"batches"`
	BatchBlocks    int   `json:"batch_blocks"`
	InflightPerWkr int   `json:"inflight_per_worker"`
	MatchChain     int   `json:"match_chain_blocks"`
	// DigestsAgree is whether every node had the same state digest at the
	// same applied index before the matches.
	DigestsAgree bool `json:"digests_agree"`
}

// Measures are a run's numbers as the tool measured them: the details of
// the run and its figures; their JSON names are the detail and figure
// names.
type Measures struct {
	Details
	EventsPerSec     float64 `json:"events_per_sec"`
	BurstCommitP99ms float64 `json:"burst_commit_p99_ms"`
	LatencyRate      float64 `json:"latency_phase_events_per_sec"`
	CommitP50ms      float64 `json:"publish_commit_p50_ms"`
	CommitP99ms      float64 `json:"publish_commit_p99_ms"`
	HealthP50us      float64 `json:"rpc_baseline_p50_us"`
	HealthP99us      float64 `json:"rpc_baseline_p99_us"`
	MatchP50us       float64 `json:"match_p50_us"`
	MatchP99us       float64 `json:"match_p99_us"`
	SnapshotSeconds  float64 `json:"snapshot_seconds"`
	SnapshotBytes    int64   `json:"snapshot_bytes"`
	RestartCatchupS  float64 `json:"restart_catchup_seconds"`
}

// Results fills res (from benchjson.New) with m's figures and details.
func (m *Measures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "events_per_sec", Unit: "events/s", Target: benchjson.Min(1_000_000), Measured: m.EventsPerSec,
			Note: "block events committed through Raft, published as fast as acknowledged"},
		fig{Name: "burst_commit_p99_ms", Unit: "ms", Measured: m.BurstCommitP99ms, Note: "publish-to-acknowledgement of those batches, p99 (queueing)"},
		fig{Name: "latency_phase_events_per_sec", Unit: "events/s", Measured: m.LatencyRate, Note: "rate achieved while commit latency was measured"},
		fig{Name: "publish_commit_p50_ms", Unit: "ms", Measured: m.CommitP50ms, Note: "publish-to-commit at a steady offered rate, p50"},
		fig{Name: "publish_commit_p99_ms", Unit: "ms", Target: benchjson.Max(50), Measured: m.CommitP99ms, Note: "same, p99"},
		fig{Name: "rpc_baseline_p50_us", Unit: "µs", Measured: m.HealthP50us, Note: "a gRPC health check to the same follower, interleaved with the matches, p50"},
		fig{Name: "rpc_baseline_p99_us", Unit: "µs", Measured: m.HealthP99us, Note: "same, p99"},
		fig{Name: "match_p50_us", Unit: "µs", Measured: m.MatchP50us, Note: fmt.Sprintf("Match of a %d-block chain over gRPC against a follower, p50", m.MatchChain)},
		fig{Name: "match_p99_us", Unit: "µs", Target: benchjson.Max(500), Measured: m.MatchP99us, Note: "same, p99"},
		fig{Name: "snapshot_seconds", Unit: "s", Measured: m.SnapshotSeconds, Note: "an admin snapshot of the leader"},
		fig{Name: "snapshot_bytes", Unit: "B", Measured: float64(m.SnapshotBytes), Note: "its size on disk"},
		fig{Name: "restart_catchup_seconds", Unit: "s", Measured: m.RestartCatchupS, Note: "a follower killed and restarted, until it applied what the leader had committed"},
	)
	return res.SetDetails(m.Details)
}

// Run starts the cluster, measures and returns the results (without their
// command, which the caller knows). Every process it starts is stopped
// before it returns.
func Run(ctx context.Context, opts Options) (*benchjson.Results, error) {
	return benchjson.Measure(Tool, func() (*Measures, error) { return measure(ctx, opts.withDefaults()) })
}

func measure(ctx context.Context, cfg Options) (res *Measures, err error) {
	log := cfg.Log
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvdir-dirbench-"); err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	c, err := StartDirectory(dir, cfg.NodeFlags)
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
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for a leader: %w", err)
	}
	log.Info("cluster up", "leader", c.Nodes[leader].ID)

	res = &Measures{Details: Details{Nodes: Nodes, BatchBlocks: cfg.BatchBlocks, InflightPerWkr: cfg.Inflight, MatchChain: cfg.ChainBlocks}}
	wl := radixtest.Generate(radixtest.Full.Scaled(cfg.Scale))
	res.Workers = wl.Shape.Workers
	work := Batches(wl, cfg.BatchBlocks)
	for _, b := range work {
		res.Batches += len(b)
	}
	if err := PublishAll(ctx, c.Nodes[leader], work, cfg.Inflight, res); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	log.Info("published", "events", res.Events, "events_per_sec", res.EventsPerSec, "burst_commit_p99_ms", res.BurstCommitP99ms)
	if err := pacedLatency(ctx, c.Nodes[leader], work, cfg.LatencyRate, cfg.LatencyFor, res); err != nil {
		return nil, fmt.Errorf("commit latency: %w", err)
	}
	log.Info("commit latency at a steady rate", "events_per_sec", res.LatencyRate, "p50_ms", res.CommitP50ms, "p99_ms", res.CommitP99ms)

	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	res.DigestsAgree = true
	st, err := c.Nodes[leader].Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("leader status: %w", err)
	}
	res.Entries = int64(st.Counters.Entries)

	follower := (leader + 1) % Nodes
	if res.MatchP50us, res.MatchP99us, res.HealthP50us, res.HealthP99us, err = timeMatches(ctx, c.Nodes[follower], wl, cfg.ChainBlocks, cfg.Matches); err != nil {
		return nil, fmt.Errorf("matches against %s: %w", c.Nodes[follower].ID, err)
	}
	log.Info("match against a follower", "p50_us", res.MatchP50us, "p99_us", res.MatchP99us,
		"baseline_p50_us", res.HealthP50us, "baseline_p99_us", res.HealthP99us)

	start := time.Now()
	snap, err := kvdirv1.NewAdminServiceClient(c.Nodes[leader].Conn()).Snapshot(ctx, &kvdirv1.SnapshotRequest{})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	res.SnapshotSeconds = time.Since(start).Seconds()
	res.SnapshotBytes = newestSnapshotSize(filepath.Join(c.Nodes[leader].DataDir, "snapshots"))
	log.Info("snapshot", "index", snap.Index, "seconds", res.SnapshotSeconds, "bytes", res.SnapshotBytes)

	if res.RestartCatchupS, err = restartCatchup(ctx, c, follower); err != nil {
		return nil, fmt.Errorf("restart catch-up: %w", err)
	}
	log.Info("restart catch-up", "seconds", res.RestartCatchupS)
	return res, nil
}

// StartDirectory builds cmd/directory into dir and starts the nodes there.
func StartDirectory(dir string, nodeFlags []string) (*fleet.Directory, error) {
	bins, err := testkit.Build(dir, "directory")
	if err != nil {
		return nil, fmt.Errorf("build the directory: %w", err)
	}
	c, err := fleet.StartDirectory(bins["directory"], dir, Nodes, append([]string{"--lease", "1h", "--log-level", "warn"}, nodeFlags...)...)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	return c, nil
}
