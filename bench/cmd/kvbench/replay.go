package main

import (
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/replay"
	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

type replayFlags struct {
	trace, profile, policies, out, dir, model string
	url, urlWorkers                           string
	replicas, kvBlocks, routers, limit        int
	traceBlockSize                            int
	timeScale                                 float64
	rate                                      float64
	matchTimeout, routerFlags                 string
	noCharts                                  bool
}

func newReplay(log *slog.Logger) *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a trace through real processes under each policy",
		Long: `Starts a fleet of real processes on this machine (3 directory nodes, --replicas engine
simulators each with its agent) and, for each policy, --routers routers running it (or, for
"haproxy", Debian's HAProxy with balance hdr(X-Session-Id), hash-type consistent and
hash-balance-factor 150 in front of the same engines), then sends the trace's requests
open-loop at their timestamps. Before each policy the engines' prefix caches are reset.

Prompts are sent as token ids (/v1/completions), built from the trace's hash ids, so the
engines see exactly the trace's sharing. Hit rates come from the engines' own accounting
(usage.prompt_tokens_details.cached_tokens). The engines run --time-scale times their
modelled speed and the trace is compressed by the same factor; latencies are reported on
the trace's clock (wall time / time scale), so proxy overheads count 1/time-scale times.

Writes the same schema as kvbench sim: --out (JSON), .md next to it, and the charts.`,
		Example: `  kvbench replay --trace bench/testdata/demo-sessions.jsonl --replicas 4 --profile llama3-70b \
    --policies round-robin,session-hash,kvdir,haproxy --out bench/results/replay-demo.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.trace == "" {
				return cli.Usagef("--trace is required")
			}
			return runReplay(cmd, &f, log)
		},
	}
	fl := cmd.Flags()
	addReplayFlags(fl, &f)
	fl.StringVar(&f.trace, "trace", "", "trace file, Mooncake format (JSON Lines); required")
	fl.StringVar(&f.policies, "policies", "round-robin,session-hash,kvdir", "comma-separated policies (the router's names, and haproxy), or all")
	fl.IntVar(&f.replicas, "replicas", 4, "engine simulators (each with its agent)")
	fl.IntVar(&f.routers, "routers", 1, "routers per policy, sharing the directory (requests alternate between them)")
	fl.StringVar(&f.routerFlags, "router-flags", "", "extra flags for every router, space-separated (e.g. \"--follow-log --share-intents=false\")")
	fl.StringVarP(&f.out, "out", "o", "", "result JSON file (.md and charts next to it); empty: print the table only")
	fl.StringVar(&f.url, "url", "", "replay once against this OpenAI endpoint instead of starting processes (its caches are not reset; --time-scale defaults to 1)")
	fl.StringVar(&f.urlWorkers, "url-workers", "", "with --url: comma-separated worker ids the endpoint names in X-Kvdir-Worker (a kvdir router); otherwise one replica, \"endpoint\"")
	return cmd
}

// addReplayFlags adds the flags replay and demo share.
func addReplayFlags(fl interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	Float64Var(*float64, string, float64, string)
	BoolVar(*bool, string, bool, string)
}, f *replayFlags) {
	fl.StringVar(&f.profile, "profile", "llama3-70b", "engine timing profile: a built-in name ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON file")
	fl.IntVar(&f.kvBlocks, "kv-blocks", 0, "KV-cache blocks per engine (0: what the profile's model leaves on one H200)")
	fl.Float64Var(&f.timeScale, "time-scale", 0.1, "engine speed and trace compression: 0.1 runs ten times faster than modelled")
	fl.IntVar(&f.limit, "limit", 0, "replay only the first N requests (0: all)")
	fl.Float64Var(&f.rate, "rate-multiplier", 1, "send the trace at this multiple of its own request rate (timestamps / m), as kvbench sweep's multipliers; latencies stay on the trace's clock")
	fl.IntVar(&f.traceBlockSize, "trace-block-size", workload.DefaultBlockSize, "tokens per hash id in the trace")
	fl.StringVar(&f.model, "model", "", "model name the engines serve (default: the profile's name)")
	fl.StringVar(&f.matchTimeout, "match-timeout", fleetMatchTimeout, "the routers' directory look-up deadline (the router's default is 5ms; a 2-core machine running the whole fleet needs more)")
	fl.StringVar(&f.dir, "dir", "", "directory for binaries and data (default: a temporary one, removed after)")
	fl.BoolVar(&f.noCharts, "no-charts", false, "do not write PNG charts")
}

func runReplay(cmd *cobra.Command, f *replayFlags, log *slog.Logger) error {
	pols, err := parsePolicies(f.policies, replay.HAProxy)
	if err != nil {
		return err
	}
	recs, err := workload.ReadFile(f.trace, f.traceBlockSize)
	if err != nil {
		return err
	}
	workload.SortByTime(recs)
	if f.limit > 0 && f.limit < len(recs) {
		recs = recs[:f.limit]
	}
	if !(f.rate > 0) || math.IsInf(f.rate, 0) {
		return cli.Usagef("--rate-multiplier %v: want a finite value > 0", f.rate)
	}
	for i := range recs {
		recs[i].Timestamp /= f.rate
	}
	if len(recs) == 0 {
		return fmt.Errorf("%s: no records", f.trace)
	}
	if f.url != "" {
		return replayEndpoint(cmd, f, recs, log)
	}
	return replayAndReport(cmd, f, pols, recs, f.trace, f.out, log)
}

// replayEndpoint replays recs once against --url.
func replayEndpoint(cmd *cobra.Command, f *replayFlags, recs []workload.Record, log *slog.Logger) error {
	if !cmd.Flags().Changed("time-scale") {
		f.timeScale = 1
	}
	if f.timeScale <= 0 || f.timeScale > 10 {
		return cli.Usagef("--time-scale %v: want a value in (0, 10]", f.timeScale)
	}
	if f.model == "" {
		return cli.Usagef("--url needs --model, the model name the endpoint serves")
	}
	if u, err := url.Parse(f.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return cli.Usagef("--url %q: want http(s)://host:port", f.url)
	}
	var workers []string
	for _, w := range strings.Split(f.urlWorkers, ",") {
		if w = strings.TrimSpace(w); w != "" {
			workers = append(workers, w)
		}
	}
	rep, err := replay.RunEndpoint(cmd.Context(), replay.Options{Trace: f.trace, Records: recs, TraceBlockSize: f.traceBlockSize,
		TimeScale: f.timeScale, Model: f.model, Command: argvOf(cmd, nil), Log: log, Progress: os.Stderr},
		strings.TrimRight(f.url, "/"), workers)
	if err != nil {
		return err
	}
	return writeReport(rep, f.out, !f.noCharts, log)
}

// replayAndReport runs the comparison and writes the report.
func replayAndReport(cmd *cobra.Command, f *replayFlags, pols []string, recs []workload.Record, trace, out string, log *slog.Logger) error {
	prof, err := costmodel.ResolveProfile(f.profile)
	if err != nil {
		return cli.Usagef("--profile: %w", err)
	}
	if f.kvBlocks == 0 {
		a, ok := sim.DefaultKVBlocks(prof.Name, simengine.DefaultBlockSize)
		if !ok {
			return fmt.Errorf("profile %q has no default KV size; set --kv-blocks", prof.Name)
		}
		f.kvBlocks = a.Blocks
	}
	if f.timeScale <= 0 || f.timeScale > 10 {
		return cli.Usagef("--time-scale %v: want a value in (0, 10]", f.timeScale)
	}
	dir := f.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvbench-replay-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	rep, err := replay.RunComparison(cmd.Context(), replay.Options{
		Trace: trace, Records: recs, TraceBlockSize: f.traceBlockSize, Replicas: f.replicasOr(4), Profile: f.profile,
		KVBlocks: f.kvBlocks, TimeScale: f.timeScale, Model: f.model, Policies: pols, Routers: f.routers,
		RouterArgs: append([]string{"--match-timeout", f.matchTimeout, "--profile", f.profile}, strings.Fields(f.routerFlags)...),
		Dir:        dir, Command: argvOf(cmd, nil),
		Log: log, Progress: os.Stderr})
	if err != nil {
		return err
	}
	return writeReport(rep, out, !f.noCharts, log)
}

func (f *replayFlags) replicasOr(d int) int {
	if f.replicas > 0 {
		return f.replicas
	}
	return d
}
