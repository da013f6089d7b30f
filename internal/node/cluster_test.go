package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// testCluster is an in-process cluster: real Raft over an in-memory
// transport (so tests can partition it), in-memory log stores that survive a
// node's restart, and real gRPC on loopback.
type testCluster struct {
	t      *testing.T
	mu     sync.Mutex // guards nodes against publishers running beside the test
	nodes  []*Node
	trans  []*raft.InmemTransport
	stores []*raft.InmemStore
	snaps  []*raft.InmemSnapshotStore
	cfg    func(i int, c *Config)
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func newTestCluster(t *testing.T, size int, cfg func(i int, c *Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, cfg: cfg}
	initial := map[string]string{}
	for i := range size {
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("raft-%d", i)))
		c.trans = append(c.trans, tr)
		c.stores = append(c.stores, raft.NewInmemStore())
		c.snaps = append(c.snaps, raft.NewInmemSnapshotStore())
		initial[fmt.Sprintf("n%d", i)] = string(addr)
	}
	c.connectAll()
	for i := range size {
		c.nodes = append(c.nodes, c.start(i, initial))
	}
	t.Cleanup(c.shutdown)
	c.leader()
	waitFor(t, "every node to know the leader's API", 10*time.Second, func() bool {
		for _, n := range c.nodes {
			if _, ok := n.leaderAPI(); !ok {
				return false
			}
		}
		return true
	})
	return c
}

func (c *testCluster) config(i int, initial map[string]string) Config {
	cfg := Config{
		ID:               fmt.Sprintf("n%d", i),
		APIAddr:          "127.0.0.1:0",
		InitialCluster:   initial,
		Transport:        c.trans[i],
		LogStore:         c.stores[i],
		StableStore:      c.stores[i],
		Snapshots:        c.snaps[i],
		HeartbeatTimeout: 100 * time.Millisecond,
		ElectionTimeout:  100 * time.Millisecond,
		ApplyTimeout:     5 * time.Second,
		Lease:            time.Minute, // tests of leases set their own
		MaxStaleness:     time.Second,
		Logger:           testLogger(c.t).With("test", c.t.Name()),
	}
	if c.cfg != nil {
		c.cfg(i, &cfg)
	}
	return cfg
}

func (c *testCluster) start(i int, initial map[string]string) *Node {
	c.t.Helper()
	n, err := New(c.config(i, initial))
	if err != nil {
		c.t.Fatalf("start node %d: %v", i, err)
	}
	return n
}

func (c *testCluster) connectAll() {
	for i, a := range c.trans {
		for j, b := range c.trans {
			if i != j {
				a.Connect(b.LocalAddr(), b)
			}
		}
	}
}

// isolate cuts node i off from every other node, both ways.
func (c *testCluster) isolate(i int) {
	c.trans[i].DisconnectAll()
	for j, tr := range c.trans {
		if j != i {
			tr.Disconnect(c.trans[i].LocalAddr())
		}
	}
}

func (c *testCluster) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range c.nodes {
		if n != nil {
			n.Shutdown(ctx)
		}
	}
}

// stop shuts node i down (its stores survive, as a disk would).
func (c *testCluster) stop(i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := c.node(i)
	n.Shutdown(ctx)
	c.mu.Lock()
	c.nodes[i] = nil
	c.mu.Unlock()
}

// node returns node i, or nil while it is down; safe beside stop and restart.
func (c *testCluster) node(i int) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// restart starts node i again on its stores, with a fresh transport.
func (c *testCluster) restart(i int) {
	addr, tr := raft.NewInmemTransport(c.trans[i].LocalAddr())
	_ = addr
	c.trans[i] = tr
	c.connectAll()
	n := c.start(i, nil)
	c.mu.Lock()
	c.nodes[i] = n
	c.mu.Unlock()
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// leader waits for a leader among the running nodes and returns its index.
func (c *testCluster) leader() int {
	c.t.Helper()
	found := -1
	waitFor(c.t, "a leader", 10*time.Second, func() bool {
		for i, n := range c.nodes {
			if n != nil && n.IsLeader() {
				found = i
				return true
			}
		}
		return false
	})
	return found
}

// follower returns the index of a running node that is not the leader.
func (c *testCluster) follower() int {
	l := c.leader()
	for i, n := range c.nodes {
		if n != nil && i != l {
			return i
		}
	}
	c.t.Fatal("no follower")
	return -1
}

// converged waits until every running node has applied the same index and
// holds the same state digest.
func (c *testCluster) converged() {
	c.t.Helper()
	var last string
	waitFor(c.t, "nodes to converge", 15*time.Second, func() bool {
		var idx uint64
		var dig uint64
		first := true
		same := true
		last = ""
		for _, n := range c.nodes {
			if n == nil {
				continue
			}
			a, d := n.FSM().AppliedIndex(), n.FSM().Digest()
			last += fmt.Sprintf("%s:%d/%016x ", n.ID(), a, d)
			if first {
				idx, dig, first = a, d, false
			} else if a != idx || d != dig {
				same = false
			}
		}
		return same && idx > 0
	})
}

// conn dials node i's API.
func (c *testCluster) conn(i int) *grpc.ClientConn {
	c.t.Helper()
	cc, err := grpc.NewClient(c.node(i).APIAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

func TestClusterPublishThroughFollower(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	cc := c.conn(c.follower())
	agent := kvdirv1.NewAgentServiceClient(cc)
	ctx := context.Background()
	reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w1", BlockSize: 16, Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := agent.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain := []uint64{11, 12, 13, 14}
	if err := stream.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
		WorkerId: "w1", Epoch: reg.Epoch, FirstSeq: 1, LastSeq: 1,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		t.Fatalf("publish: %v", resp)
	}
	stream.CloseSend()
	c.converged()
	for i := range c.nodes {
		m, err := kvdirv1.NewDirectoryServiceClient(c.conn(i)).Match(ctx, &kvdirv1.MatchRequest{
			Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chain, BlockSize: 16}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Matches) != 1 || m.Matches[0].WorkerId != "w1" || m.Matches[0].Blocks != 4 || m.Matches[0].Tokens != 64 {
			t.Fatalf("node %d match: %v", i, m)
		}
	}
}

func TestShutdownEndsIdleStreams(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	for round := range 2 { // the leader's stream, then a follower's piped one
		i := c.leader()
		if round == 1 {
			i = c.follower()
		}
		waitFor(t, "the node to know the leader's API", 10*time.Second, func() bool {
			_, ok := c.nodes[i].leaderAPI()
			return ok
		})
		s, err := kvdirv1.NewAgentServiceClient(c.conn(i)).Publish(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Opened and idle: no batch sent yet; make sure the handler runs.
		s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{WorkerId: "nobody", Epoch: 1, FirstSeq: 1, LastSeq: 1}})
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.stop(i)
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("shutting down node %d took %v with an idle publish stream", i, d)
		}
		if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("idle stream after shutdown: %v, want Unavailable", err)
		}
		c.restart(i)
		c.leader()
	}
}
