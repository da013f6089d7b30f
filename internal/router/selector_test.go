package router

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// TestWorkerSelector runs a router with --worker-selector pool=a over a
// real directory where four workers serve one model: p1 and p2 labelled
// pool=a, q1 labelled pool=b, u1 unlabelled. Only p1 and p2 are
// candidates, even with q1 holding the prompt's blocks; when p2 registers
// again labelled pool=b it leaves the pool, and when q1 registers again
// labelled pool=a it joins.
func TestWorkerSelector(t *testing.T) {
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) { cfg.Lease = time.Hour })
	dc := dirClientFor(t, c)
	register := func(id string, labels map[string]string) uint64 {
		t.Helper()
		return registerLabelled(t, c, id, "m", newUpstream(t, "m", okJSON(0)).URL, labels)
	}
	register("p1", map[string]string{"pool": "a", "zone": "z1"})
	register("p2", map[string]string{"pool": "a"})
	epQ1 := register("q1", map[string]string{"pool": "b"})
	register("u1", nil)

	s, _ := testRouter(t, "kvdir", nil, func(cfg *Config) {
		cfg.Directory, cfg.MatchTimeout, cfg.Logger = dc, 5*time.Second, testkit.Logger(t)
		cfg.WorkerSelector = map[string]string{"pool": "a"}
	})
	waitWorkers := func(what string, want ...string) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, what, func() (bool, string) {
			var got []string
			for id := range s.pool.snapshot() {
				got = append(got, id)
			}
			slices.Sort(got)
			return slices.Equal(got, want), fmt.Sprintf("workers %v, want %v", got, want)
		})
	}
	waitWorkers("the pool: the workers labelled pool=a", "p1", "p2")

	// q1 holds the prompt's blocks: a router without the selector would
	// pick it; this one never sees it.
	d, aerr := s.decide(t.Context(), groupChat(t, "m"), nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	storeIn(t, c, "q1", epQ1, d.chain)
	for range 10 {
		d, aerr := s.decide(t.Context(), groupChat(t, "m"), nil)
		if aerr != nil {
			t.Fatal(aerr)
		}
		if w := d.pick.Worker; w != "p1" && w != "p2" || d.pick.PredictedCachedTokens != 0 {
			t.Fatalf("picked %s with %d predicted cached tokens; want p1 or p2, which hold nothing", w, d.pick.PredictedCachedTokens)
		}
	}

	register("p2", map[string]string{"pool": "b"})
	waitWorkers("p2, registered again with pool=b, gone from the pool", "p1")
	register("q1", map[string]string{"pool": "a"})
	waitWorkers("q1, registered again with pool=a, in the pool", "p1", "q1")
}
