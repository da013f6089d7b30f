package router

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// vllmModels is a GET /v1/models answer in the shape of vLLM's
// show_available_models (vllm/entrypoints/openai/serving_models.py): the
// base model's card (parent null), then one card per --lora-modules
// adapter with id the adapter name, parent the base model's served name
// and root the adapter's path.
const vllmModels = `{"object":"list","data":[
 {"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1760000000,"owned_by":"vllm",
  "root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192,
  "permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]},
 {"id":"sql-lora","object":"model","created":1760000000,"owned_by":"vllm",
  "root":"/adapters/sql-lora","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null,"permission":[]},
 {"id":"chat-lora","object":"model","created":1760000000,"owned_by":"vllm",
  "root":"/adapters/chat-lora","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null,"permission":[]}]}`

// TestParseModelList checks that base models and adapters are told apart
// by parent, and that lists the router cannot trust are refused.
func TestParseModelList(t *testing.T) {
	m, err := parseModelList(strings.NewReader(vllmModels))
	if err != nil {
		t.Fatal(err)
	}
	base := "meta-llama/Llama-3.1-8B-Instruct"
	if strings.Join(m.bases, ",") != base {
		t.Fatalf("bases %v", m.bases)
	}
	if got := strings.Join(m.adapterNames(), ","); got != "chat-lora,sql-lora" {
		t.Fatalf("adapters %v", got)
	}
	if a, ok := m.adapter("sql-lora"); !ok || a.parent != base || a.root != "/adapters/sql-lora" {
		t.Fatalf("sql-lora: %+v %v", a, ok)
	}
	if _, ok := m.adapter(base); ok {
		t.Fatal("the base model is listed as an adapter")
	}
	// SGLang-style cards without a parent field are base models.
	m, err = parseModelList(strings.NewReader(`{"object":"list","data":[{"id":"qwen","object":"model"}]}`))
	if err != nil || strings.Join(m.bases, ",") != "qwen" || len(m.adapters) != 0 {
		t.Fatalf("%+v %v", m, err)
	}
	for name, body := range map[string]string{
		"not JSON":        `<html>`,
		"no data":         `{"object":"list"}`,
		"card without id": `{"data":[{"id":"","parent":null}]}`,
		"two parents":     `{"data":[{"id":"a","parent":"m1"},{"id":"a","parent":"m2"}]}`,
		"data not array":  `{"data":{"id":"a"}}`,
	} {
		if m, err := parseModelList(strings.NewReader(body)); err == nil {
			t.Errorf("%s: accepted as %+v", name, m)
		}
	}
}

// TestLoRARoutedOnlyToWorkersListingIt checks that adapter requests go
// only to workers whose engine lists the adapter, base-model requests to
// any worker, that /v1/models shows the adapter with its parent, and that
// an unknown model is a 404 naming what is served.
func TestLoRARoutedOnlyToWorkersListingIt(t *testing.T) {
	a, b, c := newUpstream(t, "m", okJSON(0)), newUpstream(t, "m", okJSON(0)), newUpstream(t, "m", okJSON(0))
	a.adapters.Store(&[]string{"sql"})
	c.adapters.Store(&[]string{"sql"})
	_, url := testRouter(t, "round-robin", []StaticWorker{{ID: "a", Address: a.URL, Model: "m"}, {ID: "b", Address: b.URL, Model: "m"},
		{ID: "c", Address: c.URL, Model: "m"}}, func(c *Config) { c.ModelsInterval = 20 * time.Millisecond })
	testkit.Eventually(t, 5*time.Second, "the router to list the adapter", func() (bool, string) {
		list := routerModels(t, url)
		return len(list.Data) == 2, fmt.Sprintf("%+v", list.Data)
	})
	list := routerModels(t, url)
	if m := list.Data[0]; m.ID != "m" || m.Parent != nil {
		t.Fatalf("base card %+v", m)
	}
	if m := list.Data[1]; m.ID != "sql" || m.Parent == nil || *m.Parent != "m" || m.Root != "/adapters/sql" {
		t.Fatalf("adapter card %+v", m)
	}

	workers := map[string]int{}
	for i := range 12 {
		resp, body := post(t, url+PathChat, chatFor("sql"), "X-Session-Id", fmt.Sprint("s", i))
		if resp.StatusCode != 200 {
			t.Fatalf("adapter request: %d %s", resp.StatusCode, body)
		}
		workers[resp.Header.Get(HeaderWorker)]++
	}
	if workers["b"] != 0 || b.hits.Load() != 0 || workers["a"] == 0 || workers["c"] == 0 {
		t.Fatalf("adapter requests by worker %v (b, without the adapter, saw %d)", workers, b.hits.Load())
	}
	clear(workers)
	for i := range 12 {
		resp, body := post(t, url+PathChat, chatFor("m"), "X-Session-Id", fmt.Sprint("s", i))
		if resp.StatusCode != 200 {
			t.Fatalf("base request: %d %s", resp.StatusCode, body)
		}
		workers[resp.Header.Get(HeaderWorker)]++
	}
	if workers["b"] == 0 {
		t.Fatalf("base-model requests by worker %v: b serves the base model", workers)
	}

	resp, body := post(t, url+PathChat, chatFor("nope"))
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "The model `nope` does not exist") || !strings.Contains(body, "m, sql") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
}

// hashMatcher is a directory stand-in that holds chains: a look-up finds
// the workers holding the chain whose first hash it asks for.
type hashMatcher struct {
	mu    sync.Mutex
	held  map[uint64]map[string]uint32 // first hash -> worker -> blocks
	asked []uint64                     // first hash of each look-up
}

func (h *hashMatcher) MatchChain(_ context.Context, hashes []uint64, _ uint32, _ bool) (*kvdirv1.MatchResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	resp := &kvdirv1.MatchResponse{ChainBlocks: uint32(len(hashes))}
	if len(hashes) == 0 {
		return resp, nil
	}
	h.asked = append(h.asked, hashes[0])
	for id, n := range h.held[hashes[0]] {
		resp.Matches = append(resp.Matches, &kvdirv1.WorkerMatch{WorkerId: id, Blocks: min(n, uint32(len(hashes)))})
	}
	return resp, nil
}

// TestLoRANamespace checks that an adapter request is hashed in the
// namespace the agent indexes the adapter's blocks in (the worker's
// registered model, the adapter as LoRA), so it matches them, and that the
// same prompt under the base model does not.
func TestLoRANamespace(t *testing.T) {
	var logs syncBuffer
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Static: []StaticWorker{{ID: "x", Address: "http://127.0.0.1:1"}},
		ModelsInterval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hm := &hashMatcher{held: map[uint64]map[string]uint32{}}
	s.groups[0].matcher = hm
	s.pool.replace([]workerSpec{{ID: "a", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16}, {ID: "b", Address: "http://127.0.0.1:2", Model: "m", BlockSize: 16}})
	served := &servedModels{bases: []string{"m"}, adapters: map[string]adapterCard{"sql": {parent: "m", root: "/a/sql"}}}
	s.pool.snapshot()["a"].served.Store(served)
	s.pool.snapshot()["b"].served.Store(served)

	adapterReq := longChat(t)
	adapterReq.model = "sql"
	ids, err := s.renderer.RenderChat(t.Context(), "", adapterReq.messages, adapterReq.addGen)
	if err != nil {
		t.Fatal(err)
	}
	chainIn := func(ns blockhash.Namespace) []uint64 {
		h, err := blockhash.New(ns)
		if err != nil {
			t.Fatal(err)
		}
		return h.Chain(nil, ids, nil)
	}
	agentChain := chainIn(blockhash.Namespace{Model: "m", LoRA: "sql", BlockSize: 16})
	baseChain := chainIn(blockhash.Namespace{Model: "m", BlockSize: 16})
	if agentChain[0] == baseChain[0] {
		t.Fatal("adapter and base chains coincide")
	}
	hm.held[agentChain[0]] = map[string]uint32{"b": uint32(len(agentChain))}

	d, aerr := s.decide(t.Context(), adapterReq, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	if d.chain[0] != agentChain[0] || d.pick.Worker != "b" || d.dir[1] != len(agentChain) || d.pick.PredictedCachedTokens == 0 {
		t.Fatalf("adapter request: %v, dir %v", d, d.dir)
	}
	if e := s.explain(adapterReq, d); e.LoRA != "sql" || e.Model != "sql" {
		t.Fatalf("explain: model %q lora %q", e.Model, e.LoRA)
	}

	d, aerr = s.decide(t.Context(), longChat(t), nil) // the same prompt, model m
	if aerr != nil {
		t.Fatal(aerr)
	}
	if d.chain[0] != baseChain[0] || d.dir[0] != 0 || d.dir[1] != 0 || d.pick.PredictedCachedTokens != 0 {
		t.Fatalf("base request matched the adapter's blocks: %v, dir %v", d, d.dir)
	}

	// An engine naming its base model differently from the registered
	// model: still hashed under the registered model (what the agent
	// indexes), and the mismatch is logged.
	p := &modelPoller{log: s.log}
	w := s.pool.snapshot()["a"]
	p.logChange(w, &servedModels{bases: []string{"other"}, adapters: map[string]adapterCard{"sql": {parent: "other"}}})
	w.served.Store(&servedModels{bases: []string{"other"}, adapters: map[string]adapterCard{"sql": {parent: "other"}}})
	if out := logs.String(); !strings.Contains(out, "adapter=sql parent=other registered=m") || !strings.Contains(out, "--model") {
		t.Fatalf("no mismatch log line:\n%s", out)
	}
	d, aerr = s.decide(t.Context(), adapterReq, nil)
	if aerr != nil || d.ns.at(0) != (blockhash.Namespace{Model: "m", LoRA: "sql", BlockSize: 16}) {
		t.Fatalf("namespace with a mismatched parent: %+v %v", d.ns.list, aerr)
	}
}

// TestModelListFailureKeepsTheLastList checks that a failed read of
// /v1/models is counted and keeps the adapters already known.
func TestModelListFailureKeepsTheLastList(t *testing.T) {
	var fail atomic.Bool
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if fail.Load() {
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(vllmModels))
	}))
	defer eng.Close()
	var failures []string
	p := &modelPoller{client: eng.Client(), interval: time.Second, timeout: time.Second, log: slog.New(slog.DiscardHandler),
		onFailure: func(_ *worker, reason string) { failures = append(failures, reason) }}
	w := &worker{id: "w", address: eng.URL, stop: make(chan struct{})}
	p.once(t.Context(), w)
	if _, ok := w.servesModel("sql-lora"); !ok || w.model() != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Fatalf("after a good read: serves sql-lora %v, model %q", ok, w.model())
	}
	fail.Store(true)
	p.once(t.Context(), w)
	p.once(t.Context(), w)
	if lora, ok := w.servesModel("sql-lora"); !ok || lora != "sql-lora" {
		t.Fatal("a failed read dropped the known adapters")
	}
	if strings.Join(failures, ",") != "status,status" || w.modelsKO.Load() != 2 {
		t.Fatalf("failures %v, consecutive %d", failures, w.modelsKO.Load())
	}
	eng.Close()
	p.once(t.Context(), w)
	if len(failures) != 3 || failures[2] != "unreachable" {
		t.Fatalf("failures %v", failures)
	}
}

func routerModels(t *testing.T, url string) openai.ModelList {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list openai.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return list
}
