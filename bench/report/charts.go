package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart file suffixes, appended to the base name given to Charts.
const (
	SuffixTTFTCDF      = "-ttft-cdf.png"
	SuffixReplicaHits  = "-replica-hit-rate.png"
	SuffixQueueOverTim = "-queue-depth.png"
)

// Charts writes r's PNG charts next to each other as base+suffix: the TTFT
// CDF of every policy, every replica's hit rate per policy and, for the
// policies with a queue series, each replica's engine queue over time. It
// returns the files written.
func Charts(r *Report, base string) ([]string, error) {
	if len(r.Policies) == 0 {
		return nil, fmt.Errorf("report: charts: no policies")
	}
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return nil, fmt.Errorf("report: charts: %w", err)
	}
	var files []string
	for _, c := range []struct {
		suffix string
		draw   func(*Report, string) error
	}{
		{SuffixTTFTCDF, ttftCDF},
		{SuffixReplicaHits, replicaHits},
		{SuffixQueueOverTim, queueDepth},
	} {
		path := base + c.suffix
		if err := c.draw(r, path); err != nil {
			return files, fmt.Errorf("report: chart %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

func title(r *Report, what string) string {
	return fmt.Sprintf("%s — %s, %d × %s, %d KV blocks each", what, filepath.Base(r.Trace), r.Replicas, r.Profile, r.KVBlocks)
}

// ttftCDF draws the fraction of requests whose TTFT is at most x, x on a
// log scale.
func ttftCDF(r *Report, path string) error {
	p := plot.New()
	p.Title.Text = title(r, "TTFT CDF")
	p.X.Label.Text = "time to first token (s, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	for i, pol := range r.Policies {
		if len(pol.TTFTCDFMs) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, len(pol.TTFTCDFMs))
		for q, v := range pol.TTFTCDFMs {
			pts = append(pts, plotter.XY{X: math.Max(v/1000, 1e-3), Y: float64(q) / float64(len(pol.TTFTCDFMs)-1)})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(pol.Name, l)
	}
	return p.Save(10*vg.Inch, 6*vg.Inch, path)
}

// replicaHits draws, per policy, one bar per replica: that replica's
// token-weighted prefix-cache hit rate.
func replicaHits(r *Report, path string) error {
	p := plot.New()
	p.Title.Text = title(r, "prefix-cache hit rate per replica")
	p.Y.Label.Text = "hit rate"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	names := make([]string, len(r.Policies))
	for i, pol := range r.Policies {
		names[i] = pol.Name
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	n := max(r.Replicas, 1)
	width := vg.Points(math.Max(2, 60/float64(n)))
	for j := range r.Replicas {
		vals := make(plotter.Values, len(r.Policies))
		for i, pol := range r.Policies {
			if j < len(pol.Replicas) {
				vals[i] = pol.Replicas[j].HitRate
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(j)
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(j)-float64(n-1)/2)
		p.Add(bars)
		if j < len(r.Policies[0].Replicas) {
			p.Legend.Add(r.Policies[0].Replicas[j].ID, bars)
		}
	}
	p.Legend.Top = true
	return p.Save(vg.Length(math.Max(10, float64(len(r.Policies))*1.1))*vg.Inch, 6*vg.Inch, path)
}

// queueDepth draws one panel per policy: each replica's largest engine queue
// per interval over time.
func queueDepth(r *Report, path string) error {
	var pols []*Policy
	for i := range r.Policies {
		if r.Policies[i].Queue != nil {
			pols = append(pols, &r.Policies[i])
		}
	}
	if len(pols) == 0 {
		p := plot.New()
		p.Title.Text = "queue depth: not measured in this run"
		return p.Save(6*vg.Inch, 2*vg.Inch, path)
	}
	cols := min(3, len(pols))
	rows := (len(pols) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	ymax := 1.0
	for _, pol := range pols {
		for _, s := range pol.Queue.Replicas {
			for _, v := range s {
				ymax = math.Max(ymax, float64(v))
			}
		}
	}
	for k, pol := range pols {
		if grid[k/cols] == nil {
			grid[k/cols] = make([]*plot.Plot, cols)
		}
		p := plot.New()
		p.Title.Text = pol.Name
		p.X.Label.Text = "time (min)"
		p.Y.Label.Text = "waiting requests"
		p.Y.Min, p.Y.Max = 0, ymax
		for j, s := range pol.Queue.Replicas {
			pts := make(plotter.XYs, len(s))
			for t, v := range s {
				pts[t] = plotter.XY{X: float64(t) * pol.Queue.IntervalSec / 60, Y: float64(v)}
			}
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(j)
			p.Add(l)
			if k == 0 && j < len(pol.Replicas) {
				p.Legend.Add(pol.Replicas[j].ID, l)
			}
		}
		p.Legend.Top = true
		grid[k/cols][k%cols] = p
	}
	w, h := vg.Length(cols)*4.5*vg.Inch, vg.Length(rows)*3*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for j := range grid {
		for i := range grid[j] {
			if grid[j][i] != nil {
				grid[j][i].Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
