package raftnet_test

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/raftnet"
	"github.com/kvdir/kvdir/internal/testkit"
)

// members is a Raft configuration a test changes as it goes.
type members struct {
	mu      sync.Mutex
	servers []raft.Server
}

func (m *members) set(addrs ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.servers = nil
	for _, a := range addrs {
		m.servers = append(m.servers, raft.Server{ID: raft.ServerID(a), Address: raft.ServerAddress(a)})
	}
}

func (m *members) get() ([]raft.Server, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]raft.Server(nil), m.servers...), nil
}

var quiet = hclog.New(&hclog.LoggerOptions{Level: hclog.Off})

// serve starts a transport for cert on a free loopback port whose RPCs are
// answered (AppendEntries with success and term 1) and counted.
func serve(t *testing.T, cert *testkit.Cert, ca *testkit.CA, m *members) (*raft.NetworkTransport, *raftnet.StreamLayer, func() int) {
	t.Helper()
	tr, sl, err := raftnet.NewTransport(raftnet.Config{
		Bind: "127.0.0.1:0", Certificate: cert.TLS, CA: ca.Pool(), Members: m.get,
		RecheckInterval: 20 * time.Millisecond, Logger: testkit.Logger(t),
	}, 2, 2*time.Second, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	var mu sync.Mutex
	got := 0
	go func() {
		for rpc := range tr.Consumer() {
			mu.Lock()
			got++
			mu.Unlock()
			rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
		}
	}()
	return tr, sl, func() int { mu.Lock(); defer mu.Unlock(); return got }
}

func appendEntries(tr raft.Transport, to raft.ServerAddress) error {
	var resp raft.AppendEntriesResponse
	return tr.AppendEntries("peer", to, &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 99, LeaderCommitIndex: 5,
		Entries: []*raft.Log{{Index: 1, Term: 99, Type: raft.LogCommand, Data: []byte{0xff}}},
	}, &resp)
}

// TestMembersOnly: a member with a CA-signed certificate for its host gets
// its RPCs through; plain TCP, a certificate from another CA and a CA-signed
// certificate for a host no member has are refused during the handshake,
// before the transport reads anything, and each refusal is counted by
// reason.
func TestMembersOnly(t *testing.T) {
	ca := testkit.MustCA(t, "cluster CA")
	m := &members{}
	srv, sl, got := serve(t, ca.MustIssue(t, []string{"127.0.0.1"}), ca, m)
	peer := testkit.RaftClient(t, ca.MustIssue(t, []string{"127.0.0.1"}))
	m.set(string(srv.LocalAddr()), "127.0.0.1:1")

	if err := appendEntries(peer, srv.LocalAddr()); err != nil {
		t.Fatalf("member's AppendEntries: %v", err)
	}
	if got() != 1 {
		t.Fatalf("transport received %d RPCs from a member, want 1", got())
	}
	cases := []struct {
		name   string
		tr     raft.Transport
		reason string
	}{
		{"plain TCP", testkit.RaftClient(t, nil), raftnet.ReasonHandshake},
		{"another CA", testkit.RaftClient(t, testkit.MustCA(t, "rogue CA").MustIssue(t, []string{"127.0.0.1"})), raftnet.ReasonHandshake},
		{"no member's host", testkit.RaftClient(t, ca.MustIssue(t, []string{"intruder.example"})), raftnet.ReasonNotMember},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := sl.Refused(c.reason)
			if err := appendEntries(c.tr, srv.LocalAddr()); err == nil {
				t.Fatal("AppendEntries succeeded")
			}
			if got() != 1 {
				t.Fatalf("transport received %d RPCs, want still 1", got())
			}
			testkit.Eventually(t, 5*time.Second, "the refusal to be counted", func() (bool, string) {
				return sl.Refused(c.reason) > before, ""
			})
		})
	}
}

// TestLiveConfiguration: the member check reads the configuration at each
// connection: a peer is refused before its address joins the
// configuration, accepted after, and its open connections are closed once
// it leaves it; dialling an address outside the configuration is refused.
func TestLiveConfiguration(t *testing.T) {
	ca := testkit.MustCA(t, "cluster CA")
	m := &members{}
	srv, sl, got := serve(t, ca.MustIssue(t, []string{"127.0.0.1"}), ca, m)
	self := string(srv.LocalAddr())
	newcomer := testkit.RaftClient(t, ca.MustIssue(t, []string{"n4.example"}))
	m.set(self)

	if err := appendEntries(newcomer, srv.LocalAddr()); err == nil {
		t.Fatal("a peer outside the configuration got through")
	}
	m.set(self, "n4.example:7000")
	if err := appendEntries(newcomer, srv.LocalAddr()); err != nil {
		t.Fatalf("after it joined the configuration: %v", err)
	}
	if got() != 1 {
		t.Fatalf("%d RPCs received, want 1", got())
	}
	before := sl.Refused(raftnet.ReasonRemoved)
	m.set(self)
	testkit.Eventually(t, 5*time.Second, "the removed peer's connection to be closed", func() (bool, string) {
		return sl.Refused(raftnet.ReasonRemoved) > before, ""
	})
	if err := appendEntries(newcomer, srv.LocalAddr()); err == nil {
		t.Fatal("a removed peer got through")
	}

	// Dialling: only members' addresses.
	_, err := sl.Dial("127.0.0.1:1", time.Second)
	if !errors.Is(err, raftnet.ErrNotMember) {
		t.Fatalf("Dial of a non-member: %v, want ErrNotMember", err)
	}
}

// TestEmptyConfigurationAcceptsCASigned: a node not yet added to a cluster
// (no configuration) accepts any peer the CA signed, so that the leader can
// reach it; others still fail the handshake.
func TestEmptyConfigurationAcceptsCASigned(t *testing.T) {
	ca := testkit.MustCA(t, "cluster CA")
	m := &members{}
	srv, _, _ := serve(t, ca.MustIssue(t, []string{"127.0.0.1"}), ca, m)
	if err := appendEntries(testkit.RaftClient(t, ca.MustIssue(t, []string{"leader.example"})), srv.LocalAddr()); err != nil {
		t.Fatalf("CA-signed peer to a node without configuration: %v", err)
	}
	if err := appendEntries(testkit.RaftClient(t, nil), srv.LocalAddr()); err == nil {
		t.Fatal("plain TCP to a node without configuration got through")
	}
}

// TestServerIdentityChecked: the dialling side verifies that the member it
// dials presents a certificate valid for the address's host.
func TestServerIdentityChecked(t *testing.T) {
	ca := testkit.MustCA(t, "cluster CA")
	m := &members{}
	srv, _, got := serve(t, ca.MustIssue(t, []string{"127.0.0.1"}), ca, m)
	_, port, _ := net.SplitHostPort(string(srv.LocalAddr()))
	// The same listener reached by a name its certificate does not hold.
	other := raft.ServerAddress("localhost:" + port)
	m.set(string(srv.LocalAddr()), string(other))
	peer, _, err := raftnet.NewTransport(raftnet.Config{
		Bind: "127.0.0.1:0", Certificate: ca.MustIssue(t, []string{"127.0.0.1"}).TLS, CA: ca.Pool(), Members: m.get,
		Logger: testkit.Logger(t),
	}, 2, 2*time.Second, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := appendEntries(peer, other); err == nil {
		t.Fatal("dialled a member whose certificate is not valid for the dialled host")
	}
	if got() != 0 {
		t.Fatalf("%d RPCs received", got())
	}
}

// TestCheckCertificate: the start-up check names what is wrong.
func TestCheckCertificate(t *testing.T) {
	ca := testkit.MustCA(t, "cluster CA")
	if err := raftnet.CheckCertificate(ca.MustIssue(t, []string{"127.0.0.1"}).TLS, ca.Pool(), "127.0.0.1:7000"); err != nil {
		t.Fatalf("good certificate: %v", err)
	}
	if err := raftnet.CheckCertificate(tls.Certificate{}, ca.Pool(), "127.0.0.1:7000"); err == nil {
		t.Fatal("empty certificate accepted")
	}
	_, err := raftnet.New(raftnet.Config{Bind: "127.0.0.1:0", Advertise: "10.0.0.1:7000",
		Certificate: ca.MustIssue(t, []string{"127.0.0.1"}).TLS, CA: ca.Pool(),
		Members: (&members{}).get, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		t.Fatal("New accepted a certificate not valid for the advertised host")
	}
}
