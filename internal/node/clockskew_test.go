package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestLeasesUnderClockSkew runs a cluster whose nodes' clocks are 5 minutes
// apart (Config.TestClockOffset: node 1 ahead, node 2 behind) and moves
// leadership between them while a worker heartbeats: leases are kept by
// the leader alone, in elapsed time, and started afresh by each new leader,
// so no skew expires the worker; and once its heartbeats stop, a skewed
// leader expires it after the lease, neither sooner nor much later.
func TestLeasesUnderClockSkew(t *testing.T) {
	testkit.SkipIfShort(t, "moves leadership around a 3-node cluster for several seconds")
	const lease = time.Second
	offsets := []time.Duration{0, 5 * time.Minute, -5 * time.Minute}
	c := dirtest.New(t, 3, func(i int, cfg *node.Config) {
		cfg.Lease = lease
		cfg.TestClockOffset = offsets[i]
	})
	c.Leader()
	worker := func(id string) (*kvdirv1.Worker, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := kvdirv1.NewDirectoryServiceClient(c.Conn(c.Leader())).GetWorker(ctx, &kvdirv1.GetWorkerRequest{WorkerId: id})
		return resp.GetWorker(), err
	}
	// heartbeat renews id's lease every 200 ms until stop is closed.
	heartbeat := func(id string, epoch uint64, stop <-chan struct{}, wg *sync.WaitGroup) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = kvdirv1.NewAgentServiceClient(c.Conn(c.Leader())).Heartbeat(ctx, &kvdirv1.HeartbeatRequest{WorkerId: id, Epoch: epoch})
			cancel()
		}
	}
	lead := func(i int) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("node %d to lead", i), func() (bool, string) {
			l := c.Leader()
			if l == i {
				return true, ""
			}
			_ = c.Node(l).Raft().LeadershipTransferToServer(raft.ServerID(fmt.Sprintf("n%d", i)), c.RaftAddr(i)).Error()
			return c.Node(i).IsLeader(), fmt.Sprintf("node %d leads", l)
		})
	}

	epoch := c.Register("w")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go heartbeat("w", epoch, stop, &wg)
	for _, i := range []int{1, 2, 0, 2, 1} {
		lead(i)
		time.Sleep(3 * lease) // the lease runs out thrice if counted wrongly
		w, err := worker("w")
		if err != nil {
			t.Fatal(err)
		}
		if w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE || w.Epoch != epoch {
			t.Fatalf("with node %d (clock %v off) leading: worker %v in epoch %d, want ACTIVE in %d", i, offsets[i], w.State, w.Epoch, epoch)
		}
	}

	// Heartbeats stop under a leader ahead, then one behind.
	close(stop)
	wg.Wait()
	for _, i := range []int{1, 2} {
		lead(i)
		id := fmt.Sprintf("w%d", i)
		ep := c.Register(id)
		s := make(chan struct{})
		wg.Add(1)
		go heartbeat(id, ep, s, &wg)
		time.Sleep(2 * lease)
		close(s)
		wg.Wait()
		stopped := time.Now()
		testkit.Eventually(t, 10*lease, id+" expired", func() (bool, string) {
			w, err := worker(id)
			if err != nil {
				return false, err.Error()
			}
			return w.State == kvdirv1.WorkerState_WORKER_STATE_EXPIRED, w.State.String()
		})
		if el := time.Since(stopped); el < lease-250*time.Millisecond || el > 3*lease {
			t.Fatalf("node %d (clock %v off) expired %s %v after its last heartbeat; lease %v", i, offsets[i], id, el, lease)
		}
	}
}
