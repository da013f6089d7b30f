package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
)

// Routers following the directory's log (--follow-log; router 1 in the
// compose cluster): their replicas are checked against the nodes after
// every fault, and their matches and fallbacks counted.

// routerView reads router i's GET /v1/kvdir/view.
func (h *harness) routerView(i int) (router.View, error) {
	var v router.View
	ctx, cancel := context.WithTimeout(h.ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.routerURLs[i]+router.PathView, nil)
	if err != nil {
		return v, err
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return v, fmt.Errorf("%s: %w", routerNames[i], err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s: GET %s: %s", routerNames[i], router.PathView, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("%s: GET %s: %w", routerNames[i], router.PathView, err)
	}
	return v, nil
}

// findFollowing records which routers follow the log, as their views say.
func (h *harness) findFollowing() error {
	h.following = make([]bool, len(h.routerURLs))
	for i := range h.routerURLs {
		v, err := h.routerView(i)
		if err != nil {
			return err
		}
		h.following[i] = v.Following
	}
	return nil
}

// followers returns the indexes of the routers that follow the log.
func (h *harness) followers() []int {
	var out []int
	for i, f := range h.following {
		if f {
			out = append(out, i)
		}
	}
	return out
}

// followCounters are a following router's counters at one moment.
type followCounters struct {
	fallbacks, local, stale, remote float64
	snapshots                       uint64
	started                         float64 // process_start_time_seconds: another value means a restart
}

// followCounts reads the counters of every following router (the zero
// value for one that does not answer).
func (h *harness) followCounts() map[int]followCounters {
	out := map[int]followCounters{}
	for _, i := range h.followers() {
		u := h.routerURLs[i] + "/metrics"
		var c followCounters
		c.fallbacks, _ = metric(h.ctx, h.hc, u, "kvdir_router_fallbacks_total")
		c.local, _ = metric(h.ctx, h.hc, u, "kvdir_router_matches_total", `source="local"`)
		c.stale, _ = metric(h.ctx, h.hc, u, "kvdir_router_matches_total", `source="local-stale"`)
		c.remote, _ = metric(h.ctx, h.hc, u, "kvdir_router_matches_total", `source="directory"`)
		c.started, _ = metric(h.ctx, h.hc, u, "process_start_time_seconds")
		if v, err := h.routerView(i); err == nil {
			c.snapshots = v.Snapshots
		}
		out[i] = c
	}
	return out
}

// growth returns how much the counters grew from b to n; a router that
// restarted in between counts from 0.
func growth(b, n followCounters) followCounters {
	if b.started != n.started {
		return n
	}
	return followCounters{fallbacks: n.fallbacks - b.fallbacks, local: n.local - b.local, stale: n.stale - b.stale,
		remote: n.remote - b.remote, snapshots: n.snapshots - b.snapshots}
}

// followResults records what the following routers did during a fault;
// with noFallback, a fallback to hashing there is a problem.
func (h *harness) followResults(r *FaultResult, before map[int]followCounters, noFallback bool) {
	now := h.followCounts()
	for _, i := range h.followers() {
		g := growth(before[i], now[i])
		fb := int(g.fallbacks)
		r.FollowingFallbacks += fb
		r.FollowingLocalMatches += int(g.local)
		r.FollowingStaleMatches += int(g.stale)
		r.FollowingDirectoryMatches += int(g.remote)
		r.ReplicaSnapshots += int(g.snapshots)
		if noFallback && fb > 0 {
			r.problem("%s follows the log but fell back to hashing %d times", routerNames[i], fb)
		}
	}
}

// replicasEqual checks, once the load has stopped, every following
// router's replica against every node: at the same applied index (the
// node's read before and after the view, so that its digest is that
// index's) the index digests must be equal. It returns, per following
// router, the last applied index compared.
func (h *harness) replicasEqual(r *FaultResult) {
	for _, i := range h.followers() {
		var at uint64
		for _, node := range dirNames {
			err := testkit.Poll(h.ctx, digestBound, fmt.Sprintf("%s's replica and %s at one applied index", routerNames[i], node), func() (bool, string) {
				st, err := h.dir.Status(h.ctx, node)
				if err != nil {
					return false, err.Error()
				}
				v, err := h.routerView(i)
				if err != nil {
					return false, err.Error()
				}
				again, err := h.dir.Status(h.ctx, node)
				if err != nil {
					return false, err.Error()
				}
				saw := fmt.Sprintf("%s applied %d then %d; replica synced %v at %d (lag %d)", node, st.AppliedIndex, again.AppliedIndex, v.Synced, v.AppliedIndex, v.LagEntries)
				if !v.Following || !v.Synced || st.AppliedIndex != v.AppliedIndex || again.AppliedIndex != st.AppliedIndex {
					return false, saw
				}
				if want := fmt.Sprintf("%016x", st.Digest); v.IndexDigest != want {
					r.problem("%s's replica differs from %s at applied index %d: index digest %s, node %s", routerNames[i], node, v.AppliedIndex, v.IndexDigest, want)
				}
				at = v.AppliedIndex
				return true, saw
			})
			if err != nil {
				r.problem("replica of %s: %v", routerNames[i], err)
			}
		}
		r.ReplicasEqualAt = append(r.ReplicasEqualAt, at)
	}
}

// killFollowedNode kills (SIGKILL) the node router 1 streams its log from,
// whichever role it has: the router must resume from another node while
// the load goes on. The node is started again and must rejoin.
func killFollowedNode(h *harness, r *FaultResult) (time.Time, error) {
	fs := h.followers()
	if len(fs) == 0 {
		return time.Time{}, fmt.Errorf("no router follows the log (KVDIR_ROUTER1_FOLLOW_LOG)")
	}
	i := fs[0]
	var before router.View
	err := testkit.Poll(h.ctx, rejoinBound, routerNames[i]+" streaming", func() (bool, string) {
		var err error
		if before, err = h.routerView(i); err != nil {
			return false, err.Error()
		}
		return before.Synced && before.Node != "", fmt.Sprintf("%+v", before)
	})
	if err != nil {
		return time.Time{}, err
	}
	target, _, err := net.SplitHostPort(before.Node)
	if err != nil || !contains(dirNames, target) {
		return time.Time{}, fmt.Errorf("%s streams from %q, not a directory container", routerNames[i], before.Node)
	}
	lv, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, "")
	if err != nil {
		return time.Time{}, err
	}
	r.Target = target
	if lv.Container == target {
		r.Target += " (leader)"
	}
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "kill", target); err != nil {
		return time.Time{}, err
	}
	err = testkit.Poll(h.ctx, rejoinBound, routerNames[i]+" to stream from another node", func() (bool, string) {
		v, err := h.routerView(i)
		if err != nil {
			return false, err.Error()
		}
		return v.Synced && v.Node != "" && v.Node != before.Node, fmt.Sprintf("synced %v, node %q", v.Synced, v.Node)
	})
	if err != nil {
		return time.Time{}, err
	}
	r.ReplicaResumeSeconds = time.Since(at).Seconds()
	not := ""
	if lv.Container == target {
		not = lv.Leader
	}
	return h.recoverNode(r, target, not, at)
}

// followingSummary is a line for the test log.
func (r *FaultResult) followingSummary() string {
	var eq []string
	for _, a := range r.ReplicasEqualAt {
		eq = append(eq, fmt.Sprint(a))
	}
	return fmt.Sprintf("following: fallbacks=%d matches local=%d stale=%d directory=%d snapshots=%d equal at [%s]",
		r.FollowingFallbacks, r.FollowingLocalMatches, r.FollowingStaleMatches, r.FollowingDirectoryMatches, r.ReplicaSnapshots, strings.Join(eq, " "))
}
