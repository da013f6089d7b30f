package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// TestDirectoryDownTripsBreakerAtOnce runs a router against a real
// directory node (gRPC, Raft, in process) and stops the node. With a match
// timeout of an hour, the look-ups at the stopped node still end, each
// before its request's own deadline (the client gives up after one round
// of refused connections), as errors the breaker counts: after
// breakerFailures of them the next requests are placed by the fallback
// without asking the directory (the look-up counter stands still). A
// router discovering its workers from that directory, which had none,
// answers 503 saying the directory is unreachable, naming the node, and
// not blaming the agents.
func TestDirectoryDownTripsBreakerAtOnce(t *testing.T) {
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) { cfg.Lease = time.Hour })
	dc := dirClientFor(t, c)

	// A router that knows its worker and asks the directory for matches.
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dc, MatchTimeout: time.Hour,
		Static: []StaticWorker{{ID: "a", Address: "http://127.0.0.1:1", Model: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.pool.replace([]workerSpec{{ID: "a", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16}})
	// A router that discovers its workers from the directory.
	s2, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s2.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hs := httptest.NewServer(s2.Handler())
	t.Cleanup(hs.Close)

	req := longChat(t)
	decide := func() *decision {
		t.Helper()
		rctx, rcancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer rcancel()
		d, aerr := s.decide(rctx, req, nil)
		if aerr != nil {
			t.Fatalf("decide: %v", aerr)
		}
		if rctx.Err() != nil {
			t.Fatalf("the decision waited out its request's deadline (fallback %q)", d.fallback)
		}
		return d
	}
	if d := decide(); d.fallback != "" {
		t.Fatalf("with the directory up: fallback %q", d.fallback)
	}
	testkit.Eventually(t, 10*time.Second, "a 503 blaming the agents while the directory is up and empty", func() (bool, string) {
		resp, body := post(t, hs.URL+PathChat, chatBody)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "agents") &&
			!strings.Contains(body, "unreachable"), fmt.Sprintf("%d %s", resp.StatusCode, body)
	})

	c.Stop(0)
	for i := range breakerFailures {
		if d := decide(); d.fallback != FallbackError {
			t.Fatalf("look-up %d at the stopped node: fallback %q, want %q", i, d.fallback, FallbackError)
		}
	}
	asked := counterValue(t, s, "kvdir_router_matches_total", MatchDirectory)
	for i := range 5 {
		if d := decide(); d.fallback != FallbackDown {
			t.Fatalf("request %d after %d refused look-ups: fallback %q, want %q", i, breakerFailures, d.fallback, FallbackDown)
		}
	}
	if now := counterValue(t, s, "kvdir_router_matches_total", MatchDirectory); now != asked {
		t.Fatalf("the router asked the directory %v more times with the breaker open", now-asked)
	}

	testkit.Eventually(t, 20*time.Second, "a 503 naming the unreachable directory", func() (bool, string) {
		resp, body := post(t, hs.URL+PathChat, chatBody)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "directory unreachable") &&
			strings.Contains(body, c.APIAddr(0)) && !strings.Contains(body, "agents"), fmt.Sprintf("%d %s", resp.StatusCode, body)
	})
}
