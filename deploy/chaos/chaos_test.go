package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit"
)

// Results are the details of bench/results/chaos.json, a results envelope
// (internal/benchjson) whose figures are each fault's headline numbers
// (figures).
type Results struct {
	Faults []FaultResult `json:"faults"`
	Notes  []string      `json:"notes"`
}

// figures are the faults' headline numbers, named fault.field.
func (r *Results) figures() []benchjson.Figure {
	var out []benchjson.Figure
	for _, f := range r.Faults {
		out = append(out,
			benchjson.Figure{Name: f.Name + ".failed_requests", Unit: "requests", Measured: float64(f.FailedRequests),
				Note: "requests that failed during the fault (one in flight at a killed router is allowed)"},
			benchjson.Figure{Name: f.Name + ".lost_acknowledged_batches", Unit: "batches", Target: benchjson.Max(0),
				Measured: float64(f.LostAcknowledgedBatches), Note: "acknowledged event batches missing from the directory afterwards"},
			benchjson.Figure{Name: f.Name + ".leader_recovery_seconds", Unit: "s", Measured: f.LeaderRecoverySeconds,
				Note: "from the fault to a leader every reachable node agrees on"},
			benchjson.Figure{Name: f.Name + ".view_converged_seconds", Unit: "s", Measured: f.ViewConvergedSeconds,
				Note: "from the repair until the directory's view equals what the engines hold"},
			benchjson.Figure{Name: f.Name + ".following_router_fallbacks", Unit: "requests", Measured: float64(f.FollowingFallbacks),
				Note: "requests a router following the log placed by hashing, without its replica or the directory"},
			benchjson.Figure{Name: f.Name + ".requests_per_second", Unit: "requests/s", Target: benchjson.Min(100),
				Measured: f.RequestsPerSecond, Note: "requests completed through the routers per second during the fault window"},
			benchjson.Figure{Name: f.Name + ".block_events_per_second", Unit: "events/s", Target: benchjson.Min(100000),
				Measured: f.BlockEventsPerSecond, Note: "block events (stored + removed) the directory acknowledged to the synthetic worker per second during the fault window"})
		if f.Name == "pause-agent" {
			out = append(out, benchjson.Figure{Name: f.Name + ".resume_to_view_seconds", Unit: "s", Target: benchjson.Max(5),
				Measured: f.ResumeToViewSeconds, Note: "from docker unpause of the agent until the worker's view equals the engine's cache"})
		}
	}
	return out
}

// fault is one fault of the chaos suite (deploy/README.md, "Chaos tests"): inject breaks something and repairs it;
// it returns when the repair action completed and records what it did.
type fault struct {
	name   string
	inject func(h *harness, r *FaultResult) (repaired time.Time, err error)
	// noFallback: a router following the log must not fall back to
	// hashing during this fault.
	noFallback bool
}

var faults = []fault{
	{name: "kill-leader", inject: killNode(true), noFallback: true},
	{name: "kill-follower", inject: killNode(false)},
	{name: "kill-followed-node", inject: killFollowedNode, noFallback: true},
	{name: "partition-follower", inject: partition(false)},
	{name: "partition-leader", inject: partition(true)},
	{name: "rolling-restart", inject: rollingRestart},
	{name: "restart-engine", inject: restartEngine},
	{name: "restart-agent", inject: restartAgent},
	{name: "restart-router", inject: restartRouter},
	{name: "pause-agent", inject: pauseAgent},
	{name: "slow-follower-leader-loss", inject: slowFollowerLeaderLoss},
	{name: "disk-full", inject: diskFull},
	{name: "clock-skew", inject: clockSkew},
}

// TestChaos brings up the compose cluster, puts steady load on both routers,
// injects the faults below one after another and checks the invariants
// after each; it writes bench/results/chaos.json (or $KVDIR_CHAOS_OUT).
func TestChaos(t *testing.T) {
	testkit.SkipIfShort(t, "drives the compose cluster on Docker")
	if os.Getenv("KVDIR_CHAOS") != "1" {
		t.Skip("chaos tests need Docker; run them with `make test-chaos` (KVDIR_CHAOS=1)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 24*time.Minute)
	defer cancel()
	start := time.Now()
	h := newHarness(t, ctx)
	t.Logf("cluster up in %.1f s", time.Since(start).Seconds())

	results := benchjson.New("chaos")
	results.Command = []string{"make", "test-chaos"}
	res := Results{
		Notes: []string{
			"Each fault runs under steady load (internal/loadgen chat sessions, open loop, through both routers) and ends with the checks described in deploy/README.md (Chaos tests).",
			"leader_recovery_seconds: from the fault to a leader all reachable directory nodes agree on (for rolling-restart, the longest of the three restarts).",
			"view_converged_seconds: from the repair (container started, network reconnected) until the directory's view of every probe prompt on every worker equals what the engine holds.",
		},
	}
	only := os.Getenv("KVDIR_CHAOS_ONLY") // comma-separated fault names, for debugging
	for _, f := range faults {
		if only != "" && !strings.Contains(","+only+",", ","+f.name+",") {
			continue
		}
		r := h.run(f)
		res.Faults = append(res.Faults, r)
		t.Logf("%s: ok=%v failed=%d lost=%d leader=%.2fs view=%.2fs requests=%d (%.0f s) window %.1f s: %.0f requests/s, %.0f block events/s; %s %v",
			r.Name, r.OK, r.FailedRequests, r.LostAcknowledgedBatches, r.LeaderRecoverySeconds,
			r.ViewConvergedSeconds, r.Requests, r.DurationSeconds, r.WindowSeconds, r.RequestsPerSecond, r.BlockEventsPerSecond, r.Detail, r.Problems)
		t.Logf("%s: %s", r.Name, r.followingSummary())
		t.Logf("%s: busy cores: %s", r.Name, cpuString(r.CPUCores))
		if ctx.Err() != nil {
			break
		}
	}
	out := env("KVDIR_CHAOS_OUT", filepath.Join(h.root, "bench/results/chaos.json"))
	results.Figures = res.figures()
	if err := results.SetDetails(res); err != nil {
		t.Error(err)
	} else if err := benchjson.Write(out, results); err != nil {
		t.Errorf("write %s: %v", out, err)
	}
	for _, r := range res.Faults {
		if !r.OK {
			t.Errorf("%s failed: %s", r.Name, strings.Join(r.Problems, "; "))
		}
	}
	if len(res.Faults) < len(faults) && only == "" {
		t.Errorf("only %d of %d faults ran", len(res.Faults), len(faults))
	}
	t.Logf("chaos run took %.0f s", time.Since(start).Seconds())
}

// run runs one fault under load and checks the invariants.
func (h *harness) run(f fault) (r FaultResult) {
	r.Name = f.name
	begin := time.Now()
	defer func() {
		r.DurationSeconds = time.Since(begin).Seconds()
		r.OK = len(r.Problems) == 0
	}()
	if lv := h.dir.Leader(h.ctx); lv.Leader != "" {
		r.LeaderBefore = lv.Leader
	}
	fallbacks := h.fallbacks()
	follow := h.followCounts()
	r.FollowingRouters = len(follow)
	cpu0 := h.sampleCPU(h.ctx)
	load := StartLoad(h.ctx, h.loadConfig())
	regs0, _, gap0 := h.synth.Stats()
	acked0 := h.synth.Acked()
	var wAcked, sentInWindow uint64 // the fault window's, set once it ends
	h.synth.Resume()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		st, err := load.Stop()
		if err != nil {
			r.problem("load: %v", err)
		}
		r.Requests = st.Requests
		r.FailedRequests = st.Errors
		if st.Errors > 0 {
			h.t.Logf("%s: first client error: %s", f.name, st.FirstErr)
		}
		if err := h.synth.Pause(30 * time.Second); err != nil {
			r.problem("%v", err)
		}
		r.CPUCores = coresBetween(cpu0, h.sampleCPU(h.ctx))
		el := time.Since(begin).Seconds()
		r.LoadRequestsPerSecond = float64(completed(h.lb.Records(begin), begin, time.Now())) / el
		r.LoadEventsPerSecond = float64(h.synth.Acked()-acked0) / el
		// The window's events, once the flush above has had every batch
		// acknowledged. Acknowledgements come in order within an epoch;
		// across a registration the old epoch's unacknowledged batches
		// are lost, so then only what the window itself committed counts.
		if regs, _, _ := h.synth.Stats(); regs == regs0 && r.WindowSeconds > 0 {
			r.BlockEventsPerSecond = float64(min(sentInWindow, h.synth.Acked()-wAcked)) / r.WindowSeconds
		} else {
			r.BlockEventsPerSecond = r.WindowCommitEventsPerSecond
		}
	}
	defer stop()
	if err := h.waitRequests(begin, warmRequests, 60*time.Second); err != nil {
		r.problem("load before the fault: %v", err)
		return r
	}
	if ramp := time.Until(begin.Add(rampUp)); ramp > 0 {
		select { // the fault hits the steady load, not its ramp
		case <-time.After(ramp):
		case <-h.ctx.Done():
			return r
		}
	}

	// The fault and its repair, under load. From the repair on, the
	// directory must come to reflect everything the engines stored up to
	// it, and nothing they do not hold, while the load goes on: that is
	// checked alongside the fault's own recovery (rejoin, readiness).
	type viewResult struct {
		sec    float64
		probes int
		err    error
	}
	views := make(chan viewResult, 1)
	started := false
	h.onRepair = func(t time.Time) {
		if started {
			return
		}
		started = true
		go func() {
			sec, n, err := h.waitView(begin, t, t, viewBound)
			views <- viewResult{sec, n, err}
		}()
	}
	wStart, wSent := time.Now(), h.synth.Sent()
	wAcked = h.synth.Acked()
	repaired, err := f.inject(h, &r)
	if err != nil {
		r.problem("%v", err)
	}
	wEnd := time.Now()
	r.WindowSeconds = wEnd.Sub(wStart).Seconds()
	r.RequestsPerSecond = float64(completed(h.lb.Records(wStart), wStart, wEnd)) / r.WindowSeconds
	if os.Getenv("KVDIR_CHAOS_DEBUG") == "1" {
		h.t.Logf("%s: load from %.1f s before the fault window to its end: %s", f.name, rampUp.Seconds(), timeline(h.lb.Records(begin), wStart.Add(-rampUp), wEnd))
	}
	r.WindowCommitEventsPerSecond = float64(h.synth.Acked()-wAcked) / r.WindowSeconds
	sentInWindow = h.synth.Sent() - wSent
	if !repaired.IsZero() {
		h.onRepair(repaired)
	}
	h.onRepair = nil
	if !started {
		return r
	}
	v := <-views
	r.ViewConvergedSeconds, r.ViewProbes = v.sec, v.probes
	if f.name == "pause-agent" {
		r.ResumeToViewSeconds = v.sec
	}
	switch {
	case v.err != nil:
		r.problem("view under load: %v", v.err)
	case v.sec > viewBound.Seconds():
		// A poll begun before the deadline can end past it: the bound
		// holds for the view, not for the poll.
		r.problem("view under load: equal %.1fs after the repair, past the %v bound", v.sec, viewBound)
	}
	if err := h.waitRequests(time.Now(), afterRequests, 60*time.Second); err != nil {
		r.problem("load after the repair: %v", err)
	}
	stop()

	// Quiescent checks.
	if lv := h.dir.Leader(h.ctx); lv.Leader != "" {
		r.LeaderAfter = lv.Leader
	}
	idx, err := h.digestsAgree()
	r.DigestsAgreeAt = idx
	if err != nil {
		r.problem("digests: %v", err)
	}
	h.replicasEqual(&r)
	if _, _, err := h.waitView(begin, time.Now(), time.Now(), viewBound); err != nil {
		r.problem("view after the load: %v", err)
	}
	ws, err := h.workers()
	if err != nil {
		r.problem("workers: %v", err)
	}
	for _, e := range engineNames {
		if w := ws[e]; w == nil || w.State.String() != "WORKER_STATE_ACTIVE" {
			r.problem("worker %s is not ACTIVE: %v", e, w.GetState())
		}
	}
	lost, why := h.seqs.Lost(h.ctx, 10*time.Second)
	for _, w := range why {
		r.problem("acknowledged batches: %s", w)
	}
	lost += h.syntheticHeld(&r, regs0, gap0)
	for _, a := range agentNames {
		logs, err := h.d.Logs(h.ctx, a, begin)
		if err != nil {
			r.problem("%v", err)
			continue
		}
		n, l := GapRefusals(logs)
		r.GapRefusals += n
		lost += l
		if n > 0 {
			r.problem("%s: %d GAP refusals (%d acknowledged batches lost)", a, n, l)
		}
	}
	r.LostAcknowledgedBatches = lost
	h.classify(&r, begin)
	asked, bad := h.crossCheck(begin, 6)
	r.EngineProbes = asked
	for _, b := range bad {
		r.problem("engine cross-check: %s", b)
	}
	for i, n := range h.fallbacks() {
		if n < 0 {
			continue
		}
		if n >= fallbacks[i] {
			n -= fallbacks[i] // else the router restarted and counts from 0
		}
		r.FallbackRequests += int(n)
	}
	h.followResults(&r, follow, f.noFallback)
	return r
}

// completed counts the requests that completed without failing between
// from and to.
// timeline describes, second by second from from to to, the requests
// started and completed and the median time to their response headers.
func timeline(recs []Record, from, to time.Time) string {
	var parts []string
	for t := from; t.Before(to); t = t.Add(time.Second) {
		end := t.Add(time.Second)
		if end.After(to) {
			end = to
		}
		started := 0
		var waits []time.Duration
		for _, rec := range recs {
			if !rec.Start.Before(t) && rec.Start.Before(end) {
				started++
				if !rec.Header.IsZero() {
					waits = append(waits, rec.Header.Sub(rec.Start))
				}
			}
		}
		slices.Sort(waits)
		med := time.Duration(0)
		if len(waits) > 0 {
			med = waits[len(waits)/2]
		}
		parts = append(parts, fmt.Sprintf("[+%.0fs started %d done %d headers p50 %v]", t.Sub(from).Seconds(), started, completed(recs, t, end), med.Round(time.Millisecond)))
	}
	return strings.Join(parts, " ")
}

func completed(recs []Record, from, to time.Time) int {
	n := 0
	for _, rec := range recs {
		if !rec.End.IsZero() && !rec.Failed() && !rec.End.Before(from) && !rec.End.After(to) {
			n++
		}
	}
	return n
}

// syntheticHeld checks, with the synthetic worker paused and flushed,
// that every node holds its epoch and at least the last batch it had
// acknowledged, and records its problems and registrations during the
// fault; it returns the acknowledged batches lost.
func (h *harness) syntheticHeld(r *FaultResult, regs0 int, gap0 int64) int {
	regs, _, gap := h.synth.Stats()
	r.SyntheticRegistrations = regs - regs0
	for _, p := range h.synth.TakeProblems() {
		r.problem("%s", p)
	}
	lost := int(gap - gap0)
	if lost > 0 {
		r.problem("the synthetic worker's batches were refused with GAP: %d acknowledged batches lost", lost)
	}
	epoch, seq := h.synth.Position()
	err := testkit.Poll(h.ctx, 10*time.Second, "every node to hold the synthetic worker's acknowledged batches", func() (bool, string) {
		var bad []string
		for name, ws := range h.seqs.Poll(h.ctx) {
			found := false
			for _, w := range ws {
				if w.GetSpec().GetId() != syntheticWorker {
					continue
				}
				found = true
				if w.Epoch != epoch || w.AppliedSeq < seq {
					bad = append(bad, fmt.Sprintf("%s: epoch %d applied_seq %d, acknowledged %d in epoch %d", name, w.Epoch, w.AppliedSeq, seq, epoch))
				}
			}
			if !found {
				bad = append(bad, name+": no synthetic worker")
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
	if err != nil {
		r.problem("synthetic worker: %v", err)
	}
	return lost
}

// fallbacks returns each router's kvdir_router_fallbacks_total (requests
// placed without the directory), -1 when unreadable.
func (h *harness) fallbacks() []float64 {
	out := make([]float64, len(h.routerURLs))
	for i, u := range h.routerURLs {
		n, err := metric(h.ctx, h.hc, u+"/metrics", "kvdir_router_fallbacks_total")
		if err != nil {
			n = -1
		}
		out[i] = n
	}
	return out
}

// killedRouter is set by restart-router: which router was killed and when.
type killedRouter struct {
	index    int
	at, done time.Time // docker kill was sent at, and returned at done
}

// classify checks every failed request: only those in flight at a killed
// router are allowed, and the balancer may re-route only then.
func (h *harness) classify(r *FaultResult, since time.Time) {
	recs := h.lb.Records(since)
	failed := 0
	firstReroute := ""
	for _, rec := range recs {
		if rec.Rerouted {
			r.ReroutedBeforeFirstByte++
			if firstReroute == "" {
				firstReroute = rec.Start.Format(time.TimeOnly) + " " + rec.RerouteErr
			}
		}
		if !rec.Failed() && !rec.End.IsZero() {
			continue
		}
		if rec.End.IsZero() {
			r.problem("request at %s never ended", rec.Start.Format(time.TimeOnly))
			continue
		}
		failed++
		k := h.routerKill
		if k != nil && rec.Router == k.index && rec.Start.Before(k.done) && rec.End.After(k.at) {
			r.FailedInFlightAtKilled++
			continue
		}
		r.problem("request at %s via router %d failed: %s", rec.Start.Format(time.TimeOnly), rec.Router+1, rec.Err)
	}
	if failed != r.FailedRequests {
		r.problem("the balancer saw %d failed requests, the client %d", failed, r.FailedRequests)
	}
	if r.ReroutedBeforeFirstByte > 0 && h.routerKill == nil {
		r.problem("%d requests re-routed although no router was killed (first at %s)", r.ReroutedBeforeFirstByte, firstReroute)
	}
	h.routerKill = nil
}

// killNode kills the leader or a follower with SIGKILL, measures the time
// to an agreed leader, and starts the node again.
func killNode(leader bool) func(h *harness, r *FaultResult) (time.Time, error) {
	return func(h *harness, r *FaultResult) (time.Time, error) {
		target, lv, err := h.pick(leader)
		if err != nil {
			return time.Time{}, err
		}
		r.Target = target
		at := time.Now()
		if _, err := h.d.Run(h.ctx, "kill", target); err != nil {
			return time.Time{}, err
		}
		not := ""
		if leader {
			not = lv.Leader
		}
		return h.recoverNode(r, target, not, at)
	}
}

// recoverNode follows the kill of target at at: it waits for a leader
// other than not (any when not is ""), records how long that took, starts
// target again and waits for it to rejoin.
func (h *harness) recoverNode(r *FaultResult, target, not string, at time.Time) (time.Time, error) {
	if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 2, not); err != nil {
		return time.Time{}, fmt.Errorf("leader after killing %s: %w", target, err)
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	if _, err := h.d.Run(h.ctx, "start", target); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	return repaired, h.rejoin(target)
}

// pick returns the leader's container, or a follower's.
func (h *harness) pick(leader bool) (string, LeaderView, error) {
	lv, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, "")
	if err != nil {
		return "", lv, err
	}
	if leader {
		return lv.Container, lv, nil
	}
	for _, n := range dirNames {
		if n != lv.Container {
			return n, lv, nil
		}
	}
	return "", lv, fmt.Errorf("no follower")
}

// partition disconnects the leader or a follower from the network for
// partitionHold, then reconnects it.
func partition(leader bool) func(h *harness, r *FaultResult) (time.Time, error) {
	return func(h *harness, r *FaultResult) (time.Time, error) {
		target, lv, err := h.pick(leader)
		if err != nil {
			return time.Time{}, err
		}
		r.Target = target
		at := time.Now()
		if _, err := h.d.Run(h.ctx, "network", "disconnect", Network, target); err != nil {
			return time.Time{}, err
		}
		not := ""
		if leader {
			not = lv.Leader
		}
		_, lerr := h.dir.WaitLeader(h.ctx, leaderBound, 2, not)
		r.LeaderRecoverySeconds = time.Since(at).Seconds()
		if lerr == nil {
			// Keep the partition for its full length, with the load on.
			select {
			case <-h.ctx.Done():
			case <-time.After(time.Until(at.Add(partitionHold))):
			}
		}
		if _, err := h.d.Run(h.ctx, "network", "connect", Network, target); err != nil {
			return time.Time{}, err
		}
		repaired := time.Now()
		h.onRepair(repaired)
		if lerr != nil {
			return repaired, fmt.Errorf("leader while %s was cut off: %w", target, lerr)
		}
		return repaired, h.rejoin(target)
	}
}

// rollingRestart restarts every directory node in turn (SIGTERM: a leader
// hands leadership over), waiting for each to rejoin before the next.
func rollingRestart(h *harness, r *FaultResult) (time.Time, error) {
	r.Target = strings.Join(dirNames, ",")
	var repaired time.Time
	for i, n := range dirNames {
		at := time.Now()
		if _, err := h.d.Run(h.ctx, "restart", "-t", "35", n); err != nil {
			return time.Time{}, err
		}
		if i == len(dirNames)-1 {
			h.onRepair(time.Now())
		}
		if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 2, ""); err != nil {
			return time.Time{}, fmt.Errorf("leader after restarting %s: %w", n, err)
		}
		r.LeaderRecoverySeconds = max(r.LeaderRecoverySeconds, time.Since(at).Seconds())
		if i == len(dirNames)-1 {
			repaired = time.Now()
		}
		if err := h.rejoin(n); err != nil {
			return time.Time{}, fmt.Errorf("%s after its restart: %w", n, err)
		}
	}
	return repaired, nil
}

// restartEngine drains an engine's worker (routers stop placing requests
// on it), waits until the engine is idle, restarts it (empty cache, event
// sequence from 0) and sends it one request straight away, as a readiness
// probe would, so that its agent sees the restart and registers again.
func restartEngine(h *harness, r *FaultResult) (time.Time, error) {
	e := engineNames[1]
	r.Target = e
	before, err := h.workers()
	if err != nil {
		return time.Time{}, err
	}
	if out, err := h.kvdirctlRun("drain", e); err != nil {
		return time.Time{}, fmt.Errorf("kvdirctl drain: %w: %s", err, out)
	}
	u, err := h.engine(e, false)
	if err != nil {
		return time.Time{}, err
	}
	err = testkit.Poll(h.ctx, drainBound, "the drained engine to go idle", func() (bool, string) {
		busy := 0.0
		for _, m := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
			v, err := metric(h.ctx, h.hc, u+"/metrics", m)
			if err != nil {
				return false, err.Error()
			}
			busy += v
		}
		for _, ru := range h.routerURLs {
			v, err := metric(h.ctx, h.hc, ru+"/metrics", "kvdir_router_inflight", `worker="`+e+`"`)
			if err != nil {
				return false, err.Error()
			}
			busy += v
		}
		return busy == 0, fmt.Sprintf("%s still has %v requests", e, busy)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("draining %s: %w", e, err)
	}
	h.model.Restarted(e, time.Now())
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "restart", "-t", "10", e); err != nil {
		return time.Time{}, err
	}
	if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, ""); err != nil {
		return time.Time{}, err
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	if err := h.engineUp(e); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	n, err := h.warmUntil(e, func() (bool, string) { return h.registered(e, before[e].GetEpoch(), 0) })
	r.EngineWarmups = n
	h.onRepair(repaired)
	if err != nil {
		return repaired, fmt.Errorf("registration after the engine's restart: %w", err)
	}
	return repaired, nil
}

// restartAgent restarts an agent (SIGTERM: it flushes and deregisters; the
// new one registers and rebuilds the worker from the engine's replay).
func restartAgent(h *harness, r *FaultResult) (time.Time, error) {
	a, w := agentNames[2], engineNames[2]
	r.Target = a
	before, err := h.workers()
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "restart", "-t", "10", a); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, ""); err != nil {
		return repaired, err
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	n, err := h.warmUntil(w, func() (bool, string) { return h.registered(w, before[w].GetEpoch(), before[w].GetBlocks()) })
	r.EngineWarmups = n
	if err != nil {
		return repaired, fmt.Errorf("%s rebuilt after its agent's restart: %w", w, err)
	}
	return repaired, nil
}

// restartRouter kills a router (SIGKILL: requests in flight there fail)
// and starts it again.
func restartRouter(h *harness, r *FaultResult) (time.Time, error) {
	i := 0
	r.Target = routerNames[i]
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "kill", routerNames[i]); err != nil {
		return time.Time{}, err
	}
	h.routerKill = &killedRouter{index: i, at: at, done: time.Now()}
	if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, ""); err != nil {
		return time.Time{}, err
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	if _, err := h.d.Run(h.ctx, "start", routerNames[i]); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	return repaired, h.lb.waitRouters(h.ctx, rejoinBound)
}
