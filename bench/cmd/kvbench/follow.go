package main

import (
	"context"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/followbench"
	"github.com/kvdir/kvdir/internal/benchjson"
)

func newFollow(log *slog.Logger) *cobra.Command {
	var (
		o         = followbench.Defaults
		nodeFlags string
	)
	cmd := measureCommand(&cobra.Command{
		Use:   "follow",
		Short: "Measure a router's local replica of the directory: cold start, memory, view lag (make bench-follow)",
		Long: `Starts three directory processes on loopback (BoltDB on disk), fills them with the index
benchmark's shape (10 M (block, worker) entries at --scale 1) as 64 workers, and measures
the replica a router keeps with --follow-log (internal/follow, in this process): how long a
new replica takes from start until it is in sync, its memory per entry next to a state
machine that applied every entry as a node does, and how far its view lags the leader
while block events are offered at each --lag-rates rate. Writes the figures as JSON.`,
		Example: `  kvbench follow --out bench/results/follow.json
  kvbench follow --scale 0.1 --cold-starts 2 --lag-rates 100000 --lag-for 3s --out -`,
	}, followbench.Tool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log, o.NodeFlags = log, strings.Fields(nodeFlags)
		return followbench.Run(ctx, o)
	})
	fl := cmd.Flags()
	fl.Float64Var(&o.Scale, "scale", o.Scale, "fraction of the full shape's 10 M entries to publish")
	fl.IntVar(&o.BatchBlocks, "batch-blocks", o.BatchBlocks, "blocks per published batch (at most) while filling")
	fl.IntVar(&o.Inflight, "inflight", o.Inflight, "batches in flight per worker stream while filling")
	fl.IntVar(&o.ColdStarts, "cold-starts", o.ColdStarts, "new replicas to time from start until in sync")
	fl.IntSliceVar(&o.LagRates, "lag-rates", o.LagRates, "block events per second offered while the view lag is measured, one phase each (comma-separated)")
	fl.DurationVar(&o.LagFor, "lag-for", o.LagFor, "how long each lag phase lasts")
	fl.StringVar(&o.CPUProfile, "cpu-profile", "", "write a CPU profile of the cold starts (this process's side) to `FILE`")
	fl.StringVar(&nodeFlags, "node-flags", "", "extra flags for every directory process, space-separated")
	fl.StringVar(&o.Dir, "dir", "", "directory for the binary and data (default: a temporary one, removed after)")
	fl.BoolVar(&o.Logs, "logs", false, "print the nodes' logs at the end")
	return cmd
}
