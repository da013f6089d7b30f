package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/loadgen"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/workload"
)

// LeaderKillTool names the leader-kill measure's results (kvbench leader-kill).
const LeaderKillTool = "leader-kill"

// LeaderKillOptions describe the leader-kill measure: one fleet, the trace
// replayed twice under the kvdir policy with routers following the log,
// once undisturbed and once with the directory leader killed mid-trace.
type LeaderKillOptions struct {
	Trace          string
	Records        []workload.Record
	TraceBlockSize int
	Replicas       int
	Profile        string
	KVBlocks       int
	TimeScale      float64
	Model          string
	Routers        int
	RouterArgs     []string // extra router flags (--follow-log is always set)
	// KillAt is the fraction of the trace's requests completed when the
	// leader is killed (default 0.5).
	KillAt float64
	// Window is the trace time around the kill whose hit rate is compared
	// (default one minute: 30 s either side).
	Window time.Duration
	// RestartAfter is the wall time after the kill at which the killed node
	// is started again (default 5 s).
	RestartAfter time.Duration
	Dir          string
	Log          *slog.Logger
}

// LeaderKillDetails are the measure's details in its results file.
type LeaderKillDetails struct {
	Trace           string  `json:"trace"`
	Requests        int     `json:"requests"`
	TimeScale       float64 `json:"wall_time_scale"`
	Replicas        int     `json:"replicas"`
	Routers         int     `json:"routers"`
	RouterArgs      string  `json:"router_args"`
	KilledNode      string  `json:"killed_node"`
	KillTraceSec    float64 `json:"kill_trace_sec"`
	WindowSec       float64 `json:"window_trace_sec"`
	WindowRequests  int     `json:"window_requests"`
	NewLeaderWallMs float64 `json:"new_leader_wall_ms"`
	// Hit rates: cached prompt tokens over prompt tokens, engines' own
	// accounting, over the requests arriving in the window and overall.
	SteadyWindowHitRate float64        `json:"steady_window_hit_rate"`
	KillWindowHitRate   float64        `json:"kill_window_hit_rate"`
	SteadyHitRate       float64        `json:"steady_hit_rate"`
	KillHitRate         float64        `json:"kill_hit_rate"`
	Fallbacks           map[string]int `json:"fallbacks_during_kill_run"`
	Notes               []string       `json:"notes"`
}

// LeaderKill runs the measure and returns its results.
func LeaderKill(ctx context.Context, o LeaderKillOptions) (*benchjson.Results, error) {
	if o.KillAt <= 0 || o.KillAt >= 1 {
		o.KillAt = 0.5
	}
	if o.Window <= 0 {
		o.Window = time.Minute
	}
	if o.RestartAfter <= 0 {
		o.RestartAfter = 5 * time.Second
	}
	if o.Model == "" {
		o.Model = o.Profile
	}
	if o.KVBlocks <= 0 {
		o.KVBlocks = 32768
	}
	if len(o.Records) == 0 || o.TimeScale <= 0 {
		return nil, errors.New("leader-kill: a trace and a positive time scale are required")
	}
	args := []string{"--time-scale", fmt.Sprint(o.TimeScale), "--profile", o.Profile, "--kv-blocks", fmt.Sprint(o.KVBlocks)}
	f, err := fleet.Start(ctx, fleet.Config{Dir: o.Dir, Engines: o.Replicas, Model: o.Model, EngineArgs: args})
	if err != nil {
		return nil, fmt.Errorf("leader-kill: %w", err)
	}
	defer f.Stop()
	routerArgs := append([]string{"--follow-log"}, o.RouterArgs...)
	c := &Compare{Fleet: f, Routers: o.Routers, RouterArgs: routerArgs, Log: o.Log,
		Base: Config{Records: o.Records, TraceBlockSize: o.TraceBlockSize, EngineBlockSize: 16, Model: o.Model, TimeScale: o.TimeScale}}

	o.Log.Info("steady run", "requests", len(o.Records))
	_, steady, err := c.Run(ctx, "kvdir")
	if err != nil {
		return nil, fmt.Errorf("leader-kill: steady run: %w", err)
	}
	if steady.Errors > 0 {
		return nil, fmt.Errorf("leader-kill: steady run: %d requests failed; first: %s", steady.Errors, steady.FirstErr)
	}

	// The second run kills the leader once KillAt of the requests have
	// completed, and starts it again RestartAfter later.
	d := LeaderKillDetails{Trace: o.Trace, Requests: len(o.Records), TimeScale: o.TimeScale, Replicas: o.Replicas,
		Routers: max(o.Routers, 1), RouterArgs: fmt.Sprint(routerArgs), WindowSec: o.Window.Seconds()}
	trigger := int(float64(len(o.Records)) * o.KillAt)
	var fired atomic.Bool
	var wg sync.WaitGroup
	var killErr error
	c.Base.Progress = func(done, _ int) {
		if done < trigger || !fired.CompareAndSwap(false, true) {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			killErr = killLeader(ctx, f, o.RestartAfter, &d)
		}()
	}
	o.Log.Info("run with a leader kill", "after_requests", trigger)
	_, killed, err := c.Run(ctx, "kvdir")
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("leader-kill: run with the kill: %w", err)
	}
	if killErr != nil {
		return nil, fmt.Errorf("leader-kill: %w", killErr)
	}
	if !fired.Load() {
		return nil, errors.New("leader-kill: the kill never fired")
	}
	if killed.Errors > 0 {
		return nil, fmt.Errorf("leader-kill: %d requests failed around the kill; first: %s", killed.Errors, killed.FirstErr)
	}
	d.Fallbacks = killed.Fallbacks

	// The kill's trace time: when the trigger-th request finished.
	var fin []time.Duration
	for _, s := range killed.Samples {
		if s.Replica >= 0 {
			fin = append(fin, s.Finish)
		}
	}
	slices.Sort(fin)
	if len(fin) < trigger || trigger == 0 {
		return nil, fmt.Errorf("leader-kill: only %d requests completed", len(fin))
	}
	at := fin[trigger-1]
	d.KillTraceSec = at.Seconds()
	lo, hi := at-o.Window/2, at+o.Window/2
	var n int
	d.SteadyWindowHitRate, _ = hitRate(steady.Samples, lo, hi)
	d.KillWindowHitRate, n = hitRate(killed.Samples, lo, hi)
	d.WindowRequests = n
	d.SteadyHitRate, _ = hitRate(steady.Samples, 0, 1<<62)
	d.KillHitRate, _ = hitRate(killed.Samples, 0, 1<<62)
	d.Notes = []string{
		"Both runs replay the same trace through the same fleet (3 directory nodes; enginesim + agent pairs; routers with --follow-log), the engines' caches and the directory reset before each.",
		"In the second run the Raft leader is killed with SIGKILL once kill_at of the requests have completed, and started again restart_after (wall) later.",
		"The window is the trace time around the kill; a request counts in it by its arrival. The steady hit rate is the first run's over the same trace window.",
	}
	delta := 100 * (d.SteadyWindowHitRate - d.KillWindowHitRate)
	fallbacks := 0
	for _, v := range d.Fallbacks {
		fallbacks += v
	}
	res := benchjson.New(LeaderKillTool)
	res.Add(benchjson.Figure{Name: "fallbacks", Unit: "requests", Target: benchjson.Max(0), Measured: float64(fallbacks),
		Note: "requests the routers placed by hashing during the run with the leader kill"})
	res.Add(benchjson.Figure{Name: "window_hit_rate_drop_points", Unit: "points", Target: benchjson.Max(2), Measured: delta,
		Note: "steady hit rate minus the hit rate over the minute (trace time) around the kill, in percentage points"})
	res.Add(benchjson.Figure{Name: "steady_window_hit_rate", Unit: "ratio", Measured: d.SteadyWindowHitRate,
		Note: "undisturbed run, same trace window"})
	res.Add(benchjson.Figure{Name: "kill_window_hit_rate", Unit: "ratio", Measured: d.KillWindowHitRate,
		Note: "run with the leader kill, the minute around it"})
	if err := res.SetDetails(d); err != nil {
		return nil, err
	}
	return res, nil
}

// killLeader kills the directory's leader, waits for the next one and
// starts the killed node again after restartAfter.
func killLeader(ctx context.Context, f *fleet.Fleet, restartAfter time.Duration, d *LeaderKillDetails) error {
	l, err := f.Directory.WaitLeader(10 * time.Second)
	if err != nil {
		return fmt.Errorf("leader before the kill: %w", err)
	}
	n := f.Directory.Nodes[l]
	d.KilledNode = n.ID
	at := time.Now()
	n.Kill9()
	if _, err := f.Directory.WaitLeader(30 * time.Second); err != nil {
		return fmt.Errorf("leader after killing %s: %w", n.ID, err)
	}
	d.NewLeaderWallMs = float64(time.Since(at).Microseconds()) / 1e3
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(at.Add(restartAfter))):
	}
	if err := n.Start(); err != nil {
		return fmt.Errorf("restart %s: %w", n.ID, err)
	}
	return testkit.Poll(ctx, 30*time.Second, n.ID+" ready again", func() (bool, string) { return n.Ready() })
}

// hitRate is cached over prompt tokens of the served requests arriving in
// [lo, hi), and how many there were.
func hitRate(samples []loadgen.Sample, lo, hi time.Duration) (float64, int) {
	var cached, prompt, n int
	for _, s := range samples {
		if s.Replica < 0 || s.Rejected || s.Arrival < lo || s.Arrival >= hi {
			continue
		}
		cached += s.CachedTokens
		prompt += s.PromptTokens
		n++
	}
	if prompt == 0 {
		return 0, n
	}
	return float64(cached) / float64(prompt), n
}
