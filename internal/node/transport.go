package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/raftnet"
)

// RaftTLS runs Raft over mutual TLS (internal/raftnet): the node serves
// Certificate to members that dial it and presents it when it dials them,
// and accepts a peer only if the peer's certificate is signed by CA and
// valid for the host of a Raft address in the live configuration. The
// certificate must be valid for the host of the node's own Raft advertise
// address and allow both serverAuth and clientAuth.
type RaftTLS struct {
	Certificate tls.Certificate
	CA          *x509.CertPool
}

// Raft transport settings: connections kept per peer, and the I/O timeout
// of one RPC.
const (
	raftMaxPool = 8
	raftTimeout = 10 * time.Second
)

// raftMembers gives the transport the live Raft configuration once Raft
// runs (before that, every peer is refused and retries).
type raftMembers struct{ r atomic.Pointer[raft.Raft] }

func (m *raftMembers) servers() ([]raft.Server, error) {
	r := m.r.Load()
	if r == nil {
		return nil, errors.New("raft is starting")
	}
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}

// newTransport makes the node's Raft transport: mutual TLS with RaftTLS,
// plain TCP without.
func (n *Node) newTransport(logger hclog.Logger) (raft.Transport, func() error, error) {
	cfg := n.cfg
	if cfg.RaftTLS == nil {
		adv, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
		if err != nil {
			return nil, nil, fmt.Errorf("node: raft advertise address: %w", err)
		}
		t, err := raft.NewTCPTransportWithLogger(cfg.RaftAddr, adv, raftMaxPool, raftTimeout, logger)
		if err != nil {
			return nil, nil, fmt.Errorf("node: raft transport: %w", err)
		}
		return t, t.Close, nil
	}
	n.members = &raftMembers{}
	t, _, err := raftnet.NewTransport(raftnet.Config{
		Bind: cfg.RaftAddr, Advertise: cfg.RaftAdvertise,
		Certificate: cfg.RaftTLS.Certificate, CA: cfg.RaftTLS.CA,
		Members: n.members.servers, Logger: n.log, Registerer: cfg.Registerer,
	}, raftMaxPool, raftTimeout, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("node: raft transport: %w", err)
	}
	return t, t.Close, nil
}

// raftStarted hands the running Raft to the transport's member check.
func (n *Node) raftStarted(r *raft.Raft) {
	if n.members != nil {
		n.members.r.Store(r)
	}
}
