package dirclient

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/node"
)

// cluster is an in-process directory: real nodes with in-memory Raft and
// real gRPC on loopback.
type cluster struct {
	t     *testing.T
	nodes []*node.Node // nil once stopped
	addrs []string     // API addresses, kept after a node stops
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// newCluster starts size nodes and waits until they have a leader and every
// node knows every member's API address (so that responses carry the
// leader header).
func newCluster(t *testing.T, size int, tokens node.Tokens) *cluster {
	t.Helper()
	c := &cluster{t: t}
	var trans []*raft.InmemTransport
	initial := map[string]string{}
	for i := range size {
		addr, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("raft-%d", i)))
		trans = append(trans, tr)
		initial[fmt.Sprintf("n%d", i)] = string(addr)
	}
	for i, a := range trans {
		for j, b := range trans {
			if i != j {
				a.Connect(b.LocalAddr(), b)
			}
		}
	}
	t.Cleanup(c.shutdown)
	for i := range size {
		store := raft.NewInmemStore()
		n, err := node.New(node.Config{
			ID:               fmt.Sprintf("n%d", i),
			APIAddr:          "127.0.0.1:0",
			InitialCluster:   initial,
			Transport:        trans[i],
			LogStore:         store,
			StableStore:      store,
			Snapshots:        raft.NewInmemSnapshotStore(),
			HeartbeatTimeout: 100 * time.Millisecond,
			ElectionTimeout:  100 * time.Millisecond,
			ApplyTimeout:     5 * time.Second,
			Lease:            time.Minute,
			Tokens:           tokens,
			Logger:           testLogger(t).With("node", i),
		})
		if err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
		c.nodes = append(c.nodes, n)
		c.addrs = append(c.addrs, n.APIAddr())
	}
	c.leader()
	waitFor(t, "every node to know every API address", 10*time.Second, func() bool {
		for _, n := range c.nodes {
			if len(n.FSM().Members()) < size {
				return false
			}
		}
		return true
	})
	return c
}

func (c *cluster) shutdown() {
	for i := range c.nodes {
		c.stop(i)
	}
}

// stop shuts node i down.
func (c *cluster) stop(i int) {
	if c.nodes[i] == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.nodes[i].Shutdown(ctx); err != nil {
		c.t.Logf("shutdown node %d: %v", i, err)
	}
	c.nodes[i] = nil
}

// leader waits for a leader among the running nodes and returns its index.
func (c *cluster) leader() int {
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

// followers returns the indexes of the running nodes that do not lead.
func (c *cluster) followers() []int {
	l := c.leader()
	var out []int
	for i, n := range c.nodes {
		if n != nil && i != l {
			out = append(out, i)
		}
	}
	return out
}

// waitFor polls cond until it holds, failing the test after timeout.
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

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// newClient returns a client closed at the end of the test.
func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t).With("client", t.Name())
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testCtx returns a context that ends after d or with the test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
