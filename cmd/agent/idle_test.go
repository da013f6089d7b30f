package main

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// The agent's /metrics server closes a keep-alive connection left idle
// for --http-idle-timeout.
func TestIdleConnectionClosed(t *testing.T) {
	addr := testkit.FreeAddrs(t, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--directory", "127.0.0.1:1", "--worker-id", "w", "--http-addr", addr,
			"--http-idle-timeout", "1s", "--kv-events-endpoint", "tcp://127.0.0.1:1", "--log-level", "error"}, env(nil), io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	testkit.Eventually(t, 10*time.Second, "the agent's HTTP server", func() (bool, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	took, err := testkit.IdleClosed(addr, "/metrics", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("closed %v after the response, before the idle timeout", took)
	}
}
