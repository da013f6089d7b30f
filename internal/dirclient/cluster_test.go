package dirclient

import (
	"context"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
)

// dirConfig configures the nodes of a test cluster (internal/testkit/dirtest)
// for these tests: the given role tokens, the default maximum staleness.
func dirConfig(tokens node.Tokens) func(int, *node.Config) {
	return func(_ int, c *node.Config) {
		c.Tokens = tokens
		c.MaxStaleness = 0
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	return testkit.FreeAddrs(t, 1)[0]
}

// newClient returns a client closed at the end of the test.
func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testkit.Logger(t).With("client", t.Name())
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testCtx returns a context that ends after d or with the test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
