package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// dirClientFor is a directory client of c's nodes, closed when t ends.
func dirClientFor(t testing.TB, c *dirtest.Cluster) *dirclient.Client {
	t.Helper()
	dc, err := dirclient.New(dirclient.Config{Addrs: c.APIAddrs(), Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	return dc
}

// registerIn registers worker id of model at addr in c, through its
// leader, and returns its epoch.
func registerIn(t *testing.T, c *dirtest.Cluster, id, model, addr string) uint64 {
	t.Helper()
	return registerLabelled(t, c, id, model, addr, nil)
}

// registerLabelled is registerIn with the worker's labels.
func registerLabelled(t *testing.T, c *dirtest.Cluster, id, model, addr string, labels map[string]string) uint64 {
	t.Helper()
	var epoch uint64
	testkit.Eventually(t, 10*time.Second, "registration of "+id, func() (bool, string) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		resp, err := kvdirv1.NewAgentServiceClient(c.Conn(c.Leader())).Register(ctx,
			&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: id, Model: model, Address: addr, BlockSize: 16, Labels: labels}})
		if err != nil {
			return false, err.Error()
		}
		epoch = resp.Epoch
		return true, ""
	})
	return epoch
}

// storeIn publishes that worker id (of epoch) stored chain, in c.
func storeIn(t *testing.T, c *dirtest.Cluster, id string, epoch uint64, chain []uint64) {
	t.Helper()
	st, err := kvdirv1.NewAgentServiceClient(c.Conn(c.Leader())).Publish(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.CloseSend() }()
	b := &kvdirv1.EventBatch{WorkerId: id, Epoch: epoch, FirstSeq: 1, LastSeq: 1,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}}}
	if err := st.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		t.Fatalf("publish: %v %v", resp, err)
	}
}

func groupChat(t *testing.T, model string) *request {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("prefix caches save prefill time. ", 30) + `"}]}`
	req, aerr := parseRequest([]byte(body), true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	return req
}

// TestGroupsRouteEachModelInItsGroup runs a router over two directory
// groups (real in-process nodes): group a (one node, --models a) with
// workers a1 and a2, group b (three nodes, --models b) with worker b1.
// Requests for model a go to a's workers only and are matched in a's
// directory (a2, which holds the prompt's blocks there, is picked with
// them); requests for b go to b1. Once every node of group b is stopped,
// b's requests fall back to the fallback policy while a's still use a's
// directory: the breaker is per group.
func TestGroupsRouteEachModelInItsGroup(t *testing.T) {
	ga := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"a"} })
	gb := dirtest.New(t, 3, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"b"} })
	ua1, ua2, ub1 := newUpstream(t, "a", okJSON(0)), newUpstream(t, "a", okJSON(0)), newUpstream(t, "b", okJSON(0))
	registerIn(t, ga, "a1", "a", ua1.URL)
	epA2 := registerIn(t, ga, "a2", "a", ua2.URL)
	registerIn(t, gb, "b1", "b", ub1.URL)

	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), ScrapeInterval: 20 * time.Millisecond,
		MatchTimeout: 5 * time.Second, Logger: testkit.Logger(t),
		Groups: []DirectoryGroup{{Name: "a", Directory: dirClientFor(t, ga)}, {Name: "b", Directory: dirClientFor(t, gb)}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	testkit.Eventually(t, 10*time.Second, "the router ready with both groups' workers", func() (bool, string) {
		ok, why := s.Ready()
		return ok && len(s.pool.snapshot()) == 3, fmt.Sprintf("%v %s, %d workers", ok, why, len(s.pool.snapshot()))
	})
	for id, want := range map[string]string{"a1": "a", "a2": "a", "b1": "b"} {
		if g := s.groupOf(s.pool.snapshot()[id]).name; g != want {
			t.Fatalf("worker %s in group %s, want %s", id, g, want)
		}
	}
	if sv := s.groups[0].servedModels(); len(sv) != 1 || sv[0] != "a" {
		t.Fatalf("group a serves %v, want [a] (its nodes' --models)", sv)
	}

	decide := func(model string) *decision {
		t.Helper()
		d, aerr := s.decide(t.Context(), groupChat(t, model), nil)
		if aerr != nil {
			t.Fatalf("decide %s: %v", model, aerr)
		}
		return d
	}
	// a2 holds the prompt's chain in group a.
	d := decide("a")
	storeIn(t, ga, "a2", epA2, d.chain)
	testkit.Eventually(t, 10*time.Second, "model a matched in group a, on a2", func() (bool, string) {
		d := decide("a")
		return d.group.name == "a" && d.fallback == "" && d.matchSource == MatchDirectory && d.pick.Worker == "a2" && d.pick.PredictedCachedTokens > 0,
			fmt.Sprintf("group %s, %v", d.group.name, d)
	})
	for range 10 {
		d := decide("a")
		for _, w := range d.workers {
			if w.id == "b1" {
				t.Fatalf("model a's candidates include b1: %v", d.workers)
			}
		}
		if d := decide("b"); d.group.name != "b" || d.pick.Worker != "b1" || d.fallback != "" || len(d.workers) != 1 {
			t.Fatalf("model b: group %s, %v, %d candidates", d.group.name, d, len(d.workers))
		}
	}
	if e := s.explain(groupChat(t, "b"), decide("b")); e.Group != "b" {
		t.Fatalf("explain of model b names group %q", e.Group)
	}
	// Over HTTP, each model reaches its own workers only.
	for _, m := range []string{"a", "b"} {
		resp, body := post(t, hs.URL+PathChat, `{"model":"`+m+`","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
		got := resp.Header.Get(HeaderWorker)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(got, m) {
			t.Fatalf("model %s: %d %s, worker %q", m, resp.StatusCode, body, got)
		}
	}
	if ub1.hits.Load() != 1 || ua1.hits.Load()+ua2.hits.Load() != 1 {
		t.Fatalf("hits a1 %d a2 %d b1 %d, want one for a's workers and one for b1", ua1.hits.Load(), ua2.hits.Load(), ub1.hits.Load())
	}

	// Group b goes down entirely.
	for i := range gb.Size() {
		gb.Stop(i)
	}
	matchedA := counterValue(t, s, "kvdir_router_matches_total", "a")
	testkit.Eventually(t, 20*time.Second, "model b placed by the fallback once group b is down", func() (bool, string) {
		d := decide("b")
		return d.fallback == FallbackError || d.fallback == FallbackDown, d.String()
	})
	for range 2 * breakerFailures {
		if d := decide("b"); d.fallback == "" || d.pick.Worker != "b1" {
			t.Fatalf("model b with its group down: %v", d)
		}
		if d := decide("a"); d.fallback != "" || d.matchSource != MatchDirectory || d.pick.Worker != "a2" || d.pick.PredictedCachedTokens == 0 {
			t.Fatalf("model a with group b down: %v (source %q)", d, d.matchSource)
		}
	}
	if now := counterValue(t, s, "kvdir_router_matches_total", "a"); now < matchedA+2*breakerFailures {
		t.Fatalf("group a's look-ups went from %v to %v: a's decisions did not ask a's directory", matchedA, now)
	}
	if got := counterValue(t, s, "kvdir_router_fallbacks_total", "a"); got != 0 {
		t.Fatalf("%v fallbacks counted for group a", got)
	}
}

// TestGroupsModelInTwoGroups checks the misconfiguration of a model two
// groups serve: it is routed with the first group given, and readiness and
// the conflicts gauge say so.
func TestGroupsModelInTwoGroups(t *testing.T) {
	ga := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour })
	gb := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour })
	var dcs []*dirclient.Client
	for _, c := range []*dirtest.Cluster{ga, gb} {
		dcs = append(dcs, dirClientFor(t, c))
	}
	ua, ub := newUpstream(t, "m", okJSON(0)), newUpstream(t, "m", okJSON(0))
	registerIn(t, ga, "wa", "m", ua.URL)
	registerIn(t, gb, "wb", "m", ub.URL)
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Logger: testkit.Logger(t),
		Groups: []DirectoryGroup{{Name: "first", Directory: dcs[0]}, {Name: "second", Directory: dcs[1]}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(t, 10*time.Second, "both workers known", func() (bool, string) {
		ok, _ := s.Ready()
		return ok && len(s.pool.snapshot()) == 2, ""
	})
	for range 5 {
		d, aerr := s.decide(t.Context(), groupChat(t, "m"), nil)
		if aerr != nil || d.group.name != "first" || d.pick.Worker != "wa" {
			t.Fatalf("decision %v %v", d, aerr)
		}
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `model "m" is served by directory groups first, second`) {
		t.Fatalf("/readyz: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\nkvdir_router_model_group_conflicts 1\n") {
		t.Fatal("metrics lack kvdir_router_model_group_conflicts 1")
	}
}

// TestGroupsReadyWithoutADownGroup starts a router while every node of
// one of its two groups is down: after the bounded wait it is ready and
// serves the other group's model, and the down group's model is refused
// with 503 naming that group.
func TestGroupsReadyWithoutADownGroup(t *testing.T) {
	ga := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"a"} })
	gb := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"b"} })
	ua := newUpstream(t, "a", okJSON(0))
	registerIn(t, ga, "a1", "a", ua.URL)
	gb.Stop(0)
	var dcs []*dirclient.Client
	for _, c := range []*dirtest.Cluster{ga, gb} {
		dcs = append(dcs, dirClientFor(t, c))
	}
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Logger: testkit.Logger(t), ScrapeInterval: 20 * time.Millisecond,
		Groups: []DirectoryGroup{{Name: "a", Directory: dcs[0]}, {Name: "b", Directory: dcs[1]}}})
	if err != nil {
		t.Fatal(err)
	}
	s.groupWait = 2 * time.Second
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	testkit.Eventually(t, 10*time.Second, "group a's worker list loaded", func() (bool, string) { return s.groups[0].synced.Load(), "" })
	if ok, why := s.Ready(); time.Since(s.created) < s.groupWait-100*time.Millisecond && (ok || !strings.Contains(why, "directory group b not loaded yet")) {
		t.Fatalf("ready within the wait, with group b down: %v %q", ok, why)
	}
	testkit.Eventually(t, 10*time.Second, "ready without group b", func() (bool, string) {
		ok, why := s.Ready()
		return ok, why
	})
	resp, body := post(t, hs.URL+PathChat, `{"model":"a","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderWorker) != "a1" {
		t.Fatalf("model a with group b down: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, hs.URL+PathChat, `{"model":"b","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "directory group b") {
		t.Fatalf("model b with its group down: %d %s", resp.StatusCode, body)
	}
}
