package node_test

import (
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// A node's HTTP server (metrics, health) closes a keep-alive connection
// left idle for HTTPIdleTimeout.
func TestHTTPIdleConnectionClosed(t *testing.T) {
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) {
		cfg.HTTPAddr, cfg.HTTPIdleTimeout = "127.0.0.1:0", time.Second
	})
	took, err := testkit.IdleClosed(c.Node(0).HTTPAddr(), "/healthz", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("closed %v after the response, before the idle timeout", took)
	}
}
