package httpserve

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

func serve(t *testing.T, to Timeouts) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }), to, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

func TestIdleConnectionClosed(t *testing.T) {
	addr := serve(t, Timeouts{Idle: time.Second})
	took, err := testkit.IdleClosed(addr, "/", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("closed %v after the response, before the idle timeout", took)
	}
}

func TestSilentClientClosed(t *testing.T) {
	addr := serve(t, Timeouts{ReadHeader: 200 * time.Millisecond, Idle: time.Hour})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n")); err != nil { // headers never end
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("a client that never finishes its headers kept its connection")
			}
			return
		}
	}
}

func TestDefaults(t *testing.T) {
	s := New(nil, Timeouts{Read: -1}, nil)
	if s.ReadHeaderTimeout != DefaultReadHeaderTimeout || s.IdleTimeout != DefaultIdleTimeout || s.ReadTimeout != 0 {
		t.Fatalf("timeouts %v %v %v", s.ReadHeaderTimeout, s.IdleTimeout, s.ReadTimeout)
	}
}
