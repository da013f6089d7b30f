package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/replay"
	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

func newLeaderKill(log *slog.Logger) *cobra.Command {
	var f replayFlags
	var killAt float64
	var window, restartAfter time.Duration
	cmd := measureCommand(&cobra.Command{
		Use:   "leader-kill",
		Short: "Kill the directory leader during a live replay with routers following the log: fallbacks and hit rate around the kill",
		Long: `Starts a fleet (3 directory nodes, --replicas engine simulators with their agents) and
replays the trace twice under the kvdir policy through --routers routers started with
--follow-log, resetting the engines' caches before each run. In the second run the Raft
leader is killed with SIGKILL once --kill-at of the requests have completed, and started
again --restart-after later. Records the routers' fallbacks to hashing during that run and
the hit rate (the engines' cached_tokens over prompt tokens) of the requests arriving in
the --window of trace time around the kill, next to the first run's over the same window.`,
		Example: `  kvbench leader-kill --trace bench/testdata/demo-sessions.jsonl --replicas 4 --profile llama3-70b --routers 2`,
	}, replay.LeaderKillTool, log, func(ctx context.Context) (*benchjson.Results, error) {
		if f.trace == "" {
			return nil, cli.Usagef("--trace is required")
		}
		recs, err := workload.ReadFile(f.trace, f.traceBlockSize)
		if err != nil {
			return nil, err
		}
		workload.SortByTime(recs)
		if f.limit > 0 && f.limit < len(recs) {
			recs = recs[:f.limit]
		}
		prof, err := costmodel.ResolveProfile(f.profile)
		if err != nil {
			return nil, cli.Usagef("--profile: %w", err)
		}
		if f.kvBlocks == 0 {
			a, ok := sim.DefaultKVBlocks(prof.Name, simengine.DefaultBlockSize)
			if !ok {
				return nil, fmt.Errorf("profile %q has no default KV size; set --kv-blocks", prof.Name)
			}
			f.kvBlocks = a.Blocks
		}
		if f.timeScale <= 0 || f.timeScale > 10 {
			return nil, cli.Usagef("--time-scale %v: want a value in (0, 10]", f.timeScale)
		}
		if killAt <= 0 || killAt >= 1 {
			return nil, cli.Usagef("--kill-at %v: want a fraction in (0, 1)", killAt)
		}
		dir := f.dir
		if dir == "" {
			d, err := os.MkdirTemp("", "kvbench-leader-kill-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(d)
			dir = d
		} else if dir, err = filepath.Abs(dir); err != nil {
			return nil, err
		}
		return replay.LeaderKill(ctx, replay.LeaderKillOptions{Trace: f.trace, Records: recs, TraceBlockSize: f.traceBlockSize,
			Replicas: f.replicasOr(4), Profile: f.profile, KVBlocks: f.kvBlocks, TimeScale: f.timeScale, Model: f.model,
			Routers: f.routers, RouterArgs: []string{"--match-timeout", f.matchTimeout, "--profile", f.profile},
			KillAt: killAt, Window: window, RestartAfter: restartAfter, Dir: dir, Log: log})
	})
	fl := cmd.Flags()
	addReplayFlags(fl, &f)
	fl.StringVar(&f.trace, "trace", "", "trace file, Mooncake format (JSON Lines); required")
	fl.IntVar(&f.replicas, "replicas", 4, "engine simulators (each with its agent)")
	fl.IntVar(&f.routers, "routers", 2, "routers following the log (requests alternate between them)")
	fl.Float64Var(&killAt, "kill-at", 0.5, "fraction of the requests completed when the leader is killed")
	fl.DurationVar(&window, "window", time.Minute, "trace time around the kill whose hit rate is compared (half before, half after)")
	fl.DurationVar(&restartAfter, "restart-after", 5*time.Second, "wall time after the kill at which the killed node starts again")
	return cmd
}
