package capacity

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/benchjson"
)

// SuffixP90 is the chart's suffix, appended to the base name of the files.
const SuffixP90 = "-p90.png"

// Figures are r's headline numbers: the pooled bound and, per policy
// (named policy.field), its capacity, goodput and capacity ratios.
func (r *Result) Figures() []benchjson.Figure {
	out := []benchjson.Figure{{Name: "pooled_hit_rate", Unit: "fraction", Measured: r.PooledHitRate,
		Note: "hit rate of one LRU cache of the cluster's KV serving the whole trace"}}
	for _, p := range r.Policies {
		add := func(field, unit string, v float64, note string) {
			out = append(out, benchjson.Figure{Name: p.Name + "." + field, Unit: unit, Measured: v, Note: note})
		}
		add("capacity_rps", "requests/s", p.CapacityRPS, fmt.Sprintf("highest request rate with p90 TTFT <= %s", secs(r.SLOMs)))
		add("capacity_multiplier", "x", p.CapacityMultiplier, "capacity / the trace's own request rate")
		add("goodput_rps", "requests/s", p.GoodputRPS, "requests within the SLO per second at the capacity")
		if p.VsRoundRobin != nil {
			add("vs_round_robin", "x", *p.VsRoundRobin, "capacity / round-robin's")
		}
		if p.VsBestBaseline != nil {
			add("vs_best_baseline", "x", *p.VsBestBaseline, "capacity / the best baseline's ("+r.BestBaseline+")")
		}
		if p.TTFTP90AtBestBaselineMs != nil {
			add("ttft_p90_at_best_baseline_ms", "ms", *p.TTFTP90AtBestBaselineMs, "p90 TTFT at the best baseline's capacity")
		}
	}
	return out
}

// WriteJSON writes r as a results envelope.
func WriteJSON(path string, r *Result) error {
	res := &benchjson.Results{Tool: r.Tool, Command: r.Command, Machine: r.Machine, Started: r.Started, Figures: r.Figures()}
	if err := res.SetDetails(r); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	if err := res.Validate(); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	b, err := benchjson.Encode(res)
	if err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	return nil
}

// ReadFile reads a result written by WriteJSON.
func ReadFile(path string) (*Result, error) {
	var r Result
	res, err := benchjson.ReadDetails(path, &r)
	if err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	r.Tool, r.Command, r.Machine, r.Started = res.Tool, res.Command, res.Machine, res.Started
	return &r, nil
}

// Markdown writes r as a Markdown section: the setting, then one row per
// policy in r's order.
func Markdown(w io.Writer, r *Result) error {
	var b strings.Builder
	if len(r.Command) > 0 {
		fmt.Fprintf(&b, "`%s`\n\n", report.CommandLine(r.Command))
	}
	fmt.Fprintf(&b, "Capacity at p90 TTFT <= %s: trace `%s` (%d requests over %.1f min, %.3g req/s at its own rate; "+
		"ideal hit rate %.1f %%); %d replicas of `%s`, %d KV blocks of %d tokens each (%.2fx the hot working set; "+
		"one pooled LRU cache of the cluster's KV would hit %.1f %%); seed %d; multipliers %.4g..%.4g, precision %.3g.\n\n",
		secs(r.SLOMs), r.Trace, r.Requests, r.DurationSec/60, r.TraceRPS, 100*r.IdealHitRate, r.Replicas, r.Profile,
		r.KVBlocks, r.BlockSize, r.KVToWorkingSet, 100*r.PooledHitRate, r.Seed, r.MinMultiplier, r.MaxMultiplier, r.Precision)
	if r.BestBaseline != "" {
		fmt.Fprintf(&b, "Best baseline: %s (%.3g req/s). Lowest p90 TTFT at its capacity: %s.\n\n",
			r.BestBaseline, r.BestBaselineMultiplier*r.TraceRPS, or(r.LowestP90AtBestBaseline, "–"))
	}
	b.WriteString("| policy | capacity (req/s) | x trace rate | goodput (req/s) | vs round-robin | vs best baseline | " +
		"p90 at best baseline's capacity | hit rate | reuse captured | vs pooled | TTFT p50 | TTFT p90 | TTFT p99 | max share | rejected | runs |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		capRPS := fmt.Sprintf("%.3g", p.CapacityRPS)
		if p.Capped {
			capRPS = ">= " + capRPS
		}
		at := "–"
		if p.TTFTP90AtBestBaselineMs != nil {
			at = secs(*p.TTFTP90AtBestBaselineMs)
			if p.Name == r.LowestP90AtBestBaseline {
				at = "**" + at + "**"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.3g | %.3g | %s | %s | %s | %.1f %% | %.3f | %.3f | %s | %s | %s | %.3f | %d | %d |\n",
			p.Name, capRPS, p.CapacityMultiplier, p.GoodputRPS, times(p.VsRoundRobin), times(p.VsBestBaseline), at,
			100*p.HitRate, p.ReuseCaptured, p.ReuseVsPooled, secs(p.TTFTP50Ms), secs(p.TTFTP90Ms), secs(p.TTFTP99Ms),
			p.MaxReplicaShare, p.Rejected, len(p.Points))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func times(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.2fx", *v)
}

// secs formats milliseconds as seconds with three significant digits.
func secs(ms float64) string {
	s := ms / 1000
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 10:
		return fmt.Sprintf("%.1f s", s)
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// Chart draws every policy's p90 TTFT (log scale) against the request rate
// of each of its runs, the SLO as a horizontal line, into the PNG at path.
func Chart(r *Result, path string) error {
	if len(r.Policies) == 0 {
		return fmt.Errorf("capacity: chart: no policies")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("capacity: chart: %w", err)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("p90 TTFT against request rate — %s, %d × %s, %d KV blocks each",
		filepath.Base(r.Trace), r.Replicas, r.Profile, r.KVBlocks)
	p.X.Label.Text = "request rate (req/s)"
	p.Y.Label.Text = "p90 time to first token (s, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	const floor = 1e-3 // seconds: the log scale needs positive values
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for i, pol := range r.Policies {
		pts := make(plotter.XYs, 0, len(pol.Points))
		for _, pt := range pol.Points {
			pts = append(pts, plotter.XY{X: pt.RateRPS, Y: math.Max(pt.TTFTP90Ms/1000, floor)})
			xmin, xmax = math.Min(xmin, pt.RateRPS), math.Max(xmax, pt.RateRPS)
		}
		if len(pts) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("capacity: chart: %w", err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		l.Width = vg.Points(1.5)
		s.Color = l.Color
		s.Shape = plotutil.Shape(i)
		p.Add(l, s)
		p.Legend.Add(pol.Name, l, s)
	}
	if xmin <= xmax {
		slo, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: r.SLOMs / 1000}, {X: xmax, Y: r.SLOMs / 1000}})
		if err != nil {
			return fmt.Errorf("capacity: chart: %w", err)
		}
		slo.Width = vg.Points(1)
		slo.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(slo)
		p.Legend.Add("SLO "+secs(r.SLOMs), slo)
	}
	if err := p.Save(10*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("capacity: chart %s: %w", path, err)
	}
	return nil
}

// ticks125 marks a log axis at 1, 2 and 5 times the powers of ten, labelled
// (LogTicks labels only the powers, often one or none on a TTFT range).
type ticks125 struct{}

// Ticks returns the marks within [lo, hi].
func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	if !(lo > 0) || !(hi >= lo) {
		return out
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				out = append(out, plot.Tick{Value: v, Label: strconvG(v)})
			}
		}
	}
	return out
}

func strconvG(v float64) string { return fmt.Sprintf("%g", v) }

// WriteFiles writes base.json, base.md and, with charts, base-p90.png, and
// returns the files written.
func WriteFiles(r *Result, base string, charts bool) ([]string, error) {
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	files := []string{base + ".json", base + ".md"}
	if err := WriteJSON(files[0], r); err != nil {
		return nil, err
	}
	var md strings.Builder
	if err := Markdown(&md, r); err != nil {
		return nil, err
	}
	if err := os.WriteFile(files[1], []byte(md.String()), 0o644); err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	if charts {
		if err := Chart(r, base+SuffixP90); err != nil {
			return files, err
		}
		files = append(files, base+SuffixP90)
	}
	return files, nil
}
