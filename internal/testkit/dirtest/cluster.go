// Package dirtest runs an in-process directory cluster for tests: real
// nodes (internal/node) with real Raft over an in-memory transport, so that
// a test can cut links and partition the cluster, an in-memory log store
// and an on-disk snapshot store that survive a node's restart, and real
// gRPC on loopback. Publisher drives one worker's batches through it as an
// agent does, and Check is the standard closing check: every running node
// holds the same state, and every acknowledged batch is on every node.
package dirtest

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
)

// Cluster is an in-process directory cluster. Its methods take node
// indexes (0 to Size()-1); a stopped node's index stays valid.
type Cluster struct {
	t testing.TB

	mu     sync.Mutex // guards nodes against goroutines beside the test
	nodes  []*node.Node
	apis   []string // API addresses, kept after a node stops
	trans  []*raft.InmemTransport
	stores []*raft.InmemStore
	snaps  []raft.SnapshotStore
	cfgs   []func(i int, c *node.Config)
}

// New starts size nodes, each configured by cfg (nil for the defaults:
// 100 ms heartbeat and election timeouts, one-minute leases, 1 s maximum
// staleness), and waits until they have a leader and every node knows
// every node's API address (so that followers forward writes, and no
// member-table entry is still to come: a test may take the applied index
// as the start of its own writes). The cluster shuts down at the end of t.
func New(t testing.TB, size int, cfg func(i int, c *node.Config)) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	if cfg != nil {
		c.cfgs = append(c.cfgs, cfg)
	}
	initial := map[string]string{}
	for i := range size {
		c.addSlot(i)
		initial[id(i)] = string(c.trans[i].LocalAddr())
	}
	c.Heal()
	t.Cleanup(c.shutdown)
	for i := range size {
		n := c.start(i, initial)
		c.nodes = append(c.nodes, n)
		c.apis = append(c.apis, n.APIAddr())
	}
	c.Leader()
	testkit.Eventually(t, 10*time.Second, "every node to know the leader", func() (bool, string) {
		for _, n := range c.Nodes() {
			if _, leader := n.Raft().LeaderWithID(); leader == "" {
				return false, n.ID() + " knows no leader"
			}
		}
		return true, ""
	})
	c.WaitMembers()
	return c
}

// WaitMembers waits until every running node knows every running node's
// API address (so that every answer carries the leader header and clients
// can be told about every member).
func (c *Cluster) WaitMembers() {
	c.t.Helper()
	testkit.Eventually(c.t, 10*time.Second, "every node to know every member's API address", func() (bool, string) {
		nodes := c.Nodes()
		for _, n := range nodes {
			for _, m := range nodes {
				if n.FSM().MemberAPI(m.ID()) == "" {
					return false, fmt.Sprintf("%s knows %v", n.ID(), n.FSM().Members())
				}
			}
		}
		return true, ""
	})
}

func id(i int) string { return fmt.Sprintf("n%d", i) }

// addSlot makes the transport and stores of node i.
func (c *Cluster) addSlot(i int) {
	_, tr := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("raft-%d", i)))
	c.trans = append(c.trans, tr)
	c.stores = append(c.stores, raft.NewInmemStore())
	c.snaps = append(c.snaps, c.snapshotStore())
}

func (c *Cluster) config(i int, initial map[string]string) node.Config {
	cfg := node.Config{
		ID:             id(i),
		APIAddr:        "127.0.0.1:0",
		InitialCluster: initial,
		Transport:      c.trans[i],
		LogStore:       c.stores[i],
		StableStore:    c.stores[i],
		Snapshots:      c.snaps[i],
		// Short enough for fast elections in failover tests, long enough
		// that a leader whose lease is half of it (50 ms at 100 ms) does
		// not step down when a loaded race-detector run delays its
		// heartbeats: that failed tests not about elections.
		HeartbeatTimeout: 200 * time.Millisecond,
		ElectionTimeout:  200 * time.Millisecond,
		ApplyTimeout:     5 * time.Second,
		Lease:            time.Minute, // tests of leases set their own
		MaxStaleness:     time.Second,
		Logger:           testkit.Logger(c.t),
	}
	for _, f := range c.cfgs {
		f(i, &cfg)
	}
	return cfg
}

func (c *Cluster) start(i int, initial map[string]string) *node.Node {
	c.t.Helper()
	n, err := node.New(c.config(i, initial))
	if err != nil {
		c.t.Fatalf("start node %d: %v", i, err)
	}
	return n
}

// Configure adds f to the configuration of every node started from now on
// (restarted or added), applied after the earlier ones.
func (c *Cluster) Configure(f func(i int, c *node.Config)) { c.cfgs = append(c.cfgs, f) }

// Size is the number of nodes, running or not.
func (c *Cluster) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// Node returns node i, or nil while it is down; safe beside Stop and
// Restart.
func (c *Cluster) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Nodes returns the running nodes.
func (c *Cluster) Nodes() []*node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node.Node
	for _, n := range c.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

// APIAddr is node i's gRPC address, known also while it is down.
func (c *Cluster) APIAddr(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apis[i]
}

// APIAddrs are every node's gRPC addresses.
func (c *Cluster) APIAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.apis...)
}

// RaftAddr is node i's address on the in-memory transport.
func (c *Cluster) RaftAddr(i int) raft.ServerAddress { return c.trans[i].LocalAddr() }

// Store is node i's log and stable store (it outlives the node).
func (c *Cluster) Store(i int) *raft.InmemStore { return c.stores[i] }

// Snapshots is node i's snapshot store (it outlives the node).
func (c *Cluster) Snapshots(i int) raft.SnapshotStore { return c.snaps[i] }

// Heal connects every node's transport to every other's.
func (c *Cluster) Heal() {
	for i, a := range c.trans {
		for j, b := range c.trans {
			if i != j {
				a.Connect(b.LocalAddr(), b)
			}
		}
	}
}

// Isolate cuts node i's Raft links to every other node, both ways. Its
// gRPC API stays reachable.
func (c *Cluster) Isolate(i int) {
	c.trans[i].DisconnectAll()
	for j, tr := range c.trans {
		if j != i {
			tr.Disconnect(c.trans[i].LocalAddr())
		}
	}
}

// Partition cuts every Raft link between nodes of different groups; nodes
// in no group are isolated. Heal undoes it.
func (c *Cluster) Partition(groups ...[]int) {
	group := make([]int, len(c.trans))
	for i := range group {
		group[i] = -1 - i // alone
	}
	for g, members := range groups {
		for _, i := range members {
			group[i] = g
		}
	}
	for i, a := range c.trans {
		for j, b := range c.trans {
			if i == j {
				continue
			}
			if group[i] == group[j] {
				a.Connect(b.LocalAddr(), b)
			} else {
				a.Disconnect(b.LocalAddr())
			}
		}
	}
}

func (c *Cluster) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range c.Size() {
		if n := c.Node(i); n != nil {
			if err := n.Shutdown(ctx); err != nil {
				c.t.Logf("shutdown node %d: %v", i, err)
			}
		}
	}
}

// Stop shuts node i down (its stores survive, as a disk would).
func (c *Cluster) Stop(i int) {
	n := c.Node(i)
	if n == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		c.t.Logf("shutdown node %d: %v", i, err)
	}
	c.mu.Lock()
	c.nodes[i] = nil
	c.mu.Unlock()
}

// Wipe gives stopped node i empty stores, as a replaced disk would.
func (c *Cluster) Wipe(i int) {
	c.stores[i], c.snaps[i] = raft.NewInmemStore(), c.snapshotStore()
}

// snapshotStore is a new, empty snapshot store on disk, in a directory of
// the test's. Raft's in-memory store publishes a snapshot as the latest
// before it is written, so a leader sending it to a follower while the
// next one is taken reads a buffer being written (a data race, and a
// truncated snapshot); the file store, as a node on disk uses, publishes
// a snapshot only once it is complete.
func (c *Cluster) snapshotStore() raft.SnapshotStore {
	s, err := raft.NewFileSnapshotStore(c.t.TempDir(), 2, io.Discard)
	if err != nil {
		c.t.Fatalf("snapshot store: %v", err)
	}
	return s
}

// Restart starts stopped node i again on its stores, with a fresh
// transport connected to every node.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.TryRestart(i); err != nil {
		c.t.Fatalf("restart node %d: %v", i, err)
	}
}

// TryRestart is Restart for a node that may refuse to start: it returns
// node.New's error, and the node stays down.
func (c *Cluster) TryRestart(i int) error {
	_, tr := raft.NewInmemTransport(c.trans[i].LocalAddr())
	c.trans[i] = tr
	c.Heal()
	n, err := node.New(c.config(i, nil))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nodes[i], c.apis[i] = n, n.APIAddr()
	c.mu.Unlock()
	return nil
}

// Add starts a new node with empty stores, connected to every node, and
// returns its index; configure it (e.g. Join) with Configure beforehand.
func (c *Cluster) Add() int {
	c.t.Helper()
	i := c.Size()
	c.addSlot(i)
	c.Heal()
	n := c.start(i, nil)
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.apis = append(c.apis, n.APIAddr())
	c.mu.Unlock()
	return i
}

// Leader waits for a leader among the running nodes and returns its index.
func (c *Cluster) Leader() int {
	c.t.Helper()
	found := -1
	testkit.Eventually(c.t, 10*time.Second, "a leader", func() (bool, string) {
		for i := range c.Size() {
			if n := c.Node(i); n != nil && n.IsLeader() {
				found = i
				return true, ""
			}
		}
		return false, "no running node leads"
	})
	return found
}

// Follower returns the index of a running node that does not lead.
func (c *Cluster) Follower() int {
	c.t.Helper()
	fs := c.Followers()
	if len(fs) == 0 {
		c.t.Fatal("no follower")
	}
	return fs[0]
}

// Followers returns the indexes of the running nodes that do not lead.
func (c *Cluster) Followers() []int {
	c.t.Helper()
	l := c.Leader()
	var out []int
	for i := range c.Size() {
		if c.Node(i) != nil && i != l {
			out = append(out, i)
		}
	}
	return out
}

// Conn dials node i's API; the connection closes at the end of the test.
func (c *Cluster) Conn(i int) *grpc.ClientConn {
	c.t.Helper()
	cc, err := grpc.NewClient(c.APIAddr(i), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

// Converged waits until every running node has applied the same index and
// holds the same state digest.
func (c *Cluster) Converged() {
	c.t.Helper()
	testkit.Eventually(c.t, 15*time.Second, "nodes to converge", func() (bool, string) {
		var idx, dig uint64
		first, same := true, true
		saw := ""
		for _, n := range c.Nodes() {
			a, d := n.FSM().AppliedIndex(), n.FSM().Digest()
			saw += fmt.Sprintf("%s:%d/%016x ", n.ID(), a, d)
			if first {
				idx, dig, first = a, d, false
			} else if a != idx || d != dig {
				same = false
			}
		}
		return same && idx > 0, saw
	})
}
