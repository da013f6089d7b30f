package capacity

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

// smallTrace is a dozen agent sessions, 42 requests over half a minute.
func smallTrace(t *testing.T) ([]workload.Record, []int) {
	t.Helper()
	cfg := workload.SessionPresets["agent"]
	cfg.Sessions, cfg.SessionRate, cfg.MaxTurns, cfg.ThinkTimeSec = 12, 1, 4, 5
	cfg.DocumentTokens, cfg.ToolTokens, cfg.MaxInputTokens = 1500, 600, 12000
	recs, err := workload.GenerateSessions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return recs, workload.IdealHits(recs, workload.DefaultBlockSize, simengine.DefaultBlockSize)
}

func baseConfig(t *testing.T) sim.Config {
	t.Helper()
	prof, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	return sim.Config{Profile: prof, Replicas: 2, KVBlocks: 3000, Seed: 1}
}

// passes runs the simulator at multiplier m on its own and applies the SLO
// rule: the p90 TTFT of all requests, a rejected one never answered.
func passes(t *testing.T, recs []workload.Record, ideal []int, base sim.Config, policy string, m float64, slo time.Duration) bool {
	t.Helper()
	var ttft []float64
	base.Policy, base.TimeScale = policy, 1/m
	base.Observe = func(s []report.Sample) {
		for _, x := range s {
			v := math.Inf(1)
			if !x.Rejected {
				v = float64(x.FirstToken-x.Arrival) / float64(time.Millisecond)
			}
			ttft = append(ttft, v)
		}
	}
	if _, err := sim.Run(context.Background(), recs, ideal, base); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ttft)
	// p90, interpolated between order statistics; a rejected request
	// (infinite) above it makes it infinite.
	pos := 0.9 * float64(len(ttft)-1)
	i, f := int(pos), pos-math.Floor(pos)
	p90 := ttft[i]
	if f > 0 {
		p90 += f * (ttft[i+1] - ttft[i])
	}
	return p90 <= float64(slo)/float64(time.Millisecond)
}

// TestSweepFindsTheBoundary: each found capacity passes and a rate at most
// the precision above it fails, both checked by running the simulator
// directly; the ratios and the
// comparison at the best baseline's capacity follow from the policies'
// entries; and the sweep is deterministic.
func TestSweepFindsTheBoundary(t *testing.T) {
	recs, ideal := smallTrace(t)
	base := baseConfig(t)
	opts := Options{SLO: 200 * time.Millisecond, Trace: "small"}
	pols := []string{"kvdir", "round-robin", "prefix", "session-hash"}
	res, err := Sweep(context.Background(), recs, ideal, base, pols, opts)
	if err != nil {
		t.Fatal(err)
	}
	span := (recs[len(recs)-1].Timestamp - recs[0].Timestamp) / 1000
	for _, p := range res.Policies {
		m := p.CapacityMultiplier
		if m <= 0 || p.Capped {
			t.Fatalf("%s: capacity %v capped %v; the trace should have a boundary inside the range", p.Name, m, p.Capped)
		}
		if !passes(t, recs, ideal, base, p.Name, m, opts.SLO) {
			t.Errorf("%s: fails the SLO at its capacity %.4g", p.Name, m)
		}
		// The bracket's failing end: the lowest failing run above m. (TTFT
		// is not monotone in the rate at this scale, so a rate above that
		// may pass again; the bisection finds a boundary, not the last.)
		hi := math.Inf(1)
		for _, pt := range p.Points {
			if pt.Multiplier > m && !pt.Pass {
				hi = math.Min(hi, pt.Multiplier)
			}
		}
		if hi > m*(1+DefaultPrecision)*(1+1e-12) {
			t.Errorf("%s: capacity %.4g, lowest failing run above it %.4g: not within the precision", p.Name, m, hi)
		} else if passes(t, recs, ideal, base, p.Name, hi, opts.SLO) {
			t.Errorf("%s: passes at %.4g, just above its capacity %.4g", p.Name, hi, m)
		}
		if want := m * float64(len(recs)) / span; math.Abs(p.CapacityRPS-want) > 1e-9*want {
			t.Errorf("%s: capacity_rps %v, want %v", p.Name, p.CapacityRPS, want)
		}
		if p.TTFTP90Ms > 200 || p.GoodputRPS <= 0 || p.GoodputRPS > p.CapacityRPS*(1+1e-9) {
			t.Errorf("%s: at capacity p90 %v ms, goodput %v of %v req/s", p.Name, p.TTFTP90Ms, p.GoodputRPS, p.CapacityRPS)
		}
		if len(p.Points) < 3 || !slices.IsSortedFunc(p.Points, func(a, b Point) int { return int(math.Copysign(1, a.Multiplier-b.Multiplier)) }) {
			t.Errorf("%s: points %+v", p.Name, p.Points)
		}
	}
	rr, _ := res.Policy("round-robin")
	var best *Policy
	for _, name := range []string{"prefix", "session-hash"} {
		if p, _ := res.Policy(name); best == nil || p.CapacityMultiplier > best.CapacityMultiplier {
			best = p
		}
	}
	if res.BestBaseline != best.Name || res.BestBaselineMultiplier != best.CapacityMultiplier {
		t.Fatalf("best baseline %s at %v, want %s at %v", res.BestBaseline, res.BestBaselineMultiplier, best.Name, best.CapacityMultiplier)
	}
	lowest := math.Inf(1)
	for _, p := range res.Policies {
		if p.VsRoundRobin == nil || *p.VsRoundRobin != p.CapacityMultiplier/rr.CapacityMultiplier {
			t.Errorf("%s: vs round-robin %v", p.Name, p.VsRoundRobin)
		}
		if p.VsBestBaseline == nil || *p.VsBestBaseline != p.CapacityMultiplier/best.CapacityMultiplier {
			t.Errorf("%s: vs best baseline %v", p.Name, p.VsBestBaseline)
		}
		if p.TTFTP90AtBestBaselineMs == nil {
			t.Fatalf("%s: no p90 at the best baseline's capacity", p.Name)
		}
		lowest = math.Min(lowest, *p.TTFTP90AtBestBaselineMs)
		if p.ReuseVsPooled != p.HitRate/res.PooledHitRate {
			t.Errorf("%s: reuse vs pooled %v, hit rate %v, pooled %v", p.Name, p.ReuseVsPooled, p.HitRate, res.PooledHitRate)
		}
	}
	if *best.TTFTP90AtBestBaselineMs != best.TTFTP90Ms {
		t.Errorf("the best baseline's p90 at its own capacity %v, at capacity %v", *best.TTFTP90AtBestBaselineMs, best.TTFTP90Ms)
	}
	if l, _ := res.Policy(res.LowestP90AtBestBaseline); l == nil || *l.TTFTP90AtBestBaselineMs != lowest {
		t.Errorf("lowest p90 at the best baseline's capacity: %q", res.LowestP90AtBestBaseline)
	}

	opts.Parallel = 1
	again, err := Sweep(context.Background(), recs, ideal, base, pols, opts)
	if err != nil {
		t.Fatal(err)
	}
	again.Started = res.Started
	if !reflect.DeepEqual(again, res) {
		t.Fatalf("two sweeps with the same seed differ:\n%+v\n%+v", res, again)
	}
}

// TestSweepEnds: a policy that can never meet the SLO has capacity 0 after
// halving down to the minimum; one that always does is capped at the
// maximum.
func TestSweepEnds(t *testing.T) {
	recs, ideal := smallTrace(t)
	base := baseConfig(t)
	res, err := Sweep(context.Background(), recs, ideal, base, []string{"kvdir"},
		Options{SLO: time.Millisecond, MinMultiplier: 0.25, MaxMultiplier: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policies[0]
	if p.CapacityMultiplier != 0 || p.CapacityRPS != 0 || p.Capped || len(p.Points) != 3 || p.Points[0].Multiplier != 0.25 {
		t.Fatalf("impossible SLO: %+v", p)
	}
	if res.BestBaseline != "" || p.VsRoundRobin != nil || p.VsBestBaseline != nil || p.TTFTP90AtBestBaselineMs != nil {
		t.Fatalf("comparisons without the policies to compare with: %+v", res)
	}
	res, err = Sweep(context.Background(), recs, ideal, base, []string{"kvdir", "prefix"},
		Options{SLO: time.Hour, MinMultiplier: 0.25, MaxMultiplier: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Policies {
		if p.CapacityMultiplier != 4 || !p.Capped || len(p.Points) != 3 || *p.VsBestBaseline != 1 {
			t.Fatalf("lenient SLO: %+v", p)
		}
	}
	if res.BestBaseline != "prefix" {
		t.Fatalf("best baseline %q", res.BestBaseline)
	}
}

func TestSweepErrors(t *testing.T) {
	recs, ideal := smallTrace(t)
	base := baseConfig(t)
	for name, o := range map[string]Options{
		"no SLO":          {},
		"bad precision":   {SLO: time.Second, Precision: -1},
		"min above max":   {SLO: time.Second, MinMultiplier: 4, MaxMultiplier: 2},
		"negative worker": {SLO: time.Second, Parallel: -1},
	} {
		if _, err := Sweep(context.Background(), recs, ideal, base, []string{"kvdir"}, o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Sweep(context.Background(), recs[:1], ideal[:1], base, []string{"kvdir"}, Options{SLO: time.Second}); !errors.Is(err, ErrBadOptions) {
		t.Errorf("one record: %v", err)
	}
	if _, err := Sweep(context.Background(), recs, ideal, base, []string{"no-such"}, Options{SLO: time.Second}); err == nil {
		t.Error("unknown policy accepted")
	}
}

// TestOutputs writes a sweep's files and reads the JSON back.
func TestOutputs(t *testing.T) {
	recs, ideal := smallTrace(t)
	res, err := Sweep(context.Background(), recs, ideal, baseConfig(t), []string{"kvdir", "round-robin", "prefix"},
		Options{SLO: 200 * time.Millisecond, Precision: 0.2, Trace: "small.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "sweep"}
	base := filepath.Join(t.TempDir(), "c")
	files, err := WriteFiles(res, base, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("files %v", files)
	}
	png, err := os.ReadFile(base + SuffixP90)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("chart: %v", err)
	}
	back, err := ReadFile(base + ".json")
	if err != nil {
		t.Fatal(err)
	}
	if back.Tool != "sweep" || back.SLOMs != 200 || len(back.Policies) != 3 || back.Policies[0].CapacityRPS != res.Policies[0].CapacityRPS {
		t.Fatalf("read back %+v", back)
	}
	var md bytes.Buffer
	if err := Markdown(&md, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| kvdir |", "| round-robin |", "Best baseline: prefix", "**"} {
		if !strings.Contains(md.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, md.String())
		}
	}
	figs := res.Figures()
	names := make([]string, len(figs))
	for i, f := range figs {
		names[i] = f.Name
	}
	for _, want := range []string{"pooled_hit_rate", "kvdir.capacity_rps", "kvdir.vs_round_robin", "kvdir.vs_best_baseline", "prefix.goodput_rps"} {
		if !slices.Contains(names, want) {
			t.Fatalf("figures %v lack %s", names, want)
		}
	}
}
