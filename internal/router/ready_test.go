package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// readyz returns the router's /readyz status and body.
func readyz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// followRouter starts a router over one static upstream with a local
// replica that follows followAddrs, and returns the router, its URL and a
// function that starts the replica.
func followRouter(t *testing.T, dirAddrs, followAddrs []string, maxStale time.Duration) (*Server, string, func()) {
	t.Helper()
	dir, err := dirclient.New(dirclient.Config{Addrs: dirAddrs, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	fl, err := follow.New(follow.Config{Addrs: followAddrs, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fl.Close() })
	up := newUpstream(t, "m", okJSON(0))
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dir, Local: fl,
		LocalStaleAfter: maxStale, LocalMaxStale: maxStale, ScrapeInterval: 20 * time.Millisecond,
		Static: []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	running := 1
	go func() { done <- s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		for range running {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		}
	})
	return s, hs.URL, func() {
		running++
		go func() { done <- fl.Run(ctx) }()
	}
}

// TestReadyWaitsForLocalReplica: with a local replica, /readyz answers 503
// until the replica is in sync, then 200.
func TestReadyWaitsForLocalReplica(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	s, url, startReplica := followRouter(t, c.APIAddrs(), c.APIAddrs(), time.Hour)
	// Once the upstream is scraped and routable, with the replica not
	// started, only the replica keeps the router out of service.
	testkit.Eventually(t, 5*time.Second, "the static worker to be routable", func() (bool, string) {
		w := s.pool.snapshot()["a"]
		return w != nil && w.model() != "" && w.routable(time.Now()), ""
	})
	if code, body := readyz(t, url); code != http.StatusServiceUnavailable || !strings.Contains(body, "local replica") {
		t.Fatalf("readyz with a routable worker, before the replica's sync: %d %q; want 503 naming the replica", code, body)
	}
	startReplica()
	testkit.Eventually(t, 10*time.Second, "readyz once the replica is in sync", func() (bool, string) {
		code, body := readyz(t, url)
		return code == http.StatusOK, body
	})
}

// TestReadyWithoutReplicaAfterMaxStale: a replica that cannot sync (no
// directory node answers) holds readiness back for --follow-max-stale, not
// for good.
func TestReadyWithoutReplicaAfterMaxStale(t *testing.T) {
	dead := strings.TrimPrefix(deadAddress(t), "http://")
	const maxStale = 1500 * time.Millisecond
	start := time.Now()
	_, url, startReplica := followRouter(t, []string{dead}, []string{dead}, maxStale)
	startReplica()
	testkit.Eventually(t, 5*time.Second, "readyz to wait for the replica", func() (bool, string) {
		code, body := readyz(t, url)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "local replica"), body
	})
	testkit.Eventually(t, 10*time.Second, "readyz without the replica once --follow-max-stale passed", func() (bool, string) {
		code, body := readyz(t, url)
		return code == http.StatusOK, body
	})
	if since := time.Since(start); since < maxStale {
		t.Fatalf("ready %v after start, before --follow-max-stale %v", since, maxStale)
	}
}
