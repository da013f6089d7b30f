package main

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

// clusterFlags are the flags sim and sweep share: the trace, the cluster of
// simulated engines, the policies and where the results go.
type clusterFlags struct {
	trace, profile, policies, out string
	replicas, kvBlocks            int
	kvRatio                       float64
	traceBlockSize, blockSize     int
	maxBatched, maxRunning        int
	seed                          int64
	eventLag, specTTL             time.Duration
	specFixed                     bool
	parallel                      int
	noCharts                      bool
}

// register defines the flags on fl with the command's default policies and
// parallelism.
func (f *clusterFlags) register(fl *pflag.FlagSet, policies string, parallel int) {
	fl.StringVar(&f.trace, "trace", "", "trace file, Mooncake format (JSON Lines); required")
	fl.IntVar(&f.replicas, "replicas", 8, "engine replicas")
	fl.StringVar(&f.profile, "profile", "llama3-70b", "engine timing profile: a built-in name ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON file")
	fl.IntVar(&f.kvBlocks, "kv-blocks", 0, "KV-cache blocks per replica (0: what the profile's model leaves on one H200, or --kv-ratio)")
	fl.Float64Var(&f.kvRatio, "kv-ratio", 0, "instead of --kv-blocks: size each replica's KV so the cluster's is this many times the trace's hot working set")
	fl.StringVar(&f.policies, "policies", policies, "comma-separated policies, or all ("+strings.Join(placement.Names(), ", ")+")")
	fl.Int64Var(&f.seed, "seed", 1, "seed of the policies' random choices and the engines")
	fl.StringVarP(&f.out, "out", "o", "", "result JSON file (.md and charts are written next to it); empty: print the table only")
	fl.IntVar(&f.traceBlockSize, "trace-block-size", workload.DefaultBlockSize, "tokens per hash id in the trace")
	fl.IntVar(&f.blockSize, "block-size", simengine.DefaultBlockSize, "engine KV block size in tokens")
	fl.IntVar(&f.maxBatched, "max-batched-tokens", simengine.DefaultMaxBatchedTokens, "engine token budget per step (chunked prefill)")
	fl.IntVar(&f.maxRunning, "max-running", simengine.DefaultMaxRunning, "engine's most running requests")
	fl.DurationVar(&f.eventLag, "event-lag", 0, "delay before a step's KV events reach the directory view (0: visible right after the step)")
	fl.DurationVar(&f.specTTL, "speculative-ttl", sim.DefaultSpeculativeTTL, "how long a placement counts as holding its prefix (negative: off)")
	fl.BoolVar(&f.specFixed, "speculative-fixed-ttl", false, "what-if: end a speculative entry the TTL after the placement (default, as the router: hold it until the request's first token, then for the TTL)")
	fl.IntVar(&f.parallel, "parallel", parallel, "policies simulated at the same time")
	fl.BoolVar(&f.noCharts, "no-charts", false, "do not write PNG charts")
}

// cluster is what clusterFlags resolve to: the profile, the policies, the
// trace in arrival order with its ideal hits, and the KV per replica.
type cluster struct {
	prof     costmodel.Profile
	pols     []string
	recs     []workload.Record
	ideal    []int
	kvBlocks int
}

// load checks the flags, reads the trace and sizes the KV cache.
func (f *clusterFlags) load(log *slog.Logger) (*cluster, error) {
	switch {
	case f.trace == "":
		return nil, cli.Usagef("--trace is required")
	case f.parallel < 1:
		return nil, cli.Usagef("--parallel %d, want >= 1", f.parallel)
	case f.replicas < 1:
		return nil, cli.Usagef("--replicas %d, want >= 1", f.replicas)
	case f.kvBlocks < 0 || f.kvRatio < 0 || math.IsNaN(f.kvRatio) || math.IsInf(f.kvRatio, 0):
		return nil, cli.Usagef("--kv-blocks and --kv-ratio must be >= 0")
	case f.kvBlocks > 0 && f.kvRatio > 0:
		return nil, cli.Usagef("--kv-blocks and --kv-ratio both set; give one")
	case f.blockSize < 1 || f.traceBlockSize < 1:
		return nil, cli.Usagef("--block-size and --trace-block-size must be >= 1")
	}
	prof, err := costmodel.ResolveProfile(f.profile)
	if err != nil {
		return nil, err
	}
	pols, err := parsePolicies(f.policies)
	if err != nil {
		return nil, err
	}
	recs, err := workload.ReadFile(f.trace, f.traceBlockSize)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: no records", f.trace)
	}
	workload.SortByTime(recs)
	c := &cluster{prof: prof, pols: pols, recs: recs, kvBlocks: f.kvBlocks,
		ideal: workload.IdealHits(recs, f.traceBlockSize, f.blockSize)}
	switch {
	case f.kvRatio > 0:
		hot := workload.Summarize(recs, f.traceBlockSize).HotWorkingSetTokens
		if hot == 0 {
			return nil, fmt.Errorf("%s: no hot working set (no block is reused) to size --kv-ratio by; set --kv-blocks", f.trace)
		}
		c.kvBlocks = kvBlocksForRatio(f.kvRatio, hot, f.replicas, f.blockSize)
		log.Info("kv blocks from --kv-ratio", "ratio", f.kvRatio, "hot_working_set_tokens", hot, "kv_blocks", c.kvBlocks)
	case c.kvBlocks == 0:
		a, ok := sim.DefaultKVBlocks(prof.Name, f.blockSize)
		if !ok {
			return nil, fmt.Errorf("profile %q has no default KV size; set --kv-blocks or --kv-ratio", prof.Name)
		}
		c.kvBlocks = a.Blocks
		log.Info("kv blocks from the H200 arithmetic", "arithmetic", a.String())
	}
	return c, nil
}

// kvBlocksForRatio is the KV per replica, in blocks, for which the cluster
// holds ratio times hot tokens (rounded up, at least one block).
func kvBlocksForRatio(ratio float64, hot int64, replicas, blockSize int) int {
	return max(1, int(math.Ceil(ratio*float64(hot)/float64(replicas*blockSize))))
}

// simConfig is the run configuration of the flags and c, without a policy.
func (f *clusterFlags) simConfig(c *cluster, log *slog.Logger) sim.Config {
	return sim.Config{
		Profile: c.prof, Replicas: f.replicas, KVBlocks: c.kvBlocks, BlockSize: f.blockSize,
		MaxBatchedTokens: f.maxBatched, MaxRunning: f.maxRunning, TraceBlockSize: f.traceBlockSize,
		EventLag: f.eventLag, SpeculativeTTL: f.specTTL, SpeculativeFixedTTL: f.specFixed, Seed: f.seed, Logger: log,
	}
}
