package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/bench/capacity"
	"github.com/kvdir/kvdir/internal/cli"
)

// sweepFlags are sweep's flags: sim's cluster flags and the search's.
type sweepFlags struct {
	clusterFlags
	sweepSearch
}

// sweepSearch are the flags of the capacity search, shared with eval.
type sweepSearch struct {
	slo                          time.Duration
	precision                    float64
	minMultiplier, maxMultiplier float64
}

func (s *sweepSearch) register(fl *pflag.FlagSet) {
	fl.DurationVar(&s.slo, "slo", 0, "p90 TTFT objective (0: the profile's default, "+sloDefaults()+"; required for a profile file)")
	fl.Float64Var(&s.precision, "precision", capacity.DefaultPrecision, "stop bisecting once the passing and failing multipliers are within this ratio of each other")
	fl.Float64Var(&s.minMultiplier, "min-multiplier", capacity.DefaultMinMultiplier, "lowest request-rate multiplier tried; a policy failing there has capacity 0")
	fl.Float64Var(&s.maxMultiplier, "max-multiplier", capacity.DefaultMaxMultiplier, "highest request-rate multiplier tried; a policy passing there is reported there, capped")
}

func sloDefaults() string {
	var parts []string
	for _, p := range []string{"llama3-70b", "llama3-8b"} {
		d, _ := capacity.DefaultSLO(p)
		parts = append(parts, fmt.Sprintf("%v for %s", d, p))
	}
	return strings.Join(parts, ", ")
}

// options resolves the search flags for the --profile value profile.
func (s *sweepSearch) options(profile string, parallel int, trace string, log *slog.Logger) (capacity.Options, error) {
	slo := s.slo
	if slo == 0 {
		d, ok := capacity.DefaultSLO(profile)
		if !ok {
			return capacity.Options{}, cli.Usagef("profile %q has no default SLO; set --slo", profile)
		}
		slo = d
	}
	switch {
	case slo < 0:
		return capacity.Options{}, cli.Usagef("--slo %v, want > 0", slo)
	case !(s.precision > 0):
		return capacity.Options{}, cli.Usagef("--precision %v, want > 0", s.precision)
	case !(s.minMultiplier > 0) || !(s.maxMultiplier >= s.minMultiplier):
		return capacity.Options{}, cli.Usagef("--min-multiplier %v, --max-multiplier %v: want 0 < min <= max", s.minMultiplier, s.maxMultiplier)
	}
	return capacity.Options{SLO: slo, Precision: s.precision, MinMultiplier: s.minMultiplier, MaxMultiplier: s.maxMultiplier,
		Parallel: parallel, Trace: trace, Logger: log}, nil
}

func newSweep(log *slog.Logger) *cobra.Command {
	var f sweepFlags
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Find each policy's capacity: the highest request rate it sustains at a p90 TTFT objective",
		Long: `Runs the trace in the simulator (as kvbench sim does) at a range of request rates, per
policy, to find its capacity at an SLO: the highest request-rate multiplier m (the trace's
timestamps scaled by 1/m; m = 2 is twice the trace's rate) at which the p90 time to first
token over all requests is at most --slo. A request the engines reject counts as one that
never met the SLO.

The search starts at m = 1, doubles or halves until one multiplier passes and a neighbour
fails (within --min-multiplier and --max-multiplier), then bisects in log space until the two
are within --precision. A policy failing even at the minimum has capacity 0; one passing at
the maximum is reported at the maximum, marked capped. Throughput at the SLO is capacity ×
the trace's request rate (req/s); goodput counts, at that rate, the requests whose TTFT met
the SLO per second of arrivals.

The policies are then compared: each capacity against round-robin's and against the best
baseline's (the highest of llm-d, llm-d-sticky, sglang, dynamo, prefix and session-hash run),
and every policy is run once more at the best baseline's capacity for its p90 TTFT there.
reuse_vs_pooled is a policy's hit rate over what one LRU cache of the whole cluster's KV
would hit serving the trace (the pooled bound).

Writes --out (JSON), the same name with .md and, unless --no-charts, -p90.png: each policy's
p90 TTFT against request rate, the SLO drawn across. The result is deterministic for --seed.`,
		Example: `  kvbench sweep --trace bench/testdata/mooncake_synthetic_trace.jsonl --replicas 8 \
    --profile llama3-70b --kv-blocks 101200 --slo 10s --out bench/results/capacity-mooncake.json
  kvbench sweep --trace bench/testdata/demo-sessions.jsonl --replicas 4 --profile llama3-8b \
    --kv-ratio 1 --slo 500ms --policies kvdir,round-robin,llm-d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := runSweep(cmd.Context(), &f.clusterFlags, &f.sweepSearch, log)
			if err != nil {
				return err
			}
			res.Command = argvOf(cmd, nil)
			return writeSweep(res, f.out, !f.noCharts, log)
		},
	}
	fl := cmd.Flags()
	f.clusterFlags.register(fl, "all", capacity.DefaultParallel)
	f.sweepSearch.register(fl)
	return cmd
}

// runSweep loads the trace and cluster of f and sweeps its policies.
func runSweep(ctx context.Context, f *clusterFlags, s *sweepSearch, log *slog.Logger) (*capacity.Result, error) {
	c, err := f.load(log)
	if err != nil {
		return nil, err
	}
	opts, err := s.options(f.profile, f.parallel, f.trace, log)
	if err != nil {
		return nil, err
	}
	log.Info("sweep", "trace", f.trace, "requests", len(c.recs), "replicas", f.replicas, "profile", c.prof.Name,
		"kv_blocks", c.kvBlocks, "slo", opts.SLO, "policies", strings.Join(c.pols, ","))
	return capacity.Sweep(ctx, c.recs, c.ideal, f.simConfig(c, log), c.pols, opts)
}

// writeSweep prints the table and, with out set, writes the files.
func writeSweep(res *capacity.Result, out string, charts bool, log *slog.Logger) error {
	if err := capacity.Markdown(os.Stdout, res); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	files, err := capacity.WriteFiles(res, strings.TrimSuffix(out, filepath.Ext(out)), charts)
	if err != nil {
		return err
	}
	log.Info("wrote", "files", strings.Join(files, " "))
	return nil
}
