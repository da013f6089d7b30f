package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/simengine"
)

type simFlags struct {
	clusterFlags
	timeScale                 float64
	routers                   int
	balance                   string
	routerViewLag, viewJitter time.Duration
	sharedIntents             bool
	intentLag                 time.Duration
	onePolicy                 bool
	lateBinding               bool
	admissionQueue            int
	admissionMaxWait          time.Duration
	calibrate                 bool
	priorProfile              string
	offloadBlocks             int
	offloadMedium, tiers      string
}

func newSim(log *slog.Logger) *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a trace under each placement policy in virtual time",
		Long: `Runs the trace through each placement policy (the router's internal/placement code)
in front of --replicas copies of the engine model (internal/simengine: paged prefix cache,
continuous batching, calibrated H200 timing), in virtual time. The directory's view is
built from the engines' own KV events, through the agent's translator into the
directory's radix index; the router's load view is the engines' gauges plus its own
in-flight and queued-prefill accounting, with speculative entries after each placement.

--routers N places the requests through N routers behind a load balancer (--balance):
each has its own policy instance, its own directory view (--router-view-lag after the
directory, spread by --router-view-jitter) and its own speculative entries and
accounting. --shared-intents makes each router also count the others' placements
(speculative entries, requests in flight, queued uncached prefill), --intent-lag after
they happen.

--late-binding holds a request at the router while every replica is past its knee
(internal/admission: its queued prefill exceeds two steps of --max-batched-tokens) and
places it at the first step end at which one drops below it, as the router's
--admission-queue does; past --admission-queue held requests or --admission-max-wait a
request is refused and counted as rejected. Held, peak_held and admission_rejected in the
JSON count them; time to first token counts from arrival.

--prior-profile gives the policy another cost model than the engines run (--profile):
the router's hand-given profile is wrong. --calibrate makes each router fit its profile
online (costmodel.Calibrator, the prior its starting point) to the requests it placed on
a worker with nothing queued, as the HTTP router's --calibrate does; the result's
"calibration" field holds the fitted profile's prefill error against --profile over a
grid of shapes, 2 minutes of virtual time after the first arrival and at the end.

--offload-blocks N gives every engine a KV offloading tier of N blocks (vLLM's CPU
offloading; --offload-medium Disk for a disk tier): blocks the GPU evicts stay there and
load back to the GPU before the prefill, taking the profile's transfer time (PCIe Gen5
x16 for host memory, one NVMe drive for disk, unless the profile file says otherwise).
--tiers says what the policy is told of such blocks: priced (the directory's tier split;
kvdir adds the load to the time to first token), as-gpu (counted as GPU-held) or gpu-only (not
counted).

Writes --out (JSON), the same name with .md (Markdown table) and, unless --no-charts,
PNG charts next to it: -ttft-cdf.png, -replica-hit-rate.png, -queue-depth.png.

--kv-blocks defaults, for a built-in profile, to what the model leaves for KV on one
H200 (see docs/benchmarks.md):
  ` + kvLine("llama3-8b") + `
  ` + kvLine("llama3-70b"),
		Example: `  kvbench sim --trace bench/testdata/mooncake_synthetic_trace.jsonl --replicas 8 \
    --profile llama3-70b --policies all --out bench/results/sim-mooncake.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(cmd, &f, log)
		},
	}
	fl := cmd.Flags()
	f.register(fl, "round-robin,session-hash,kvdir", 1)
	fl.Float64Var(&f.timeScale, "time-scale", 1, "multiply the trace's timestamps by this (0.5: twice the request rate)")
	fl.IntVar(&f.routers, "routers", 1, "routers placing the requests, each with its own policy instance, directory view, speculative entries and accounting")
	fl.StringVar(&f.balance, "balance", sim.BalanceRoundRobin, "how the load balancer spreads requests over the routers: "+sim.BalanceRoundRobin+", "+sim.BalanceRandom+" (seeded) or "+sim.BalanceSession+" (a session's requests to one router, by a hash of its key)")
	fl.DurationVar(&f.routerViewLag, "router-view-lag", 0, "delay of each router's directory view after the directory (added to --event-lag)")
	fl.DurationVar(&f.viewJitter, "router-view-jitter", 0, "spread of the routers' view lags: each router's lag is --router-view-lag plus a seeded offset in [-jitter, +jitter], at least 0")
	fl.BoolVar(&f.sharedIntents, "shared-intents", false, "each router counts the other routers' placements (speculative entries, in-flight requests, queued prefill) as its own")
	fl.DurationVar(&f.intentLag, "intent-lag", 0, "with --shared-intents: how long a placement, its first token and its end take to reach the other routers")
	fl.BoolVar(&f.onePolicy, "one-policy-instance", false, "what-if: every router calls one policy instance (one random stream for tie breaks, one sticky map), as no real routers do; isolates the routers' views")
	fl.BoolVar(&f.lateBinding, "late-binding", false, "hold a request at the router while every replica is past its knee (its queued prefill exceeds two steps of --max-batched-tokens) and place it at the first step end a replica drops below it, as the router's --admission-queue does; refused requests count as rejected")
	fl.IntVar(&f.admissionQueue, "admission-queue", sim.DefaultAdmissionQueue, "with --late-binding: most requests held (more are rejected, the router's 429)")
	fl.DurationVar(&f.admissionMaxWait, "admission-max-wait", sim.DefaultAdmissionMaxWait, "with --late-binding: longest a request is held (then rejected, the router's 503)")
	fl.BoolVar(&f.calibrate, "calibrate", false, "fit the policy's cost model online to the observed prefills, from its profile as the prior")
	fl.StringVar(&f.priorProfile, "prior-profile", "", "the policy's profile, a built-in name or a JSON file (empty: --profile); with --calibrate, the prior")
	fl.IntVar(&f.offloadBlocks, "offload-blocks", 0, "blocks of each engine's KV offloading tier (0: none)")
	fl.StringVar(&f.offloadMedium, "offload-medium", "CPU", "the offloading tier's medium, as vLLM names it: CPU (host memory) or Disk, STORAGE, FS (disk link)")
	fl.StringVar(&f.tiers, "tiers", sim.TiersPriced, "what the policy is told of blocks held beyond the GPU: "+strings.Join(sim.TierModes(), ", "))
	return cmd
}

func kvLine(profile string) string {
	a, ok := sim.DefaultKVBlocks(profile, simengine.DefaultBlockSize)
	if !ok {
		return profile + ": unknown"
	}
	return fmt.Sprintf("%s: %d blocks of %d tokens (%d tokens)", profile, a.Blocks, a.BlockSize, a.Tokens)
}

// parsePolicies parses --policies: router policy names, or all; extra are
// further names accepted (and included in all), such as replay's haproxy.
func parsePolicies(s string, extra ...string) ([]string, error) {
	known := append(placement.Names(), extra...)
	if strings.TrimSpace(s) == "all" {
		return known, nil
	}
	var out []string
	seen := make(map[string]bool)
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" || seen[p] {
			continue
		}
		if !contains(known, p) {
			return nil, cli.Usagef("unknown policy %q (known: %s, or all)", p, strings.Join(known, ", "))
		}
		seen[p] = true
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, cli.Usagef("--policies is empty")
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func runSim(cmd *cobra.Command, f *simFlags, log *slog.Logger) error {
	switch {
	case f.routers < 1:
		return cli.Usagef("--routers %d, want >= 1", f.routers)
	case !contains(sim.Balances(), f.balance):
		return cli.Usagef("--balance %q, want one of %s", f.balance, strings.Join(sim.Balances(), ", "))
	case f.routerViewLag < 0 || f.viewJitter < 0 || f.intentLag < 0:
		return cli.Usagef("--router-view-lag, --router-view-jitter and --intent-lag must be >= 0")
	case f.intentLag > 0 && !f.sharedIntents:
		return cli.Usagef("--intent-lag needs --shared-intents")
	case f.admissionQueue < 1 || f.admissionMaxWait <= 0:
		return cli.Usagef("--admission-queue %d and --admission-max-wait %v must be positive", f.admissionQueue, f.admissionMaxWait)
	case f.offloadBlocks < 0:
		return cli.Usagef("--offload-blocks %d, want >= 0", f.offloadBlocks)
	case !contains(sim.TierModes(), f.tiers):
		return cli.Usagef("--tiers %q, want one of %s", f.tiers, strings.Join(sim.TierModes(), ", "))
	}
	c, err := f.load(log)
	if err != nil {
		return err
	}
	prof, pols, recs, ideal := c.prof, c.pols, c.recs, c.ideal
	f.kvBlocks = c.kvBlocks
	polProf := prof
	if f.priorProfile != "" {
		if polProf, err = costmodel.ResolveProfile(f.priorProfile); err != nil {
			return err
		}
	}
	rep := report.ForTrace("sim", f.trace, recs, ideal, f.traceBlockSize, f.blockSize, f.replicas, prof.Name, f.kvBlocks, f.timeScale)
	rep.Command, rep.Seed = argvOf(cmd, nil), f.seed
	rep.Settings = map[string]any{
		"event_lag_ms":          f.eventLag.Milliseconds(),
		"speculative_ttl_ms":    f.specTTL.Milliseconds(),
		"speculative_fixed_ttl": f.specFixed,
		"max_batched_tokens":    f.maxBatched,
		"max_running":           f.maxRunning,
		"trace_block_size":      f.traceBlockSize,
		"session_key":           "session_id, else \"h\" + first hash id",
	}
	if f.lateBinding {
		rep.Settings["late_binding"] = true
		rep.Settings["admission_queue"] = f.admissionQueue
		rep.Settings["admission_max_wait_ms"] = f.admissionMaxWait.Milliseconds()
	}
	if f.calibrate || f.priorProfile != "" {
		rep.Settings["calibrate"] = f.calibrate
		rep.Settings["policy_profile"] = polProf.Name
	}
	if f.offloadBlocks > 0 {
		rep.Settings["offload_blocks"] = f.offloadBlocks
		rep.Settings["offload_medium"] = f.offloadMedium
		rep.Settings["tiers"] = f.tiers
		rep.Settings["host_to_gpu_gb_per_s"] = prof.HostBandwidth()
		rep.Settings["disk_to_gpu_gb_per_s"] = prof.DiskBandwidth()
	}
	if f.routers > 1 || f.routerViewLag > 0 || f.viewJitter > 0 || f.sharedIntents {
		lags := sim.ViewLags(sim.Config{Routers: f.routers, RouterViewLag: f.routerViewLag, RouterViewJitter: f.viewJitter, Seed: f.seed})
		ms := make([]float64, len(lags))
		for i, l := range lags {
			ms[i] = float64(l.Microseconds()) / 1000
		}
		rep.Settings["routers"] = f.routers
		rep.Settings["balance"] = f.balance
		rep.Settings["router_view_lag_ms"] = ms
		rep.Settings["shared_intents"] = f.sharedIntents
		rep.Settings["intent_lag_ms"] = f.intentLag.Milliseconds()
		rep.Settings["one_policy_instance"] = f.onePolicy
	}
	ts := rep.TraceStats
	log.Info("trace", "file", f.trace, "requests", ts.Requests, "minutes", fmt.Sprintf("%.1f", ts.DurationSec/60),
		"ideal_hit_rate", fmt.Sprintf("%.3f", rep.TraceStats.IdealHitRate), "hot_working_set_tokens", ts.HotWorkingSetTokens,
		"cluster_kv_tokens", rep.ClusterKVTokens, "kv_to_working_set", fmt.Sprintf("%.2f", rep.KVToWorkingSet),
		"pooled_hit_rate", fmt.Sprintf("%.3f", rep.PooledHitRate))

	results := make([]report.Policy, len(pols))
	errs := make([]error, len(pols))
	sem := make(chan struct{}, f.parallel)
	var wg sync.WaitGroup
	for i, name := range pols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cfg := f.simConfig(c, log)
			cfg.Policy, cfg.TimeScale = name, f.timeScale
			cfg.Routers, cfg.Balance = f.routers, f.balance
			cfg.RouterViewLag, cfg.RouterViewJitter = f.routerViewLag, f.viewJitter
			cfg.SharedIntents, cfg.IntentLag = f.sharedIntents, f.intentLag
			cfg.LateBinding, cfg.AdmissionQueue, cfg.AdmissionMaxWait = f.lateBinding, f.admissionQueue, f.admissionMaxWait
			cfg.PolicyProfile, cfg.Calibrate = polProf, f.calibrate
			cfg.OffloadBlocks, cfg.Tiers = f.offloadBlocks, f.tiers
			if f.offloadBlocks > 0 {
				cfg.OffloadMedium = f.offloadMedium
			}
			if f.onePolicy {
				if f.calibrate {
					errs[i] = cli.Usagef("--calibrate needs a policy instance per router (drop --one-policy-instance)")
					return
				}
				pol, err := placement.New(name, placement.Options{Seed: f.seed, Profile: polProf, ChunkTokens: f.maxBatched})
				if err != nil {
					errs[i] = fmt.Errorf("policy %s: %w", name, err)
					return
				}
				cfg.Impl = pol
			}
			p, err := sim.Run(cmd.Context(), recs, ideal, cfg)
			if err != nil {
				errs[i] = fmt.Errorf("policy %s: %w", name, err)
				return
			}
			results[i] = p
			if c := p.Calibration; c != nil {
				log.Info("calibration", "policy", name, "prior", c.Prior, "engine", c.Engine,
					"prior_error_max", fmt.Sprintf("%.3f", c.PriorErrorMax), "checkpoint_s", fmt.Sprintf("%.0f", c.CheckpointSec),
					"checkpoint_observations", c.CheckpointObservations, "checkpoint_error_max", fmt.Sprintf("%.3f", c.CheckpointErrorMax),
					"checkpoint_error_mean", fmt.Sprintf("%.3f", c.CheckpointErrorMean), "observations", c.Observations, "skipped", c.Skipped,
					"final_error_max", fmt.Sprintf("%.3f", c.FinalErrorMax), "scales", fmt.Sprintf("%.3f", c.Scales))
			}
			log.Info("policy done", "policy", name, "wall_s", fmt.Sprintf("%.1f", p.WallSec),
				"hit_rate", fmt.Sprintf("%.3f", p.HitRate), "reuse_captured", fmt.Sprintf("%.3f", p.ReuseCaptured),
				"ttft_p90_s", fmt.Sprintf("%.2f", p.TTFTP90Ms/1000), "max_share", fmt.Sprintf("%.3f", p.MaxReplicaShare))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	rep.Policies = results
	return writeReport(rep, f.out, !f.noCharts, log)
}

// writeReport writes the JSON, the Markdown table and the charts, and prints
// the table.
func writeReport(rep *report.Report, out string, charts bool, log *slog.Logger) error {
	rep.RelateToPooled()
	if err := rep.Validate(); err != nil {
		log.Warn("result fails its own checks (written anyway)", "err", err)
	}
	if err := report.Markdown(os.Stdout, rep); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := report.WriteJSON(out, rep); err != nil {
		return err
	}
	base := strings.TrimSuffix(out, filepath.Ext(out))
	var md strings.Builder
	if err := report.Markdown(&md, rep); err != nil {
		return err
	}
	if err := os.WriteFile(base+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	files := []string{out, base + ".md"}
	if charts {
		pngs, err := report.Charts(rep, base)
		if err != nil {
			return err
		}
		files = append(files, pngs...)
	}
	log.Info("wrote", "files", strings.Join(files, " "))
	return nil
}

func newReport() *cobra.Command {
	var noCharts bool
	cmd := &cobra.Command{
		Use:   "report RESULT.json",
		Short: "Re-render the Markdown table and the charts of a result file (sim or replay)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			rep, err := report.ReadFile(args[0])
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			base := strings.TrimSuffix(args[0], filepath.Ext(args[0]))
			var md strings.Builder
			if err := report.Markdown(&md, rep); err != nil {
				return err
			}
			fmt.Print(md.String())
			if err := os.WriteFile(base+".md", []byte(md.String()), 0o644); err != nil {
				return err
			}
			if noCharts {
				return nil
			}
			files, err := report.Charts(rep, base)
			if err != nil {
				return err
			}
			log.Info("wrote", "files", strings.Join(append([]string{base + ".md"}, files...), " "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&noCharts, "no-charts", false, "write only the Markdown table")
	return cmd
}
