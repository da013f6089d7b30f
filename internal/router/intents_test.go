package router

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func testPeerIntent(router string, id, version uint64, worker string, state kvdirv1.IntentState, uncached uint32, ttl, hold time.Duration, chain ...uint64) *kvdirv1.PlacementIntent {
	return &kvdirv1.PlacementIntent{RouterId: router, IntentId: id, Version: version, WorkerId: worker, Chain: chain,
		BlockSize: 16, PromptTokens: 4000, UncachedTokens: uncached, State: state, Ttl: durationpb.New(ttl), Hold: durationpb.New(hold)}
}

func wantLoad(t *testing.T, pi *peerIntents, worker string, queued, inFlight int) {
	t.Helper()
	if q, n := pi.load(worker); q != queued || n != inFlight {
		t.Fatalf("worker %s: peers' load %d queued tokens, %d in flight; want %d and %d", worker, q, n, queued, inFlight)
	}
}

// TestPeerIntentsAccounting follows another router's request through its
// states: queued (chain held, tokens queued, in flight), prefilled (held,
// in flight), done (held for what is left of the hold), and expired.
func TestPeerIntentsAccounting(t *testing.T) {
	const (
		Q = kvdirv1.IntentState_INTENT_STATE_QUEUED
		P = kvdirv1.IntentState_INTENT_STATE_PREFILLED
		D = kvdirv1.IntentState_INTENT_STATE_DONE
		W = kvdirv1.IntentState_INTENT_STATE_WITHDRAWN
	)
	pi := newPeerIntents()
	t0 := time.Unix(1000, 0)
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 1, "a", Q, 500, time.Minute, time.Minute, 1, 2, 3)}, t0)
	wantLoad(t, pi, "a", 500, 1)
	if got := pi.matched("a", []uint64{1, 2, 3, 4}); got != 3 {
		t.Fatalf("matched %d of a chain extending the intent's, want 3", got)
	}
	if got := pi.matched("a", []uint64{1, 9, 3}); got != 1 {
		t.Fatalf("matched %d of a chain diverging after block 1, want 1", got)
	}
	if pi.matched("b", []uint64{1, 2, 3}) != 0 {
		t.Fatal("the intent counted on another worker")
	}
	// The first byte: nothing queued, still in flight and held.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 2, "a", P, 500, time.Minute, 5*time.Second, 1, 2, 3)}, t0)
	wantLoad(t, pi, "a", 0, 1)
	// A late copy of the first version changes nothing.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 1, "a", Q, 500, time.Minute, time.Minute, 1, 2, 3)}, t0)
	wantLoad(t, pi, "a", 0, 1)
	// A second intent sharing the first two blocks.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r3", 1, 1, "a", Q, 200, time.Minute, time.Minute, 1, 2, 4)}, t0)
	wantLoad(t, pi, "a", 200, 2)
	// The first request ends: it leaves the load, its chain stays held
	// until its hold ends (sweeps see it go).
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 3, "a", D, 500, 5*time.Second, 5*time.Second, 1, 2, 3)}, t0)
	wantLoad(t, pi, "a", 200, 1)
	pi.sweep(t0.Add(4 * time.Second))
	if got := pi.matched("a", []uint64{1, 2, 3}); got != 3 {
		t.Fatalf("within the hold: matched %d, want 3", got)
	}
	pi.sweep(t0.Add(5 * time.Second))
	if got := pi.matched("a", []uint64{1, 2, 3}); got != 2 {
		t.Fatalf("past r2's hold: matched %d, want the 2 blocks r3's intent holds", got)
	}
	// A withdrawn request counts nothing.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r3", 1, 2, "a", W, 200, 2*time.Second, 0, 1, 2, 4)}, t0)
	wantLoad(t, pi, "a", 0, 0)
	if pi.matched("a", []uint64{1, 2}) != 0 {
		t.Fatal("a withdrawn intent's chain still counts")
	}
	// Past every TTL nothing is left, not even the worker's entry.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r4", 9, 1, "b", Q, 100, time.Second, time.Second, 7)}, t0)
	pi.sweep(t0.Add(time.Minute))
	if ids, _, _ := pi.workers(); len(ids) != 0 || len(pi.byKey) != 0 {
		t.Fatalf("after every TTL: workers %v, %d intents", ids, len(pi.byKey))
	}
	// A new stream starts over.
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r4", 10, 1, "b", Q, 100, time.Minute, time.Minute, 7)}, t0)
	pi.reset()
	wantLoad(t, pi, "b", 0, 0)
}

// TestPeerIntentsCountInPlacement: another router's queued request on a
// worker counts there as this router's own would, in matched blocks and
// in the load the policy sees, and explain shows it.
func TestPeerIntentsCountInPlacement(t *testing.T) {
	s := decisionServer(t, &fakeMatcher{})
	s.cfg.ShareIntents = true
	s.groups[0].share = newSharer(s, s.groups[0])
	req := longChat(t)
	d, aerr := s.decide(t.Context(), req, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if len(d.pickChain) != len(d.chain) || d.pickChain[0] != d.chain[0] {
		t.Fatalf("pick chain %d blocks, chain %d", len(d.pickChain), len(d.chain))
	}
	s.groups[0].share.peers.apply([]*kvdirv1.PlacementIntent{testPeerIntent("other", 1, 1, "b", kvdirv1.IntentState_INTENT_STATE_QUEUED,
		300, time.Minute, time.Minute, d.chain...)}, time.Now())
	d, aerr = s.decide(t.Context(), req, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if d.pick.Worker != "b" || d.cands[1].MatchedBlocks != len(d.chain) {
		t.Fatalf("picked %s with b matched %d; want b holding all %d blocks by the other router's intent", d.pick.Worker, d.cands[1].MatchedBlocks, len(d.chain))
	}
	if l := d.cands[1].Load; l.QueuedPrefillTokens != 300 || l.InFlight != 1 {
		t.Fatalf("b's load %+v, want the other router's 300 queued tokens and 1 request", l)
	}
	e := s.explain(req, d)
	b := e.Workers[1]
	if b.PeerSpeculativeBlocks != len(d.chain) || b.PeerQueuedPrefillTokens != 300 || b.PeerInFlight != 1 || b.SpeculativeBlocks != 0 {
		t.Fatalf("explain of b: %+v", b)
	}
	if a := e.Workers[0]; a.PeerSpeculativeBlocks != 0 || a.PeerQueuedPrefillTokens != 0 || a.QueuedPrefillTokens != 0 {
		t.Fatalf("explain of a: %+v", a)
	}
	// With intents off the same peer state is ignored.
	s.groups[0].share.publish = false
	d, _ = s.decide(t.Context(), req, nil)
	if d.cands[1].MatchedBlocks != 0 || d.cands[1].Load.QueuedPrefillTokens != 0 || d.peerSpec != nil {
		t.Fatalf("intents off: b matched %d, load %+v", d.cands[1].MatchedBlocks, d.cands[1].Load)
	}
}

// TestOwnIntentLifecycle checks what the router sends for its own request:
// queued, then prefilled, then done, each a newer version, a withdrawn one
// holding nothing, and everything again on a new stream.
func TestOwnIntentLifecycle(t *testing.T) {
	s := decisionServer(t, &fakeMatcher{})
	s.cfg.ShareIntents, s.cfg.RouterID = true, "me"
	sh := newSharer(s, s.groups[0])
	d, aerr := s.decide(t.Context(), longChat(t), nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	d.pickChain = d.chain
	wk := d.workers[d.pick.Index]
	h := sh.placed(wk, d, 123, time.Now())
	out, _ := sh.takePending(time.Now(), false)
	if len(out) != 1 || out[0].State != kvdirv1.IntentState_INTENT_STATE_QUEUED || out[0].UncachedTokens != 123 ||
		out[0].WorkerId != wk.id || out[0].RouterId != "me" || len(out[0].Chain) != len(d.chain) || out[0].Ttl.AsDuration() <= 25*time.Second {
		t.Fatalf("placed: sent %v", out)
	}
	v := out[0].Version
	if again, _ := sh.takePending(time.Now(), false); len(again) != 0 {
		t.Fatalf("sent %d intents again with nothing changed", len(again))
	}
	h.prefilled()
	out, _ = sh.takePending(time.Now(), false)
	if len(out) != 1 || out[0].State != kvdirv1.IntentState_INTENT_STATE_PREFILLED || out[0].Version <= v ||
		out[0].Hold.AsDuration() > DefaultSpecTTL || out[0].Hold.AsDuration() < DefaultSpecTTL-time.Second {
		t.Fatalf("prefilled: sent %v", out)
	}
	v = out[0].Version
	h.done()
	out, _ = sh.takePending(time.Now(), false)
	if len(out) != 1 || out[0].State != kvdirv1.IntentState_INTENT_STATE_DONE || out[0].Version <= v || out[0].Hold.AsDuration() <= 0 {
		t.Fatalf("done: sent %v", out)
	}
	h2 := sh.placed(wk, d, 50, time.Now())
	h2.withdraw()
	out, _ = sh.takePending(time.Now(), false)
	if len(out) != 1 || out[0].State != kvdirv1.IntentState_INTENT_STATE_WITHDRAWN || out[0].Hold.AsDuration() != 0 {
		t.Fatalf("withdrawn: sent %v", out)
	}
	if out, _ := sh.takePending(time.Now(), true); len(out) != 2 {
		t.Fatalf("a new stream resent %d intents, want both live ones", len(out))
	}
	// Past their lives both are gone.
	if out, _ := sh.takePending(time.Now().Add(time.Minute), true); len(out) != 0 {
		t.Fatalf("after a minute %d intents are still sent", len(out))
	}
	// Intents off: nothing is placed.
	sh.publish = false
	if sh.placed(wk, d, 1, time.Now()) != nil {
		t.Fatal("placed an intent with intents off")
	}
	var nilHandle *intentHandle
	nilHandle.prefilled() // no-ops
	nilHandle.done()
}

// TestRoutersShareIntents runs two routers on two directory nodes: a
// request waiting on a worker through one router counts on that worker
// for the other (relayed node to node), and leaves when it ends.
func TestRoutersShareIntents(t *testing.T) {
	release := make(chan struct{})
	hold := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		okJSON(0)(w, r)
	}
	a := newUpstream(t, "m", hold)
	b := newUpstream(t, "m", hold)
	workers := []StaticWorker{{ID: "a", Address: a.URL, Model: "m"}, {ID: "b", Address: b.URL, Model: "m"}}
	c := dirtest.New(t, 2, nil)
	c.WaitMembers()
	router := func(i int, id string) (*Server, string) {
		dc, err := dirclient.New(dirclient.Config{Addrs: []string{c.APIAddr(i)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dc.Close() })
		return testRouter(t, "kvdir", workers, func(cfg *Config) {
			cfg.Directory, cfg.ShareIntents, cfg.RouterID, cfg.MatchTimeout = dc, true, id, time.Second
		})
	}
	s1, url1 := router(0, "r1")
	s2, _ := router(1, "r2")
	testkit.Eventually(t, 10*time.Second, "both routers connected", func() (bool, string) {
		return s1.groups[0].share.connected.Load() && s2.groups[0].share.connected.Load(), ""
	})
	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + strings.Repeat("shared prefixes herd. ", 40) + `"}]}`
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url1+PathChat, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	var worker string
	testkit.Eventually(t, 10*time.Second, "router 2 to count router 1's request", func() (bool, string) {
		ids, q, n := s2.groups[0].share.peers.workers()
		if len(ids) == 1 && q[0] > 0 && n[0] == 1 {
			worker = ids[0]
			return true, ""
		}
		return false, fmt.Sprint(ids, q, n)
	})
	// Router 2's explain of the same prompt sees it as a warm, loaded worker.
	breq, aerr := parseRequest([]byte(body), true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	d, aerr := s2.decide(t.Context(), breq, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	e := s2.explain(breq, d)
	for _, w := range e.Workers {
		if w.Worker == worker && (w.PeerSpeculativeBlocks != e.ChainBlocks || w.PeerInFlight != 1 || w.PeerQueuedPrefillTokens == 0) {
			t.Fatalf("router 2's explain of %s: %+v", worker, w)
		}
	}
	close(release)
	<-done
	testkit.Eventually(t, 10*time.Second, "router 2 to see the request end", func() (bool, string) {
		q, n := s2.groups[0].share.peers.load(worker)
		return q == 0 && n == 0, fmt.Sprint(q, n)
	})
	// Each node lists the router it serves.
	for i, id := range []string{"r1", "r2"} {
		st, err := kvdirv1.NewAdminServiceClient(c.Conn(i)).Status(t.Context(), &kvdirv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routers) != 1 || st.Routers[0].RouterId != id {
			t.Fatalf("node %d lists %v, want %s", i, st.Routers, id)
		}
	}
}

// TestPeerIntentsBusy: a peer's queued intent makes its worker busy for
// this router's placement, until its first byte.
func TestPeerIntentsBusy(t *testing.T) {
	const (
		Q = kvdirv1.IntentState_INTENT_STATE_QUEUED
		P = kvdirv1.IntentState_INTENT_STATE_PREFILLED
	)
	pi := newPeerIntents()
	t0 := time.Now()
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 1, "a", Q, 500, time.Minute, time.Minute, 1, 2, 3)}, t0)
	testkit.Eventually(t, 5*time.Second, "worker a counted busy", func() (bool, string) { v := pi.busyOf("a"); return v > 0, fmt.Sprint("busy ", v) })
	if pi.busyOf("b") != 0 {
		t.Fatal("another worker counted busy")
	}
	pending := func() int { pi.mu.RLock(); defer pi.mu.RUnlock(); return pi.busy["a"].m.Pending() }
	if pending() != 1 {
		t.Fatalf("pending %d, want 1", pending())
	}
	pi.apply([]*kvdirv1.PlacementIntent{testPeerIntent("r2", 1, 2, "a", P, 500, time.Minute, time.Minute, 1, 2, 3)}, t0)
	if pending() != 0 {
		t.Fatalf("after the first byte: pending %d, want 0", pending())
	}
}
