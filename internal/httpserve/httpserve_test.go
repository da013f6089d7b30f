package httpserve

import (
	"bufio"
	"net"
	"net/http"
	"strings"
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
	go func() { _ = Serve(srv, l) }()
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

// A connection a client dialed and kept unused (Go's Transport parks one
// it dialed for a request another connection served first) must not be
// closed at the header timeout: the client's next request on it would fail
// before any response byte.
func TestFreshConnectionWaitsAsIdleOneDoes(t *testing.T) {
	const header = 100 * time.Millisecond
	addr := serve(t, Timeouts{ReadHeader: header, Idle: time.Minute})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(5 * header) // the connection unused past the header timeout, as in a client's pool
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatalf("write on a fresh connection unused for %v: %v", 5*header, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a fresh connection unused for %v was closed (header timeout %v, idle timeout 1m): %v", 5*header, header, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// A fresh connection that never sends a byte is closed after the idle
// timeout, not kept forever.
func TestSilentFreshConnectionClosedAtIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	addr := serve(t, Timeouts{ReadHeader: time.Hour, Idle: idle})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a silent fresh connection was kept past 10 s with a 300 ms idle timeout")
	}
	if took := time.Since(start); took < idle/2 {
		t.Fatalf("closed after %v, before the idle timeout %v", took, idle)
	}
}

// Closing the server closes the connections still waiting for their first
// byte.
func TestCloseClosesWaitingConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(http.NotFoundHandler(), Timeouts{Idle: time.Hour}, nil)
	p := Patient(l, time.Hour).(*patientListener)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(p) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The listener holds c once it is accepted; Close must reach it.
	if err := testkit.Poll(t.Context(), 5*time.Second, "connection waiting", func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.waiting) == 1, "no connection waiting"
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a waiting connection outlived the server's Close: %v", err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatalf("Serve returned %v, want ErrServerClosed", err)
	}
}
