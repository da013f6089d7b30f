package testkit

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// RaftClient returns a Raft transport that speaks raft's own wire format
// but checks nothing: over plain TCP when cert is nil, else over TLS with
// cert, not verifying the server. Tests use it as a peer, or an intruder,
// of a node's Raft port.
func RaftClient(t testing.TB, cert *Cert) raft.Transport {
	t.Helper()
	if cert == nil {
		tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 2*time.Second, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransport(&tlsDialer{Listener: lis, cert: cert.TLS}, 2, 2*time.Second, io.Discard)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// tlsDialer is a raft.StreamLayer that dials TLS with a certificate and
// does not check the server.
type tlsDialer struct {
	net.Listener
	cert tls.Certificate
}

func (d *tlsDialer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address),
		&tls.Config{Certificates: []tls.Certificate{d.cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a test peer's dialer
}
