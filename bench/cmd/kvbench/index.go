package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/indexbench"
	"github.com/kvdir/kvdir/internal/benchjson"
)

func newIndex(log *slog.Logger) *cobra.Command {
	o := indexbench.Defaults
	cmd := measureCommand(&cobra.Command{
		Use:   "index",
		Short: "Measure the block-prefix index and the content hash (make bench-index)",
		Long: `Measures the block-prefix index (apply rate, match latency under writes, memory,
snapshot throughput) and the content hash at the full shape of the project's figures
(64 workers, 10 M (block, worker) entries, sharing factor 4), compares the index with
github.com/armon/go-radix at a reduced scale, and writes the figures as JSON.`,
		Example: `  kvbench index --out bench/results/index.json
  kvbench index --scale 0.01 --out -      # a quick look at 1 % of the shape`,
	}, indexbench.Tool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log = log
		return indexbench.Run(ctx, o)
	})
	fl := cmd.Flags()
	fl.Float64Var(&o.Scale, "scale", o.Scale, "fraction of the full shape's 10 M entries to build")
	fl.IntVar(&o.Matches, "matches", o.Matches, "match queries to time under write load")
	fl.IntVar(&o.WriteRate, "write-rate", o.WriteRate, "block events per second applied while matches are timed")
	fl.IntVar(&o.ChurnEvents, "churn-events", o.ChurnEvents, "block events to time for the apply rate")
	fl.Float64Var(&o.GoRadixScale, "goradix-scale", o.GoRadixScale, "fraction of the full shape to build in go-radix for the comparison (negative: skip)")
	fl.IntVar(&o.ChainBlocks, "chain", o.ChainBlocks, "blocks per matched chain")
	fl.IntVar(&o.Workers, "workers", o.Workers, "workers in the pool the contents are spread over (0: the full shape's 64)")
	return cmd
}
