package node_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/raftfsm"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// tcpCluster is an in-process cluster on real Raft transports over
// loopback TCP (mutual TLS or plain), with BoltDB in temporary
// directories.
type tcpCluster struct {
	t     *testing.T
	ca    *testkit.CA // nil: plain TCP
	nodes []*node.Node
	regs  []*prometheus.Registry
}

// freeAddr is a loopback address on host whose port was free a moment ago.
func freeAddr(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *tcpCluster) start(id, raftAddr string, initial map[string]string, join []string) *node.Node {
	c.t.Helper()
	reg := prometheus.NewRegistry()
	cfg := node.Config{
		ID: id, RaftAddr: raftAddr, APIAddr: "127.0.0.1:0", DataDir: c.t.TempDir(),
		InitialCluster: initial, Join: join,
		HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		Lease: time.Minute, MaxStaleness: 5 * time.Second,
		Logger: testkit.Logger(c.t), Registerer: reg,
	}
	if c.ca != nil {
		host, _, _ := net.SplitHostPort(raftAddr)
		cfg.RaftTLS = &node.RaftTLS{Certificate: c.ca.MustIssue(c.t, []string{host}).TLS, CA: c.ca.Pool()}
	}
	n, err := node.New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	})
	c.nodes = append(c.nodes, n)
	c.regs = append(c.regs, reg)
	return n
}

// newTCPCluster starts three nodes on 127.0.0.1.
func newTCPCluster(t *testing.T, ca *testkit.CA) *tcpCluster {
	c := &tcpCluster{t: t, ca: ca}
	initial := map[string]string{}
	for i := range 3 {
		initial[fmt.Sprintf("n%d", i+1)] = freeAddr(t, "127.0.0.1")
	}
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		c.start(id, initial[id], initial, nil)
	}
	c.leader()
	return c
}

func (c *tcpCluster) leader() *node.Node {
	c.t.Helper()
	var l *node.Node
	testkit.Eventually(c.t, 20*time.Second, "a leader that every node knows with its API address", func() (bool, string) {
		l = nil
		for _, n := range c.nodes {
			if n.IsLeader() {
				l = n
			}
		}
		if l == nil {
			return false, "no leader"
		}
		for _, n := range c.nodes {
			if api, ok := node.LeaderAPI(n); !ok || api == "" {
				return false, n.ID() + " lacks the leader's API address"
			}
		}
		return true, ""
	})
	return l
}

func (c *tcpCluster) converged() {
	c.t.Helper()
	testkit.Eventually(c.t, 20*time.Second, "every node at the same applied index and digest", func() (bool, string) {
		a, d := c.nodes[0].FSM().AppliedIndex(), c.nodes[0].FSM().Digest()
		saw := ""
		same := true
		for _, n := range c.nodes {
			saw += fmt.Sprintf("%s:%d/%016x ", n.ID(), n.FSM().AppliedIndex(), n.FSM().Digest())
			same = same && n.FSM().AppliedIndex() == a && n.FSM().Digest() == d
		}
		return same, saw
	})
}

// register registers worker id through node n's API.
func register(t *testing.T, n *node.Node, id string) {
	t.Helper()
	cc, err := grpc.NewClient(n.APIAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kvdirv1.NewAgentServiceClient(cc).Register(ctx, &kvdirv1.RegisterRequest{
		Worker: &kvdirv1.WorkerSpec{Id: id, BlockSize: 16, Model: "m", Address: "http://127.0.0.1:1"}}); err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
}

func stat(t *testing.T, n *node.Node, key string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(n.Raft().Stats()[key], 10, 64)
	if err != nil {
		t.Fatalf("%s: raft stat %s: %v", n.ID(), key, err)
	}
	return v
}

// forge sends n an AppendEntries from a leader of a term ten above n's,
// whose one entry, committed at once, registers worker "intruder" at an
// outside address. It returns the forged term and the RPC's outcome.
func forge(t *testing.T, tr raft.Transport, n *node.Node) (uint64, *raft.AppendEntriesResponse, error) {
	t.Helper()
	data, err := raftfsm.Encode(kvdirv1.CommandType_COMMAND_TYPE_REGISTER, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{
		Id: "intruder", BlockSize: 16, Model: "m", Address: "http://203.0.113.7:8000"}}, time.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	term, last, lastTerm := stat(t, n, "term")+10, stat(t, n, "last_log_index"), stat(t, n, "last_log_term")
	var resp raft.AppendEntriesResponse
	err = tr.AppendEntries("intruder", raft.ServerAddress(raftAddr(n)), &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(tr.LocalAddr())},
		Term:      term, PrevLogEntry: last, PrevLogTerm: lastTerm, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: data}},
	}, &resp)
	return term, &resp, err
}

// raftAddr is n's own Raft address from the configuration.
func raftAddr(n *node.Node) string {
	for _, s := range n.Raft().GetConfiguration().Configuration().Servers {
		if string(s.ID) == n.ID() {
			return string(s.Address)
		}
	}
	return ""
}

// TestForgedAppendEntriesOverPlainTCP is the finding this transport
// closes, kept as the control of the test below: on plain TCP one forged
// AppendEntries with a higher term is taken by a node.
func TestForgedAppendEntriesOverPlainTCP(t *testing.T) {
	testkit.SkipIfShort(t, "an in-process cluster on TCP and BoltDB")
	c := newTCPCluster(t, nil)
	var target *node.Node
	for _, n := range c.nodes {
		if !n.IsLeader() {
			target = n
			break
		}
	}
	term, resp, err := forge(t, testkit.RaftClient(t, nil), target)
	if err != nil {
		t.Fatalf("forged AppendEntries over plain TCP: %v", err)
	}
	if got := stat(t, target, "term"); got < term {
		t.Fatalf("%s at term %d after a forged AppendEntries of term %d: the control did not reproduce the finding", target.ID(), got, term)
	}
	if resp.Success {
		testkit.Eventually(t, 10*time.Second, "the intruder's worker on the target", func() (bool, string) {
			_, ok := target.FSM().Worker("intruder")
			return ok, ""
		})
	}
}

// TestRaftOverMutualTLS: three members with certificates from the cluster
// CA form a cluster, elect, replicate and add a fourth member on another
// host; forged AppendEntries (plain TCP, a certificate from another CA, a
// CA-signed certificate for a host that is not a member's) are refused and
// change nothing: no node's term or log reaches the forged term, no node
// holds the intruder's worker, and every node holds the same state.
func TestRaftOverMutualTLS(t *testing.T) {
	testkit.SkipIfShort(t, "an in-process cluster on TLS and BoltDB")
	ca := testkit.MustCA(t, "cluster CA")
	c := newTCPCluster(t, ca)
	register(t, c.leader(), "w1")
	c.converged()

	forgedTerm := uint64(0)
	for _, f := range []struct {
		name string
		tr   raft.Transport
	}{
		{"plain TCP", testkit.RaftClient(t, nil)},
		{"another CA", testkit.RaftClient(t, testkit.MustCA(t, "rogue CA").MustIssue(t, []string{"127.0.0.1"}))},
		{"non-member host", testkit.RaftClient(t, ca.MustIssue(t, []string{"127.0.0.2"}))},
	} {
		for _, n := range c.nodes {
			term, _, err := forge(t, f.tr, n)
			if err == nil {
				t.Errorf("%s: forged AppendEntries to %s was answered", f.name, n.ID())
			}
			forgedTerm = max(forgedTerm, term)
		}
	}
	// A write through the cluster after the forgeries: whatever they had
	// done would show by the time every node applied it.
	register(t, c.leader(), "w2")
	c.converged()
	for i, n := range c.nodes {
		if term, lt := stat(t, n, "term"), stat(t, n, "last_log_term"); term >= forgedTerm || lt >= forgedTerm {
			t.Errorf("%s: term %d, last log term %d after forgeries of terms up to %d", n.ID(), term, lt, forgedTerm)
		}
		if _, ok := n.FSM().Worker("intruder"); ok {
			t.Errorf("%s holds the intruder's worker", n.ID())
		}
		if _, ok := n.FSM().Worker("w2"); !ok {
			t.Errorf("%s lacks w2", n.ID())
		}
		refused := counterSum(t, c.regs[i], "kvdir_raft_peer_refused_total")
		if refused < 3 {
			t.Errorf("%s counted %v refused Raft connections, want at least 3", n.ID(), refused)
		}
	}

	// A fourth member on another host joins; its certificate names only
	// that host, so it is let in because the configuration now lists it.
	n4 := c.start("n4", freeAddr(t, "127.0.0.2"), nil, []string{c.leader().APIAddr()})
	testkit.Eventually(t, 20*time.Second, "four voters", func() (bool, string) {
		return len(c.leader().Raft().GetConfiguration().Configuration().Servers) == 4, ""
	})
	register(t, c.leader(), "w3")
	c.converged()
	if _, ok := n4.FSM().Worker("w3"); !ok {
		t.Fatal("n4 lacks w3")
	}
}

// counterSum is the sum of a counter family's series in reg.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
