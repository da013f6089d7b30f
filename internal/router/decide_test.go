package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// fakeMatcher stands in for the directory in unit tests of the decision.
type fakeMatcher struct {
	calls  atomic.Int64
	err    error
	blocks map[string]uint32
	// media, if set for a worker, are its leading runs on the GPU, CPU,
	// disk and remote media and on GPU or CPU (capped at the chain like
	// blocks).
	media map[string][5]uint32
}

func (f *fakeMatcher) MatchChain(ctx context.Context, hashes []uint64, bs uint32, _ bool) (*kvdirv1.MatchResponse, error) {
	f.calls.Add(1)
	if f.err != nil {
		return nil, f.err
	}
	resp := &kvdirv1.MatchResponse{ChainBlocks: uint32(len(hashes))}
	n := uint32(len(hashes))
	for id, b := range f.blocks {
		wm := &kvdirv1.WorkerMatch{WorkerId: id, Blocks: min(b, n)}
		if m, ok := f.media[id]; ok {
			wm.GpuBlocks, wm.CpuBlocks, wm.DiskBlocks, wm.RemoteBlocks = min(m[0], n), min(m[1], n), min(m[2], n), min(m[3], n)
			wm.GpuOrCpuBlocks = min(m[4], n)
		}
		resp.Matches = append(resp.Matches, wm)
	}
	return resp, nil
}

func decisionServer(t *testing.T, m *fakeMatcher) *Server {
	t.Helper()
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Static: []StaticWorker{{ID: "x", Address: "http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.groups[0].matcher = m
	s.pool.replace([]workerSpec{{ID: "a", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16}, {ID: "b", Address: "http://127.0.0.1:2", Model: "m", BlockSize: 16}})
	return s
}

func longChat(t *testing.T) *request {
	t.Helper()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("prefix caches save prefill time. ", 30) + `"}]}`
	req, aerr := parseRequest([]byte(body), true)
	if aerr != nil {
		t.Fatal(aerr)
	}
	return req
}

// TestDecisionUsesDirectory checks that the directory's matches reach the
// policy: the worker holding the prefix is picked, with its cached tokens.
func TestDecisionUsesDirectory(t *testing.T) {
	m := &fakeMatcher{blocks: map[string]uint32{"b": 1000}}
	s := decisionServer(t, m)
	d, aerr := s.decide(t.Context(), longChat(t), nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if d.fallback != "" || d.pick.Worker != "b" || d.pick.PredictedCachedTokens != len(d.chain)*16 || d.dir[1] != len(d.chain) {
		t.Fatalf("decision %v, dir %v", d, d.dir)
	}
}

// TestDecisionBuffersDoNotLeak checks that the buffers decisions reuse
// (decideScratch, candBufs) carry nothing from one decision into the next:
// decisions over both workers, then one of them, then both, then the
// other, in a row on one router, each equal a fresh router's; decide
// keeps no breakdown, decideExplained one score per candidate. Each
// decision is compacted as placing it does, so the next reuses its
// buffers, and keeps its pick's entries through the later decisions.
func TestDecisionBuffersDoNotLeak(t *testing.T) {
	m := &fakeMatcher{blocks: map[string]uint32{"b": 1000}}
	s := decisionServer(t, m)
	type kept struct {
		d      *decision
		worker string
		ns     blockhash.Namespace
		cand   placement.Candidate
		entry  [3]int // dir, spec, bs
	}
	var placed []kept
	for i, exclude := range [][]string{nil, {"b"}, nil, {"a"}, nil} {
		got, aerr := s.decide(t.Context(), longChat(t), exclude)
		if aerr != nil {
			t.Fatal(aerr)
		}
		want, aerr := decisionServer(t, m).decide(t.Context(), longChat(t), exclude)
		if aerr != nil {
			t.Fatal(aerr)
		}
		ids := func(d *decision) (out []string) {
			for _, w := range d.workers {
				out = append(out, w.id)
			}
			return out
		}
		nss := func(d *decision) (out []blockhash.Namespace) {
			for i := range d.workers {
				out = append(out, d.ns.at(i))
			}
			return out
		}
		if !slices.Equal(ids(got), ids(want)) || !slices.Equal(got.cands, want.cands) || !slices.Equal(nss(got), nss(want)) ||
			!slices.Equal(got.dir, want.dir) || !slices.Equal(got.spec, want.spec) || !slices.Equal(got.bs, want.bs) ||
			got.pick.Worker != want.pick.Worker || got.pick.Index != want.pick.Index ||
			got.pick.PredictedCachedTokens != want.pick.PredictedCachedTokens || got.pick.Scores != nil {
			t.Fatalf("decision %d (excluding %v): %v over %v, cands %+v, dir %v, scores %d; fresh: %v over %v, cands %+v, dir %v",
				i, exclude, got, ids(got), got.cands, got.dir, len(got.pick.Scores), want, ids(want), want.cands, want.dir)
		}
		p := got.pick.Index
		placed = append(placed, kept{got, got.workers[p].id, got.ns.at(p), got.cands[p], [3]int{got.dir[p], got.spec[p], got.bs[p]}})
		got.compact(s)
		e, aerr := s.decideExplained(t.Context(), longChat(t))
		if aerr != nil {
			t.Fatal(aerr)
		}
		if len(e.pick.Scores) != len(e.cands) || e.pick.Scores[e.pick.Index].Worker != e.pick.Worker {
			t.Fatalf("explained decision %d: %d scores over %d candidates", i, len(e.pick.Scores), len(e.cands))
		}
	}
	for i, k := range placed {
		d, p := k.d, k.d.pick.Index
		if p != 0 || len(d.workers) != 1 || d.workers[p].id != k.worker || d.pick.Worker != k.worker || d.ns.at(p) != k.ns ||
			d.cands[p] != k.cand || [3]int{d.dir[p], d.spec[p], d.bs[p]} != k.entry || d.bufs != nil {
			t.Errorf("compacted decision %d: pick %d of %d (%s), cand %+v, entries %d %d %d; want %s, %+v, %v",
				i, p, len(d.workers), d.pick.Worker, d.cands[p], d.dir[p], d.spec[p], d.bs[p], k.worker, k.cand, k.entry)
		}
	}
}

// TestDecisionFillsTiers checks that the directory's per-medium runs reach
// the policy as the candidates' tier split, and the explain view shows
// them with the load's time: a holds the prefix's first two blocks on the
// GPU only and the rest in host memory (its CPU run is 0, its GPU-or-CPU
// run the whole prefix), b the first three on the GPU and the rest on
// disk.
func TestDecisionFillsTiers(t *testing.T) {
	m := &fakeMatcher{blocks: map[string]uint32{"a": 1000, "b": 1000},
		media: map[string][5]uint32{"a": {2, 0, 0, 0, 1000}, "b": {3, 0, 1000, 0, 3}}}
	s := decisionServer(t, m)
	req := longChat(t)
	d, aerr := s.decideExplained(t.Context(), req) // explain reads the scores
	if aerr != nil {
		t.Fatal(aerr)
	}
	n := len(d.chain)
	if n < 8 {
		t.Fatalf("chain of %d blocks, want a longer prompt", n)
	}
	a, b := d.cands[0], d.cands[1]
	if a.MatchedBlocks != n || a.HostBlocks != n-2 || a.DiskBlocks != 0 {
		t.Fatalf("a: %+v, want %d matched, %d in host memory", a, n, n-2)
	}
	if b.MatchedBlocks != n || b.HostBlocks != 0 || b.DiskBlocks != n-3 {
		t.Fatalf("b: %+v, want %d matched, %d on disk", b, n, n-3)
	}
	e := s.explain(req, d)
	wa, wb := e.Workers[0], e.Workers[1]
	if wa.HostBlocks != n-2 || wa.TransferMs <= 0 || wa.LoadedTokens != float64((n-2)*16) || wb.DiskBlocks != n-3 {
		t.Fatalf("explain: a %+v, b %+v", wa, wb)
	}
	// Host memory loads faster than disk: a wins, though b holds one
	// more block on the GPU.
	if d.pick.Worker != "a" || wb.TransferMs <= wa.TransferMs {
		t.Fatalf("picked %s; transfer a %.3f ms, b %.3f ms", d.pick.Worker, wa.TransferMs, wb.TransferMs)
	}
	// An answer without per-medium runs counts as held on the GPU.
	m.media = nil
	if d, _ = s.decide(t.Context(), req, nil); d.cands[0].HostBlocks != 0 || d.cands[0].DiskBlocks != 0 || d.cands[0].MatchedBlocks != n {
		t.Fatalf("without media: %+v", d.cands[0])
	}
}

// TestDirectoryBreaker checks that consecutive failed look-ups stop the
// router from asking for a pause, then one request asks again.
func TestDirectoryBreaker(t *testing.T) {
	m := &fakeMatcher{err: errors.New("unavailable")}
	s := decisionServer(t, m)
	s.breakerPause = 200 * time.Millisecond
	req := longChat(t)
	for i := range breakerFailures {
		d, aerr := s.decide(t.Context(), req, nil)
		if aerr != nil || d.fallback != FallbackError || d.policy != "session-hash" {
			t.Fatalf("look-up %d: %v %v", i, d, aerr)
		}
	}
	for range 5 {
		if d, _ := s.decide(t.Context(), req, nil); d.fallback != FallbackDown {
			t.Fatalf("during the pause: fallback %q", d.fallback)
		}
	}
	if got := m.calls.Load(); got != breakerFailures {
		t.Fatalf("%d look-ups, want %d (none during the pause)", got, breakerFailures)
	}
	m.err = nil
	m.blocks = map[string]uint32{"a": 5}
	testkit.Eventually(t, 5*time.Second, "the directory asked again after the pause", func() (bool, string) {
		d, _ := s.decide(t.Context(), req, nil)
		return d.fallback == "" && d.dir[0] == 5, ""
	})
}

// TestMatchTimeout checks that a directory slower than the deadline makes
// a fallback, not a slow request.
func TestMatchTimeout(t *testing.T) {
	s := decisionServer(t, &fakeMatcher{})
	s.groups[0].matcher = slowMatcher{}
	s.cfg.MatchTimeout = 2 * time.Millisecond
	start := time.Now()
	d, aerr := s.decide(t.Context(), longChat(t), nil)
	if aerr != nil || d.fallback != FallbackTimeout {
		t.Fatalf("decision %v %v", d, aerr)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("decision took %v with a 2 ms deadline", el)
	}
}

type slowMatcher struct{}

func (slowMatcher) MatchChain(ctx context.Context, _ []uint64, _ uint32, _ bool) (*kvdirv1.MatchResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRemoteRenderer checks that rendering through an engine's /tokenize
// gives the same ids as the built-in template.
func TestRemoteRenderer(t *testing.T) {
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tr openai.TokenizeRequest
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil || tr.Model != "m" {
			http.Error(w, "bad request", 400)
			return
		}
		var ids []uint32
		if tr.Messages != nil {
			ids, err = tmpl.RenderChat(tr.Messages, tr.AddGenerationPrompt == nil || *tr.AddGenerationPrompt)
		} else {
			ids = tmpl.RenderCompletion(*tr.Prompt)
		}
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		_ = json.NewEncoder(w).Encode(openai.TokenizeResponse{Count: len(ids), Tokens: ids})
	}))
	defer srv.Close()
	remote := NewRemoteRenderer(srv.URL+"/tokenize", "m", 5*time.Second)
	local := mustRenderer(t)
	msgs := []tokenize.Message{{Role: "system", Content: tokenize.TextContent("be brief")}, {Role: "user", Content: tokenize.TextContent("héllo wörld 123")}}
	got, err := remote.RenderChat(t.Context(), "", msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := local.RenderChat(t.Context(), "", msgs, true)
	if !equalIDs(got, want) {
		t.Fatalf("remote chat rendering %v, local %v", got, want)
	}
	got, err = remote.RenderCompletion(t.Context(), openai.Prompt{Set: true, Text: "once upon a time"})
	want, _ = local.RenderCompletion(t.Context(), openai.Prompt{Set: true, Text: "once upon a time"})
	if err != nil || !equalIDs(got, want) {
		t.Fatalf("remote completion rendering %v (%v), local %v", got, err, want)
	}
	bad := NewRemoteRenderer(srv.URL+"/tokenize", "other-model", time.Second)
	if _, err := bad.RenderChat(t.Context(), "", msgs, true); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("an engine's refusal was not reported: %v", err)
	}
}

// TestSpeculativeEntriesPastTheDirectory checks the speculative entries
// against the directory's match: entries that go past the directory's
// blocks (its events lag a turn this router placed) extend the match, and
// entries within them leave it the directory's while explain still counts
// them.
func TestSpeculativeEntriesPastTheDirectory(t *testing.T) {
	m := &fakeMatcher{blocks: map[string]uint32{}}
	s := decisionServer(t, m)
	req := longChat(t)
	d, aerr := s.decide(t.Context(), req, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	chain := d.chain
	if len(chain) < 8 {
		t.Fatalf("a chain of %d blocks is too short for the test", len(chain))
	}
	a := s.pool.snapshot()["a"]
	for _, c := range []struct {
		name               string
		dir, spec          int
		wantMatched        int
		wantExplainedSpecs int
	}{
		{"speculative past the directory", 3, len(chain), len(chain), len(chain)},
		{"speculative within the directory", len(chain) - 2, 4, len(chain) - 2, 4},
		{"no directory blocks", 0, 5, 5, 5},
		{"directory holds everything", len(chain), len(chain), len(chain), len(chain)},
	} {
		m.blocks["a"] = uint32(c.dir)
		a.spec = newSpecSet(time.Hour)
		a.spec.add(chain[:c.spec], time.Now())
		d, aerr := s.decide(t.Context(), req, nil)
		if aerr != nil {
			t.Fatal(aerr)
		}
		e := s.explain(req, d)
		if d.cands[0].MatchedBlocks != c.wantMatched || e.Workers[0].SpeculativeBlocks != c.wantExplainedSpecs || e.Workers[0].DirectoryBlocks != c.dir {
			t.Errorf("%s: matched %d (want %d), explained speculative %d (want %d), directory %d (want %d)", c.name,
				d.cands[0].MatchedBlocks, c.wantMatched, e.Workers[0].SpeculativeBlocks, c.wantExplainedSpecs, e.Workers[0].DirectoryBlocks, c.dir)
		}
	}
}

// TestNamespaceSet checks that a decision's namespaces, each kept once,
// give every candidate its own, in the list and past it in the map.
func TestNamespaceSet(t *testing.T) {
	for _, distinct := range []int{1, nsListMax, nsListMax + 1, 3 * nsListMax} {
		const n = 100
		set := nsSet{of: make([]int32, n)}
		want := make([]blockhash.Namespace, n)
		for i := range n {
			// Runs of equal namespaces, and some seen before.
			want[i] = blockhash.Namespace{Model: "m", LoRA: fmt.Sprintf("a%d", (i/3)%distinct), BlockSize: 16}
			set.set(i, want[i])
		}
		for i := range n {
			if got := set.at(i); got != want[i] {
				t.Fatalf("%d distinct: candidate %d got %+v, want %+v", distinct, i, got, want[i])
			}
		}
		if len(set.list) != min(distinct, (n+2)/3) {
			t.Fatalf("%d distinct: %d kept", distinct, len(set.list))
		}
	}
}

// TestDirAnswer checks a directory answer's look-up by worker, in its list
// and past it in its map: the last match reported for a worker counts,
// and a worker not reported has none.
func TestDirAnswer(t *testing.T) {
	for _, n := range []int{1, dirListMax, dirListMax + 1, 3 * dirListMax} {
		var a dirAnswer
		for i := range n {
			a.put(fmt.Sprintf("w%d", i), dirMatch{blocks: i})
		}
		a.put("w0", dirMatch{blocks: 100, gpu: 1}) // reported again
		for i := range n {
			want := dirMatch{blocks: i}
			if i == 0 {
				want = dirMatch{blocks: 100, gpu: 1}
			}
			if got := a.get(fmt.Sprintf("w%d", i)); got != want {
				t.Fatalf("%d workers: w%d got %+v, want %+v", n, i, got, want)
			}
		}
		if got := a.get("other"); got != (dirMatch{}) {
			t.Fatalf("%d workers: an unreported worker got %+v", n, got)
		}
	}
}
