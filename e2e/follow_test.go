package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// metricOf reads one series (name with its labels, as /metrics spells it)
// from url's /metrics; ok is false when the series is absent.
func metricOf(url, series string) (v float64, ok bool, err error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, series+" "), 64)
			return v, err == nil, err
		}
	}
	return 0, false, sc.Err()
}

// TestRoutersFollowTheLog runs routers with --follow-log: once a router's
// replica of the directory is in sync it answers every match itself, and
// turn 2 of each session, through the router that did not place turn 1,
// still lands where turn 1's blocks are.
func TestRoutersFollowTheLog(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "200ms", "--follow-log", "--share-intents=false"}})
	r0, r1 := f.Routers[0].URL, f.Routers[1].URL
	local := `kvdir_router_matches_total{group="default",source="local"}`
	remote := `kvdir_router_matches_total{group="default",source="directory"}`
	// A router's replica is in sync once it answers a match itself.
	for _, r := range []string{r0, r1} {
		testkit.Eventually(t, 15*time.Second, r+" to answer a match from its replica", func() (bool, string) {
			c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{{Role: "user", Content: systemPrompt(99)}}}
			if _, err := explainWith(ctx, r, "warm-up", c, nil); err != nil {
				return false, err.Error()
			}
			v, ok, err := metricOf(r, local)
			return ok && v > 0, fmt.Sprint(v, ok, err)
		})
	}
	before, _, err := metricOf(r1, remote)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		turnTwoFollowsTurnOne(t, ctx, r0, r1, fmt.Sprintf("follow-%d", i), i, turnCheck{})
	}
	after, _, err := metricOf(r1, remote)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("router 1 asked the directory %v times while its replica was in sync", after-before)
	}
	if lag, ok, err := metricOf(r1, `kvdir_router_view_lag_entries{group="default"}`); !ok || err != nil || lag > 1000 {
		t.Fatalf("router 1's view lag: %v (present %v, %v)", lag, ok, err)
	}
}

// TestRoutersKeepTheirViewWithoutTheDirectory kills every directory node
// under --follow-log routers: they keep placing from their replica (no
// fallback to hashing) and say it is stale once the directory has been
// silent for --follow-stale-after; past --follow-max-stale they fall back.
func TestRoutersKeepTheirViewWithoutTheDirectory(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "200ms", "--follow-log",
			"--follow-stale-after", "1s", "--follow-max-stale", "8s"}})
	r0, r1 := f.Routers[0].URL, f.Routers[1].URL
	a1, _ := turnTwoFollowsTurnOne(t, ctx, r0, r1, "offline", 0, turnCheck{})
	// The next turn of the same conversation, as explain sees it.
	c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
		{Role: "system", Content: systemPrompt(0)}, {Role: "user", Content: "Question 0: what does a prefix cache save?"}}}
	// The replica's age counts from the last message a node sent: a
	// keepalive (every 500 ms on an idle stream) before the shutdown, or
	// one during it.
	killStart := time.Now()
	f.Directory.Stop()
	killEnd := time.Now()
	testkit.Eventually(t, 5*time.Second, "router 1 to place from its stale replica", func() (bool, string) {
		e, err := explainWith(ctx, r1, "offline", c, nil)
		if err != nil {
			return false, err.Error()
		}
		return e.MatchSource == "local-stale" && e.Fallback == "" && e.Pick == a1.worker && e.PredictedCachedTokens > 0,
			fmt.Sprintf("source %q fallback %q pick %s predicted %d", e.MatchSource, e.Fallback, e.Pick, e.PredictedCachedTokens)
	})
	if since := time.Since(killEnd); since > 8*time.Second {
		t.Fatalf("stale placement seen only %v after the kill, past --follow-max-stale", since)
	}
	testkit.Eventually(t, 15*time.Second, "router 1 to fall back once its view is too old", func() (bool, string) {
		e, err := explainWith(ctx, r1, "offline", c, nil)
		if err != nil {
			return false, err.Error()
		}
		return e.Fallback != "" && e.MatchSource != "local" && e.MatchSource != "local-stale",
			fmt.Sprintf("source %q fallback %q", e.MatchSource, e.Fallback)
	})
	// The view's age counts from the node's last message, which an idle
	// stream sends every 500 ms (a keepalive): up to that long before the
	// kill began. (A look-up at the stopped directory now fails at once
	// instead of at its 200 ms deadline, so nothing pads the moment.)
	if since := time.Since(killStart); since < 8*time.Second-500*time.Millisecond {
		t.Fatalf("fell back %v after the kill began, before --follow-max-stale less one keepalive", since)
	}
}

// The fault tests below run routers with --follow-log under steady traffic
// (chat requests through the routers, and a publisher whose acknowledged
// batches are checked), inject one fault, stop the traffic and check the
// invariants (checkFollowInvariants): the directory nodes converge and
// hold every acknowledged batch, and each router's replica has the index
// digest of every node at the same applied index.

// TestFollowingRoutersViewsEqualAfterTraffic: with no fault, the routers'
// replicas answer their matches and equal the directory once the traffic
// stops.
func TestFollowingRoutersViewsEqualAfterTraffic(t *testing.T) {
	ctx := context.Background()
	f := startFollowFleet(t)
	tr := startTraffic(t, ctx, f.Directory.Nodes[1], f.Routers[0].URL, f.Routers[1].URL)
	tr.waitAcked(t, 150)
	tr.stopTraffic(t)
	checkFollowInvariants(t, f, tr)
	for _, r := range f.Routers {
		if n := metricSum(t, r, `kvdir_router_matches_total{group="default",source="local"}`); n == 0 {
			t.Errorf("%s answered no match from its replica", r.Proc.Name)
		}
	}
}

// TestFollowingRoutersThroughALeaderKill kills the directory leader with
// SIGKILL under traffic: the routers keep answering from their replicas
// (no fallback, no match asked of the directory), and once the old leader
// is back and the traffic stopped their views equal the directory's.
func TestFollowingRoutersThroughALeaderKill(t *testing.T) {
	ctx := context.Background()
	f := startFollowFleet(t)
	old := f.Directory.Nodes[waitLeader(t, f.Directory, 20*time.Second)]
	var fallbacks, remote []float64
	for _, r := range f.Routers {
		fallbacks = append(fallbacks, metricSum(t, r, "kvdir_router_fallbacks_total"))
		remote = append(remote, metricSum(t, r, `kvdir_router_matches_total{group="default",source="directory"}`))
	}
	tr := startTraffic(t, ctx, otherNode(f, old), f.Routers[0].URL, f.Routers[1].URL)
	tr.waitAcked(t, 30)
	old.Kill9()
	next := f.Directory.Nodes[waitLeader(t, f.Directory, 20*time.Second)]
	t.Logf("killed leader %s; %s leads", old.ID, next.ID)
	tr.waitAcked(t, 60)
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	tr.stopTraffic(t)
	checkFollowInvariants(t, f, tr)
	for i, r := range f.Routers {
		if n := metricSum(t, r, "kvdir_router_fallbacks_total") - fallbacks[i]; n != 0 {
			t.Errorf("%s fell back %v times around the leader kill", r.Proc.Name, n)
		}
		if n := metricSum(t, r, `kvdir_router_matches_total{group="default",source="directory"}`) - remote[i]; n != 0 {
			t.Errorf("%s asked the directory %v matches around the leader kill instead of its replica", r.Proc.Name, n)
		}
	}
}

// TestFollowingRouterReconnectsToAnotherNode kills the node a router
// streams from: the router resumes from another node's feed (no new
// snapshot: that node still holds the entries after the router's index),
// and its view equals the directory's in the end.
func TestFollowingRouterReconnectsToAnotherNode(t *testing.T) {
	ctx := context.Background()
	f := startFollowFleet(t)
	r := f.Routers[0]
	before := waitView(t, r, "in sync", func(v router.View) bool { return v.Synced && v.Node != "" })
	victim := nodeAt(t, f, before.Node)
	tr := startTraffic(t, ctx, otherNode(f, victim), f.Routers[0].URL, f.Routers[1].URL)
	tr.waitAcked(t, 30)
	victim.Kill9()
	after := waitView(t, r, "streaming from another node", func(v router.View) bool {
		return v.Synced && v.Node != "" && v.Node != victim.API
	})
	t.Logf("killed %s (%s); %s streams from %s", victim.ID, victim.API, r.Proc.Name, after.Node)
	tr.waitAcked(t, 60)
	if after := waitView(t, r, "caught up", func(v router.View) bool { return v.Synced && v.LagEntries < 50 }); after.Snapshots != before.Snapshots {
		t.Errorf("%s took %d snapshots to resume from another node, want none (it was %d entries behind at most)",
			r.Proc.Name, after.Snapshots-before.Snapshots, after.LagEntries)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	tr.stopTraffic(t)
	checkFollowInvariants(t, f, tr)
}

// TestFollowingRoutersResumeFromASnapshot pauses a router (SIGSTOP) and
// kills the node it streams from, then applies more entries than the
// nodes' follow feed holds (--follow-feed-entries 100): once resumed, the
// router must resync from a fresh snapshot from another node, and its view
// equals the directory's in the end.
func TestFollowingRoutersResumeFromASnapshot(t *testing.T) {
	const feed = 100
	ctx := context.Background()
	f := startFollowFleet(t, "--follow-feed-entries", fmt.Sprint(feed))
	r := f.Routers[0]
	before := waitView(t, r, "in sync", func(v router.View) bool { return v.Synced && v.Node != "" })
	victim := nodeAt(t, f, before.Node)
	via := otherNode(f, victim)
	// Router 0 is paused: the traffic goes through router 1 only.
	tr := startTraffic(t, ctx, via, f.Routers[1].URL)
	tr.waitAcked(t, 20)
	resume := pause(t, r.Proc)
	victim.Kill9()
	st, err := via.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Everything the router could have received is at most at st's index.
	target := st.AppliedIndex + 3*feed
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%s to apply index %d", via.ID, target), func() (bool, string) {
		st, err := via.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		return st.AppliedIndex >= target, fmt.Sprintf("applied %d", st.AppliedIndex)
	})
	resume()
	after := waitView(t, r, "resynced from a new snapshot", func(v router.View) bool {
		return v.Synced && v.Node != "" && v.Snapshots > before.Snapshots && v.AppliedIndex >= target
	})
	t.Logf("%s paused at most at index %d; resumed from %s with snapshot %d, at index %d", r.Proc.Name, st.AppliedIndex, after.Node, after.Snapshots, after.AppliedIndex)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	tr.waitAcked(t, 20)
	tr.stopTraffic(t)
	checkFollowInvariants(t, f, tr)
}
