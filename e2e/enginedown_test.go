package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestEngineDownBehindLiveAgent kills an engine whose agent stays up: the
// agent notices that the engine's metrics endpoint refuses, and the worker
// must leave the directory (not ACTIVE: routers do not place there) within
// the lease, instead of staying ACTIVE with stale blocks. Restarted on the
// same ports, the engine comes back empty: the worker is registered again
// in a new epoch with no blocks, and after the same warm-up as before it
// holds exactly the blocks it held then (the simulator is deterministic),
// i.e. the view equals the engine's cache.
func TestEngineDownBehindLiveAgent(t *testing.T) {
	const lease = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := fleet.New(t, fleet.Config{Engines: 1, DirectoryArgs: []string{"--lease", lease.String()}})
	e := f.Engines[0]
	warm, _ := warmEngine(t, ctx, f, e)

	dir, err := dirclient.New(dirclient.Config{Addrs: strings.Split(f.DirectoryAddrs(), ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	e.Sim.Kill9()
	killed := time.Now()
	var state string
	testkit.Eventually(t, 2*lease, e.WorkerID+" out of the directory", func() (bool, string) {
		resp, err := dir.ListWorkers(ctx, "", true)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range resp.GetWorkers() {
			if w.GetSpec().GetId() == e.WorkerID {
				state = w.GetState().String()
				return w.GetState() != kvdirv1.WorkerState_WORKER_STATE_ACTIVE, state
			}
		}
		state = "gone"
		return true, state
	})
	took := time.Since(killed)
	t.Logf("engine killed: %s %s %v later (lease %v)", e.WorkerID, state, took.Round(time.Millisecond), lease)
	if took > lease {
		t.Errorf("worker still ACTIVE %v after its engine died, want within the lease (%v)", took, lease)
	}
	if !e.Agent.Running() {
		t.Fatalf("the agent exited:\n%s", e.Agent.Tail(30))
	}

	if err := e.Sim.Start(); err != nil {
		t.Fatal(err)
	}
	var back ctlview.Worker
	testkit.Eventually(t, 30*time.Second, e.WorkerID+" registered again", func() (bool, string) {
		w, ok := ctlWorker(t, f, e.WorkerID)
		back = w
		return ok && w.State == "ACTIVE" && w.Epoch > warm.Epoch, fmt.Sprintf("%s epoch %d (was %d)", w.State, w.Epoch, warm.Epoch)
	})
	if back.Blocks != 0 {
		t.Errorf("restarted (empty) engine's worker holds %d blocks, want 0", back.Blocks)
	}
	again, _ := warmEngine(t, ctx, f, e)
	if again.Blocks != warm.Blocks || again.GPUBlocks != warm.GPUBlocks {
		t.Errorf("after the same warm-up: %d blocks (%d GPU), before the kill %d (%d GPU)",
			again.Blocks, again.GPUBlocks, warm.Blocks, warm.GPUBlocks)
	}
	if again.ViewPartial {
		t.Errorf("%s partial after the engine came back", e.WorkerID)
	}
}
