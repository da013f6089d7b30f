// Package raftnet carries hashicorp/raft's network transport over mutual
// TLS. Its StreamLayer serves and dials TLS 1.3 only, requires a
// certificate signed by the cluster's CA on both ends of every connection,
// and accepts a peer only while it is a member: its certificate must be
// valid for the host of a Raft address in the live Raft configuration.
//
// Why the host of the Raft address is the identity: the configuration
// records each member by id and Raft address, and the address is what the
// dialling side already verifies (TLS hostname verification against the
// host it dials). Checking inbound connections against the same hosts makes
// the rule symmetric, needs no naming scheme beyond what a server
// certificate carries (a DNS or IP subject alternative name), and follows
// membership changes without reissuing certificates: a member added with
// AddVoter is accepted as soon as its address is in the configuration. What
// it does not do is tell apart members that share a host (several nodes on
// one machine): any certificate from the CA that is valid for a member's
// host is taken as that host's members. So the CA (or an intermediate)
// should sign directory members' certificates only.
//
// A node whose configuration is empty (started to be added by --join, not
// yet added) accepts any peer whose certificate the CA signed: it cannot
// know the members before the leader first contacts it.
package raftnet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultRecheckInterval  = time.Second
)

// Config configures a StreamLayer.
type Config struct {
	// Bind is the address to listen on; Advertise the address members dial
	// (default: the bound address).
	Bind, Advertise string
	// Certificate is this member's, with its private key (and any
	// intermediates after the leaf): served to peers that dial this node
	// and presented when it dials them.
	Certificate tls.Certificate
	// CA holds the certificates that sign members' certificates; peers are
	// verified against it in both directions (never the system roots).
	CA *x509.CertPool
	// Members returns the servers of the latest Raft configuration
	// (raft.Raft.GetConfiguration). An error refuses every peer for now.
	Members func() ([]raft.Server, error)
	// HandshakeTimeout bounds a TLS handshake (default 10s).
	HandshakeTimeout time.Duration
	// RecheckInterval is how often accepted connections are checked again
	// against the configuration; a peer that is no longer a member has its
	// connections closed (default 1s).
	RecheckInterval time.Duration
	Logger          *slog.Logger
	// Registerer, if set, receives kvdir_raft_peer_refused_total.
	Registerer prometheus.Registerer
}

// Refusal reasons, the label of kvdir_raft_peer_refused_total.
const (
	ReasonHandshake = "handshake"  // no TLS, no certificate, or one the CA did not sign
	ReasonNotMember = "not_member" // a valid certificate for no member's host
	ReasonRemoved   = "removed"    // an open connection of a peer that left the configuration
	ReasonDial      = "dial_not_member"
)

// ErrNotMember is the error of a peer that is not in the Raft
// configuration.
var ErrNotMember = errors.New("not a member of the Raft configuration")

// StreamLayer is a raft.StreamLayer over mutual TLS.
type StreamLayer struct {
	cfg     Config
	lis     net.Listener
	adv     net.Addr
	log     *slog.Logger
	server  *tls.Config
	refused *prometheus.CounterVec
	counts  sync.Map // reason -> *atomic.Uint64, for Refused

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	closed bool
	ready  chan *serverConn
	done   chan struct{}
	ctx    context.Context // cancelled by Close: ends pending handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup

	logMu   sync.Mutex
	lastLog map[string]time.Time
	quiet   map[string]int
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

// New checks the certificate against the CA and the advertised address
// (CheckCertificate), listens on cfg.Bind and returns the layer.
func New(cfg Config) (*StreamLayer, error) {
	if cfg.CA == nil {
		return nil, errors.New("raftnet: a CA is required to verify peers")
	}
	if cfg.Members == nil {
		return nil, errors.New("raftnet: no source of the Raft configuration")
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.RecheckInterval <= 0 {
		cfg.RecheckInterval = DefaultRecheckInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	adv := cfg.Advertise
	if adv == "" {
		adv = cfg.Bind
	}
	if err := CheckCertificate(cfg.Certificate, cfg.CA, adv); err != nil {
		return nil, fmt.Errorf("raftnet: %w", err)
	}
	lis, err := net.Listen("tcp", cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("raftnet: listen on %s: %w", cfg.Bind, err)
	}
	if cfg.Advertise == "" {
		adv = lis.Addr().String()
	}
	advAddr, err := net.ResolveTCPAddr("tcp", adv)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("raftnet: advertised address %s: %w", adv, err)
	}
	s := &StreamLayer{cfg: cfg, lis: lis, adv: advAddr, log: cfg.Logger.With("component", "raft-tls"),
		conns: map[*serverConn]struct{}{}, ready: make(chan *serverConn), done: make(chan struct{}),
		lastLog: map[string]time.Time{}, quiet: map[string]int{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.server = &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cfg.Certificate},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        cfg.CA,
		VerifyConnection: s.verifyClient,
	}
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvdir_raft_peer_refused_total",
		Help: "Raft connections refused by the mutual-TLS transport, by reason.",
	}, []string{"reason"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.refused); err != nil {
			s.cancel()
			lis.Close()
			return nil, fmt.Errorf("raftnet: register metrics: %w", err)
		}
	}
	s.wg.Add(2)
	go s.acceptLoop()
	go s.recheckLoop()
	return s, nil
}

// NewTransport returns a raft.NetworkTransport over a new StreamLayer
// (maxPool connections kept per peer, timeout on each RPC's I/O).
func NewTransport(cfg Config, maxPool int, timeout time.Duration, logger hclog.Logger) (*raft.NetworkTransport, *StreamLayer, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	t := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: s, MaxPool: maxPool, Timeout: timeout, Logger: logger,
	})
	return t, s, nil
}

// CheckCertificate reports why cert would not work as a member's (New
// refuses such a certificate): it must
// hold a key, chain to ca, allow both TLS server and client use (a member
// serves and dials with it), and be valid for the host of advertise, the
// Raft address peers dial and check.
func CheckCertificate(cert tls.Certificate, ca *x509.CertPool, advertise string) error {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return errors.New("no certificate and key")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("parse the certificate: %w", err)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parse an intermediate certificate: %w", err)
		}
		inter.AddCert(c)
	}
	for _, u := range []struct {
		use  x509.ExtKeyUsage
		name string
	}{{x509.ExtKeyUsageServerAuth, "serverAuth"}, {x509.ExtKeyUsageClientAuth, "clientAuth"}} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: ca, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{u.use}})
		if err != nil {
			return fmt.Errorf("the certificate (%s) does not verify against the CA for %s: %w; a member's certificate must be signed by the CA and allow both serverAuth and clientAuth, since every member serves and dials", describe(leaf), u.name, err)
		}
	}
	host, _, err := net.SplitHostPort(advertise)
	if err != nil {
		return fmt.Errorf("advertised address %q: want host:port", advertise)
	}
	if err := leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("the certificate (%s) is not valid for %s, the host of this node's Raft address %s: peers check a member's certificate against the host of its Raft address; add it as a subject alternative name", describe(leaf), host, advertise)
	}
	return nil
}

// Accept returns the next connection whose TLS handshake succeeded and
// whose peer is a member. Handshakes run apart from Accept (one goroutine
// each, bounded by HandshakeTimeout), so a slow or hostile peer holds up no
// other; refused connections never reach the transport.
func (s *StreamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.ready:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// acceptLoop accepts TCP connections and hands each to a handshake.
func (s *StreamLayer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.lis.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			s.log.Warn("accept a Raft connection", "err", err)
			select {
			case <-s.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		s.wg.Add(1)
		go s.handshake(c)
	}
}

// handshake runs the server side of c's handshake and passes c to Accept
// if the peer passes.
func (s *StreamLayer) handshake(raw net.Conn) {
	defer s.wg.Done()
	tc := tls.Server(raw, s.server)
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		if s.ctx.Err() != nil { // closing
			tc.Close()
			return
		}
		reason := ReasonHandshake
		if errors.Is(err, ErrNotMember) {
			reason = ReasonNotMember
		}
		s.refuse(reason, raw.RemoteAddr().String(), err)
		tc.Close()
		return
	}
	c := &serverConn{Conn: tc, s: s, leaf: tc.ConnectionState().PeerCertificates[0]}
	if !s.track(c) {
		tc.Close()
		return
	}
	select {
	case s.ready <- c:
	case <-s.done:
		c.Close()
	}
}

// Close stops listening and closes the accepted connections.
func (s *StreamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.cancel()
	conns := make([]*serverConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.lis.Close()
	for _, c := range conns {
		c.Conn.Close()
	}
	s.wg.Wait()
	return err
}

// Addr is the advertised address (raft's LocalAddr).
func (s *StreamLayer) Addr() net.Addr { return s.adv }

// Dial connects to a member's Raft address over TLS, verifying that the
// certificate it presents is signed by the CA and valid for the address's
// host. An address that is not in the configuration is not dialled.
func (s *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	members, err := s.cfg.Members()
	if err != nil {
		return nil, fmt.Errorf("raftnet: read the Raft configuration: %w", err)
	}
	if len(members) > 0 && !slices.ContainsFunc(members, func(m raft.Server) bool { return m.Address == address }) {
		s.refuse(ReasonDial, string(address), ErrNotMember)
		return nil, fmt.Errorf("raftnet: dial %s: %w", address, ErrNotMember)
	}
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, fmt.Errorf("raftnet: dial %q: want host:port", address)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{s.cfg.Certificate},
		RootCAs:      s.cfg.CA,
		ServerName:   host,
	}
	if timeout <= 0 {
		timeout = s.cfg.HandshakeTimeout
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), cfg)
	if err != nil {
		return nil, fmt.Errorf("raftnet: dial %s: %w", address, err)
	}
	return c, nil
}

// Refused returns how many connections were refused for reason.
func (s *StreamLayer) Refused(reason string) uint64 {
	if v, ok := s.counts.Load(reason); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

// verifyClient runs in the server's handshake after the chain was verified
// against the CA: the peer must be valid for a member's host.
func (s *StreamLayer) verifyClient(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("raftnet: no client certificate")
	}
	members, err := s.cfg.Members()
	if err != nil {
		return fmt.Errorf("raftnet: read the Raft configuration: %w", err)
	}
	if err := memberCert(cs.PeerCertificates[0], members); err != nil {
		return err
	}
	return nil
}

// memberCert reports whether leaf is valid for the host of one of the
// members' addresses (any CA-signed peer when there are no members yet).
func memberCert(leaf *x509.Certificate, members []raft.Server) error {
	if len(members) == 0 {
		return nil
	}
	for _, m := range members {
		host, _, err := net.SplitHostPort(string(m.Address))
		if err == nil && leaf.VerifyHostname(host) == nil {
			return nil
		}
	}
	return fmt.Errorf("raftnet: peer certificate (%s) is valid for no member's host: %w", describe(leaf), ErrNotMember)
}

// describe names a certificate for a log line or an error.
func describe(c *x509.Certificate) string {
	var names []string
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		names = []string{"none"}
	}
	return fmt.Sprintf("subject %q, issuer %q, names %s", c.Subject.CommonName, c.Issuer.CommonName, strings.Join(names, ","))
}

// refuse counts and logs a refused connection; the log is limited to one
// line per reason a second, with the number of lines left out.
func (s *StreamLayer) refuse(reason, remote string, err error) {
	s.refused.WithLabelValues(reason).Inc()
	v, _ := s.counts.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
	s.logMu.Lock()
	now := time.Now()
	if now.Sub(s.lastLog[reason]) < time.Second {
		s.quiet[reason]++
		s.logMu.Unlock()
		return
	}
	left := s.quiet[reason]
	s.lastLog[reason], s.quiet[reason] = now, 0
	s.logMu.Unlock()
	s.log.Warn("refused a Raft connection", "reason", reason, "peer", remote, "err", err, "not_logged_since_last", left)
}

func (s *StreamLayer) track(c *serverConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *StreamLayer) untrack(c *serverConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// recheckLoop closes the connections of peers that left the configuration.
func (s *StreamLayer) recheckLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.RecheckInterval)
	defer t.Stop()
	var last string
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		members, err := s.cfg.Members()
		if err != nil {
			continue
		}
		key := fmt.Sprint(members)
		if key == last {
			continue
		}
		last = key
		s.mu.Lock()
		var gone []*serverConn
		for c := range s.conns {
			if memberCert(c.leaf, members) != nil {
				gone = append(gone, c)
			}
		}
		s.mu.Unlock()
		for _, c := range gone {
			s.refuse(ReasonRemoved, c.RemoteAddr().String(), ErrNotMember)
			c.Close()
		}
	}
}

// serverConn is an accepted connection, tracked until it is closed.
type serverConn struct {
	*tls.Conn
	s    *StreamLayer
	leaf *x509.Certificate
}

func (c *serverConn) Close() error {
	c.s.untrack(c)
	return c.Conn.Close()
}
