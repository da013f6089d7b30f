package replay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/workload"
)

// Options describe a live comparison: a fleet of real processes started for
// it, a trace replayed under each policy.
type Options struct {
	Trace          string // the trace's file name, for the report
	Records        []workload.Record
	TraceBlockSize int
	Replicas       int     // enginesim + agent pairs
	Profile        string  // enginesim --profile
	KVBlocks       int     // enginesim --kv-blocks (0: its default)
	TimeScale      float64 // enginesim --time-scale and the trace's compression
	Model          string
	Policies       []string // router policies, and HAProxy for the HAProxy baseline
	Routers        int      // routers per policy
	RouterArgs     []string // extra router flags
	Dir            string   // binaries and data
	Command        []string // the argv, for the report
	Log            *slog.Logger
	// Progress receives a progress bar (nil: none).
	Progress io.Writer
}

// RunEndpoint replays o's trace once against an OpenAI endpoint that kvbench
// did not start (o.Policies, Replicas, Profile and KVBlocks are not used; the
// endpoint's caches are not reset). Requests are attributed to the worker an
// X-Kvdir-Worker response header names, when it names one of workers, and
// otherwise to one replica named "endpoint".
func RunEndpoint(ctx context.Context, o Options, url string, workers []string) (*report.Report, error) {
	engines := []Engine{{ID: "endpoint"}}
	unattributed := len(workers) == 0
	if !unattributed {
		engines = nil
		for _, w := range workers {
			engines = append(engines, Engine{ID: w})
		}
	}
	ideal := workload.IdealHits(o.Records, o.TraceBlockSize, 16)
	rep := report.ForTrace("replay", o.Trace, o.Records, ideal, o.TraceBlockSize, 16, len(engines), o.Profile, o.KVBlocks, 1)
	rep.Command = o.Command
	rep.Settings = map[string]any{"endpoint": url, "wall_time_scale": o.TimeScale, "model": o.Model,
		"session_key": "session_id, else \"h\" + first hash id", "trace_block_size": o.TraceBlockSize}
	cfg := Config{Records: o.Records, TraceBlockSize: o.TraceBlockSize, EngineBlockSize: 16, Model: o.Model,
		URLs: []string{url}, TimeScale: o.TimeScale, Engines: engines, Unattributed: unattributed}
	var bar *progressBar
	if o.Progress != nil {
		bar = newProgressBar(o.Progress, "endpoint", len(o.Records))
		cfg.Progress = bar.set
	}
	res, err := Run(ctx, cfg)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		o.Log.Warn("requests failed", "errors", res.Errors, "first", res.FirstErr)
	}
	var ids []string
	for _, e := range engines {
		ids = append(ids, e.ID)
	}
	p, err := summarize("endpoint", ids, res)
	if err != nil {
		return nil, err
	}
	rep.Policies = []report.Policy{p}
	return rep, nil
}

// RunComparison starts the fleet, replays the trace under every policy and
// returns the report. Every process it started is stopped before it
// returns, also when ctx is cancelled.
func RunComparison(ctx context.Context, o Options) (*report.Report, error) {
	if o.Model == "" {
		o.Model = o.Profile
	}
	if o.KVBlocks <= 0 {
		o.KVBlocks = 32768 // enginesim's default
	}
	args := []string{"--time-scale", fmt.Sprint(o.TimeScale), "--profile", o.Profile, "--kv-blocks", fmt.Sprint(o.KVBlocks)}
	o.Log.Info("starting processes", "directory_nodes", 3, "enginesims_with_agents", o.Replicas, "profile", o.Profile, "time_scale", o.TimeScale)
	f, err := fleet.Start(ctx, fleet.Config{Dir: o.Dir, Engines: o.Replicas, Model: o.Model, EngineArgs: args})
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	ideal := workload.IdealHits(o.Records, o.TraceBlockSize, 16)
	rep := report.ForTrace("replay", o.Trace, o.Records, ideal, o.TraceBlockSize, 16, o.Replicas, o.Profile, o.KVBlocks, 1)
	rep.Command = o.Command
	rep.Settings = map[string]any{"wall_time_scale": o.TimeScale, "routers_per_policy": max(o.Routers, 1), "directory_nodes": 3, "model": o.Model,
		"engine": "cmd/enginesim", "session_key": "session_id, else \"h\" + first hash id", "trace_block_size": o.TraceBlockSize}
	fallbacks := map[string]map[string]int{}
	rep.Settings["router_args"] = strings.Join(o.RouterArgs, " ")
	rep.Settings["router_fallbacks"] = fallbacks
	sendLag := map[string]int64{}
	lookups := map[string]map[string]float64{}
	rep.Settings["directory_lookup"] = lookups
	rep.Settings["client_send_lag_max_wall_ms"] = sendLag
	c := &Compare{Fleet: f, Routers: o.Routers, RouterArgs: o.RouterArgs, Log: o.Log,
		Base: Config{Records: o.Records, TraceBlockSize: o.TraceBlockSize, EngineBlockSize: 16, Model: o.Model, TimeScale: o.TimeScale}}
	for _, p := range o.Policies {
		var bar *progressBar
		if o.Progress != nil {
			bar = newProgressBar(o.Progress, p, len(o.Records))
			c.Base.Progress = bar.set
		}
		pol, res, err := c.Run(ctx, p)
		if bar != nil {
			bar.finish()
		}
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p, err)
		}
		if res.Errors > 0 {
			return nil, fmt.Errorf("policy %s: %d of %d requests failed; first: %s\n%s", p, res.Errors, len(o.Records), res.FirstErr, f.Logs(15))
		}
		if res.Fallbacks != nil {
			fallbacks[p] = res.Fallbacks
		}
		sendLag[p] = res.SendLagMax.Milliseconds()
		if p != HAProxy {
			lookups[p] = map[string]float64{"p50_ms_at_most": res.LookupP50Ms, "p99_ms_at_most": res.LookupP99Ms}
		}
		o.Log.Info("policy done", "policy", p, "fallbacks", fmt.Sprint(res.Fallbacks), "lookup_p99_ms_at_most", res.LookupP99Ms, "hit_rate", fmt.Sprintf("%.3f", pol.HitRate), "reuse_captured", fmt.Sprintf("%.3f", pol.ReuseCaptured),
			"ttft_p90_ms", fmt.Sprintf("%.0f", pol.TTFTP90Ms), "wall_s", fmt.Sprintf("%.1f", pol.WallSec))
		rep.Policies = append(rep.Policies, pol)
	}
	return rep, nil
}

// progressBar draws "policy [#####.....] done/total" on one line, redrawn at
// most ten times a second (on a terminal it overwrites itself; elsewhere it
// prints a line every 10 %).
type progressBar struct {
	w           io.Writer
	name        string
	total       int
	tty         bool
	mu          sync.Mutex
	last        time.Time
	lastPercent int
	start       time.Time
}

func newProgressBar(w io.Writer, name string, total int) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressBar{w: w, name: name, total: total, tty: tty, start: time.Now(), lastPercent: -1}
}

func (b *progressBar) set(done, total int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	pct := 100 * done / max(total, 1)
	if b.tty {
		if done < total && time.Since(b.last) < 100*time.Millisecond {
			return
		}
		b.last = time.Now()
		const width = 30
		n := width * done / max(total, 1)
		fmt.Fprintf(b.w, "\r%-14s [%s%s] %d/%d requests %3d%%  %4.0fs", b.name, strings.Repeat("#", n), strings.Repeat(".", width-n), done, total, pct, time.Since(b.start).Seconds())
		return
	}
	if pct/10 != b.lastPercent/10 || done == total {
		b.lastPercent = pct
		fmt.Fprintf(b.w, "%-14s %d/%d requests (%d%%) after %.0fs\n", b.name, done, total, pct, time.Since(b.start).Seconds())
	}
}

func (b *progressBar) finish() {
	if b.tty {
		fmt.Fprintln(b.w)
	}
}
