package router

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestWorkerSelector runs a router with --worker-selector pool=a over a
// real directory where four workers serve one model: p1 and p2 labelled
// pool=a, q1 labelled pool=b, u1 unlabelled. Only p1 and p2 are
// candidates, even with q1 holding the prompt's blocks; when p2 registers
// again labelled pool=b it leaves the pool, and when q1 registers again
// labelled pool=a it joins.
func TestWorkerSelector(t *testing.T) {
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) { cfg.Lease = time.Hour })
	dc, err := dirclient.New(dirclient.Config{Addrs: c.APIAddrs(), Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	register := func(id string, labels map[string]string) uint64 {
		t.Helper()
		var epoch uint64
		testkit.Eventually(t, 10*time.Second, "registration of "+id, func() (bool, string) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			resp, err := kvdirv1.NewAgentServiceClient(c.Conn(c.Leader())).Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{
				Id: id, Model: "m", Address: newUpstream(t, "m", okJSON(0)).URL, BlockSize: 16, Labels: labels}})
			if err != nil {
				return false, err.Error()
			}
			epoch = resp.Epoch
			return true, ""
		})
		return epoch
	}
	register("p1", map[string]string{"pool": "a", "zone": "z1"})
	register("p2", map[string]string{"pool": "a"})
	epQ1 := register("q1", map[string]string{"pool": "b"})
	register("u1", nil)

	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), ScrapeInterval: 20 * time.Millisecond,
		MatchTimeout: 5 * time.Second, Logger: testkit.Logger(t), Directory: dc,
		WorkerSelector: map[string]string{"pool": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	workers := func() []string {
		var ids []string
		for id := range s.pool.snapshot() {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids
	}
	waitWorkers := func(what string, want ...string) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, what, func() (bool, string) {
			ok, why := s.Ready()
			got := workers()
			return ok && slices.Equal(got, want), fmt.Sprintf("ready %v %s, workers %v, want %v", ok, why, got, want)
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
