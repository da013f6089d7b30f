package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/bench/capacity"
	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/workload"
)

// defaultEvalPolicies are kvdir, round-robin and the baselines.
var defaultEvalPolicies = strings.Join(append([]string{"kvdir", capacity.RoundRobin}, capacity.Baselines...), ",")

// evalSet is the evaluation set file: the members, each a trace and a
// cluster shape.
type evalSet struct {
	Description string       `json:"description,omitempty"`
	Members     []evalMember `json:"members"`
}

// evalMember is one member: a trace (a file in the repository, or the
// argv of kvbench gen that makes it), a cluster, and optionally an SLO.
type evalMember struct {
	Name     string   `json:"name"`
	Trace    string   `json:"trace,omitempty"`
	Gen      []string `json:"gen,omitempty"`
	Replicas int      `json:"replicas"`
	Profile  string   `json:"profile"`
	KVRatio  float64  `json:"kv_ratio,omitempty"`
	KVBlocks int      `json:"kv_blocks,omitempty"`
	SLO      string   `json:"slo,omitempty"`
}

var memberName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// readEvalSet reads and checks the set at path.
func readEvalSet(path string) (*evalSet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("eval set: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s evalSet
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("eval set %s: %w", path, err)
	}
	if len(s.Members) == 0 {
		return nil, fmt.Errorf("eval set %s: no members", path)
	}
	seen := make(map[string]bool)
	for i, m := range s.Members {
		var err error
		switch {
		case !memberName.MatchString(m.Name):
			err = fmt.Errorf("name %q: want lower-case letters, digits, '.', '_' or '-'", m.Name)
		case seen[m.Name]:
			err = fmt.Errorf("name %q appears twice", m.Name)
		case (m.Trace == "") == (len(m.Gen) == 0):
			err = errors.New("give exactly one of trace and gen")
		case slices.ContainsFunc(m.Gen, func(a string) bool { return a == "-o" || a == "--out" || strings.HasPrefix(a, "--out=") }):
			err = errors.New("gen must not set the output (the runner does)")
		case m.Replicas < 1 || m.Profile == "":
			err = fmt.Errorf("replicas %d, profile %q: want >= 1 and a profile", m.Replicas, m.Profile)
		case m.KVRatio < 0 || m.KVBlocks < 0 || (m.KVRatio > 0 && m.KVBlocks > 0):
			err = errors.New("give at most one of kv_ratio and kv_blocks, > 0")
		}
		if err == nil && m.SLO != "" {
			if d, perr := time.ParseDuration(m.SLO); perr != nil || d <= 0 {
				err = fmt.Errorf("slo %q: want a positive duration such as 2s", m.SLO)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("eval set %s: member %d: %w", path, i, err)
		}
		seen[m.Name] = true
	}
	return &s, nil
}

// repoRoot is the nearest directory at or above dir holding go.mod, or dir.
func repoRoot(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

type evalFlags struct {
	set, members, outDir, policies string
	seed                           int64
	parallel                       int
	noCharts, list, summarize      bool
	sweepSearch
}

func newEval(log *slog.Logger) *cobra.Command {
	var f evalFlags
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Run the capacity sweep over the evaluation set and summarise kvdir against the baselines",
		Long: `Runs kvbench sweep for each member of the evaluation set (--set, a JSON file: each member a
trace and a cluster shape; see bench/testdata/README.md) and writes, in --out-dir,
capacity-eval-<member>.json, .md and -p90.png per member, then capacity-eval.json and .md: one
row per member with a result in --out-dir (those just run and any earlier ones), giving kvdir's
capacity, the best baseline and its capacity, kvdir / best baseline, kvdir / round-robin,
kvdir's reuse against the pooled bound, and whether kvdir has the lowest p90 TTFT at the best
baseline's capacity; and the median of kvdir / best baseline over the rows. A second table says
what limits kvdir on each member: the reuse left to win against the pooled bound, the best
baseline's spread, the prefill round-robin computes per token kvdir computes, and kvdir's p90
against the lowest at the best baseline's capacity. --summarize rewrites the summary from the
member results in --out-dir without simulating.

A member's trace is a file (a path from the repository's root) or generated in-process by
kvbench gen with the member's argv. Its SLO is the member's, else --slo, else the profile's
default. --list prints the members' traces and KV sizes without simulating.`,
		Example: `  kvbench eval --out-dir bench/results
  kvbench eval --members agent-8x70b-kv0.5 --policies kvdir,round-robin,llm-d --out-dir /tmp/eval
  kvbench eval --summarize --out-dir bench/results`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEval(cmd, &f, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.set, "set", filepath.Join("bench", "testdata", "evalset.json"), "evaluation set file")
	fl.StringVar(&f.members, "members", "", "comma-separated members to run (empty: all)")
	fl.StringVar(&f.outDir, "out-dir", filepath.Join("bench", "results"), "directory of the result files")
	fl.StringVar(&f.policies, "policies", defaultEvalPolicies, "comma-separated policies, or all")
	fl.Int64Var(&f.seed, "seed", 1, "seed of the policies' random choices, the engines")
	fl.IntVar(&f.parallel, "parallel", capacity.DefaultParallel, "policies swept at the same time")
	fl.BoolVar(&f.noCharts, "no-charts", false, "do not write PNG charts")
	fl.BoolVar(&f.list, "list", false, "print each member's trace and cluster, simulate nothing")
	fl.BoolVar(&f.summarize, "summarize", false, "simulate nothing: write capacity-eval.json and .md from the member results already in --out-dir")
	f.sweepSearch.register(fl)
	return cmd
}

func runEval(cmd *cobra.Command, f *evalFlags, log *slog.Logger) error {
	if f.parallel < 1 {
		return cli.Usagef("--parallel %d, want >= 1", f.parallel)
	}
	if _, err := parsePolicies(f.policies); err != nil {
		return err
	}
	set, err := readEvalSet(f.set)
	if err != nil {
		return err
	}
	members := set.Members
	if strings.TrimSpace(f.members) != "" {
		members = nil
		for _, name := range strings.Split(f.members, ",") {
			name = strings.TrimSpace(name)
			i := slices.IndexFunc(set.Members, func(m evalMember) bool { return m.Name == name })
			if i < 0 {
				return cli.Usagef("--members: %q is not in %s", name, f.set)
			}
			members = append(members, set.Members[i])
		}
	}
	// The summary is a function of the member results, so it carries the
	// command that made them: without --members or --summarize.
	argv := slices.DeleteFunc(argvOf(cmd, nil), func(a string) bool {
		return strings.HasPrefix(a, "--members=") || strings.HasPrefix(a, "--summarize")
	})
	if f.summarize {
		if f.list || strings.TrimSpace(f.members) != "" {
			return cli.Usagef("--summarize simulates nothing: drop --list and --members")
		}
		return writeEvalSummary(set, f.set, f.outDir, argv, log)
	}
	abs, err := filepath.Abs(f.set)
	if err != nil {
		return err
	}
	root := repoRoot(filepath.Dir(abs))
	tmp, err := os.MkdirTemp("", "kvbench-eval-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, m := range members {
		cf, label, err := f.memberFlags(cmd.Context(), m, root, tmp)
		if err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
		if f.list {
			if err := listMember(m, cf, label); err != nil {
				return fmt.Errorf("member %s: %w", m.Name, err)
			}
			continue
		}
		search := f.sweepSearch
		if m.SLO != "" {
			search.slo, _ = time.ParseDuration(m.SLO) // checked by readEvalSet
		}
		start := time.Now()
		log.Info("eval member", "member", m.Name, "trace", label)
		res, err := runSweep(cmd.Context(), cf, &search, log)
		if err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
		res.Trace = label
		res.Command = append(slices.Clone(argv), "--members="+m.Name)
		if err := writeSweep(res, filepath.Join(f.outDir, "capacity-eval-"+m.Name+".json"), !f.noCharts, log); err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
		log.Info("eval member done", "member", m.Name, "wall_s", fmt.Sprintf("%.1f", time.Since(start).Seconds()))
	}
	if f.list {
		return nil
	}
	return writeEvalSummary(set, f.set, f.outDir, argv, log)
}

// memberFlags are the cluster flags of member m (its trace generated into
// dir if it has a gen argv) and the trace's label for the results.
func (f *evalFlags) memberFlags(ctx context.Context, m evalMember, root, dir string) (*clusterFlags, string, error) {
	var cf clusterFlags
	cf.register(pflag.NewFlagSet(m.Name, pflag.ContinueOnError), f.policies, f.parallel) // the defaults
	cf.replicas, cf.profile, cf.kvRatio, cf.kvBlocks = m.Replicas, m.Profile, m.KVRatio, m.KVBlocks
	cf.seed = f.seed
	label := m.Trace
	if len(m.Gen) > 0 {
		cf.trace = filepath.Join(dir, m.Name+".jsonl")
		if err := genTrace(ctx, m.Gen, cf.trace); err != nil {
			return nil, "", err
		}
		label = "kvbench gen " + strings.Join(m.Gen, " ")
	} else {
		cf.trace = m.Trace
		if !filepath.IsAbs(m.Trace) {
			cf.trace = filepath.Join(root, m.Trace)
		}
	}
	return &cf, label, nil
}

// genTrace runs kvbench gen with argv in-process, writing the trace to path.
func genTrace(ctx context.Context, argv []string, path string) error {
	root := newRoot(slog.New(slog.DiscardHandler))
	root.SetArgs(append(append([]string{"gen"}, argv...), "--out", path))
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	if err := root.ExecuteContext(ctx); err != nil {
		return fmt.Errorf("kvbench gen %s: %w", strings.Join(argv, " "), err)
	}
	return nil
}

// listMember prints a member's trace and cluster.
func listMember(m evalMember, cf *clusterFlags, label string) error {
	c, err := cf.load(slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	st := workload.Summarize(c.recs, cf.traceBlockSize)
	kv := int64(cf.replicas) * int64(c.kvBlocks) * int64(cf.blockSize)
	_, pooled := report.Pooled(c.recs, cf.traceBlockSize, cf.blockSize, kv)
	longest := 0
	for _, r := range c.recs {
		longest = max(longest, r.InputLength)
	}
	fmt.Printf("%s: %s; %d requests over %.1f min, longest prompt %d tokens, hot working set %d tokens; "+
		"%d x %s, %d KV blocks each (cluster %d tokens, %.2fx), pooled hit rate %.3f\n",
		m.Name, label, st.Requests, st.DurationSec/60, longest, st.HotWorkingSetTokens, cf.replicas, c.prof.Name,
		c.kvBlocks, kv, float64(kv)/float64(max(st.HotWorkingSetTokens, 1)), pooled)
	return nil
}

// evalRow is one member's line of the summary.
type evalRow struct {
	Member         string  `json:"member"`
	Trace          string  `json:"trace"`
	Replicas       int     `json:"replicas"`
	Profile        string  `json:"profile"`
	KVToWorkingSet float64 `json:"kv_to_working_set"`
	SLOMs          float64 `json:"slo_ms"`
	// KvdirRPS is kvdir's capacity (0 if kvdir was not run).
	KvdirRPS        float64  `json:"kvdir_capacity_rps"`
	KvdirCapped     bool     `json:"kvdir_capped"`
	BestBaseline    string   `json:"best_baseline"`
	BestBaselineRPS float64  `json:"best_baseline_capacity_rps"`
	KvdirVsBest     *float64 `json:"kvdir_vs_best_baseline,omitempty"`
	KvdirVsRR       *float64 `json:"kvdir_vs_round_robin,omitempty"`
	KvdirVsPooled   float64  `json:"kvdir_reuse_vs_pooled"`
	// KvdirLowestP90 says whether kvdir's p90 TTFT at the best baseline's
	// capacity is the lowest of all policies.
	KvdirLowestP90 bool `json:"kvdir_lowest_p90_at_best_baseline"`
	// Limits say what limits kvdir's capacity on the member.
	Limits evalLimits `json:"limits"`
}

// evalSummary is capacity-eval.json's details.
type evalSummary struct {
	Set  string    `json:"set"`
	Rows []evalRow `json:"members"`
	// MedianKvdirVsBest is the median of kvdir / best baseline over the
	// rows that have it.
	MedianKvdirVsBest *float64 `json:"median_kvdir_vs_best_baseline,omitempty"`
	MedianOver        int      `json:"median_over"`
}

// writeEvalSummary writes capacity-eval.json and .md from the member
// results in outDir, in the set's order, and prints the table.
func writeEvalSummary(set *evalSet, setPath, outDir string, argv []string, log *slog.Logger) error {
	sum := evalSummary{Set: setPath}
	var ratios []float64
	for _, m := range set.Members {
		path := filepath.Join(outDir, "capacity-eval-"+m.Name+".json")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		res, err := capacity.ReadFile(path)
		if err != nil {
			return err
		}
		row := evalRow{Member: m.Name, Trace: res.Trace, Replicas: res.Replicas, Profile: res.Profile,
			KVToWorkingSet: res.KVToWorkingSet, SLOMs: res.SLOMs, BestBaseline: res.BestBaseline, Limits: limitsOf(res)}
		if b, ok := res.Policy(res.BestBaseline); ok {
			row.BestBaselineRPS = b.CapacityRPS
		}
		if k, ok := res.Policy("kvdir"); ok {
			row.KvdirRPS, row.KvdirCapped, row.KvdirVsPooled = k.CapacityRPS, k.Capped, k.ReuseVsPooled
			row.KvdirVsBest, row.KvdirVsRR = k.VsBestBaseline, k.VsRoundRobin
			row.KvdirLowestP90 = res.LowestP90AtBestBaseline == "kvdir"
			if k.VsBestBaseline != nil {
				ratios = append(ratios, *k.VsBestBaseline)
			}
		}
		sum.Rows = append(sum.Rows, row)
	}
	if len(sum.Rows) == 0 {
		return fmt.Errorf("no member results in %s", outDir)
	}
	if len(ratios) > 0 {
		slices.Sort(ratios)
		v := report.Quantile(ratios, 0.5)
		sum.MedianKvdirVsBest, sum.MedianOver = &v, len(ratios)
	}
	var md strings.Builder
	evalMarkdown(&md, &sum, argv)
	fmt.Print(md.String())
	res := benchjson.New("eval")
	res.Command = argv
	for _, r := range sum.Rows {
		res.Add(benchjson.Figure{Name: r.Member + ".kvdir_capacity_rps", Unit: "requests/s", Measured: r.KvdirRPS, Note: "kvdir's capacity at the member's SLO"})
		if r.KvdirVsBest != nil {
			res.Add(benchjson.Figure{Name: r.Member + ".kvdir_vs_best_baseline", Unit: "x", Measured: *r.KvdirVsBest, Note: "kvdir's capacity / " + r.BestBaseline + "'s"})
		}
	}
	if sum.MedianKvdirVsBest != nil {
		res.Add(benchjson.Figure{Name: "median_kvdir_vs_best_baseline", Unit: "x", Measured: *sum.MedianKvdirVsBest,
			Note: "median over the members of kvdir's capacity / the best baseline's"})
	}
	if err := res.SetDetails(&sum); err != nil {
		return err
	}
	if err := res.Validate(); err != nil {
		return err
	}
	b, err := benchjson.Encode(res)
	if err != nil {
		return err
	}
	base := filepath.Join(outDir, "capacity-eval")
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(base+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	log.Info("wrote", "files", base+".json "+base+".md")
	return nil
}

func evalMarkdown(b *strings.Builder, s *evalSummary, argv []string) {
	fmt.Fprintf(b, "`%s`\n\n", report.CommandLine(argv))
	fmt.Fprintf(b, "Capacity at the p90 TTFT SLO per member of `%s` (one row per member with a result).\n\n", s.Set)
	b.WriteString("| member | cluster | KV / working set | SLO | kvdir (req/s) | best baseline | its capacity (req/s) | kvdir / best | kvdir / round-robin | kvdir vs pooled | kvdir lowest p90 at best's capacity |\n")
	b.WriteString("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|\n")
	for _, r := range s.Rows {
		k := fmt.Sprintf("%.3g", r.KvdirRPS)
		if r.KvdirCapped {
			k = ">= " + k
		}
		low := "no"
		if r.KvdirLowestP90 {
			low = "yes"
		}
		fmt.Fprintf(b, "| %s | %d × %s | %.2f | %s | %s | %s | %.3g | %s | %s | %.3f | %s |\n",
			r.Member, r.Replicas, r.Profile, r.KVToWorkingSet, secsOf(r.SLOMs), k, or(r.BestBaseline, "–"), r.BestBaselineRPS,
			ratioCell(r.KvdirVsBest), ratioCell(r.KvdirVsRR), r.KvdirVsPooled, low)
	}
	if s.MedianKvdirVsBest != nil {
		fmt.Fprintf(b, "\nMedian kvdir / best baseline over %d members: %.2fx.\n", s.MedianOver, *s.MedianKvdirVsBest)
	}
	limitsMarkdown(b, s)
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func ratioCell(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.2fx", *v)
}

func secsOf(ms float64) string {
	return (time.Duration(ms * float64(time.Millisecond))).String()
}
