package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// TestLoRAAdapters runs a fleet where two of three engines serve a LoRA
// adapter (--lora-modules) and checks, end to end: the routers learn the
// adapter from the engines' /v1/models; turn 2 of an adapter session lands
// where turn 1's blocks are and the engine reports them cached; adapter
// requests never go to the engine without the adapter; and the same
// prompt under the base model is not predicted cached from the adapter's
// blocks (the namespaces differ), as the routers' explain shows.
func TestLoRAAdapters(t *testing.T) {
	const base, adapter = "llama3-8b", "sql-lora"
	lora := []string{"--lora-modules", adapter + "=/adapters/" + adapter}
	f := fleet.New(t, fleet.Config{Engines: 3, Routers: 2, Model: base,
		EngineArgs:    []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		PerEngineArgs: [][]string{lora, lora},
		RouterArgs:    []string{"--policy", "kvdir", "--match-timeout", "200ms", "--models-interval", "200ms", "--share-intents=false"}})
	ctx := context.Background()
	with := []string{f.Engines[0].WorkerID, f.Engines[1].WorkerID}
	without := f.Engines[2].WorkerID

	for _, r := range f.Routers {
		testkit.Eventually(t, 15*time.Second, r.Proc.Name+" to list the adapter", func() (bool, string) {
			list, err := routerModelList(ctx, r.URL)
			if err != nil {
				return false, err.Error()
			}
			for _, m := range list {
				if m.ID == adapter {
					return m.Parent != nil && *m.Parent == base, fmt.Sprintf("%+v", m)
				}
			}
			return false, fmt.Sprintf("models %+v", list)
		})
	}

	for i := range 2 {
		sess := fmt.Sprintf("lora-%d", i)
		a1, a2 := turnTwoFollowsTurnOne(t, ctx, f.Routers[0].URL, f.Routers[1].URL, sess, 100+i, turnCheck{Model: adapter})
		if !slices.Contains(with, a1.worker) || !slices.Contains(with, a2.worker) {
			t.Fatalf("%s: adapter turns on %s and %s; only %v serve %s", sess, a1.worker, a2.worker, with, adapter)
		}

		// Turn 1's prompt is in the directory under the adapter's
		// namespace; under the base model it is nowhere.
		turn1 := chatRequest{Model: adapter, MaxTokens: 4, Messages: []message{
			{Role: "system", Content: systemPrompt(100 + i)}, {Role: "user", Content: fmt.Sprintf("Question %d: what does a prefix cache save?", 100+i)}}}
		e, err := explainWith(ctx, f.Routers[1].URL, "probe-"+sess, turn1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if e.LoRA != adapter || e.PredictedCachedTokens == 0 || len(e.Workers) != len(with) {
			t.Fatalf("%s: adapter explain: lora %q, predicted %d, candidates %+v", sess, e.LoRA, e.PredictedCachedTokens, e.Workers)
		}
		turn1.Model = base
		for _, r := range f.Routers {
			e, err := explainWith(ctx, r.URL, "probe-"+sess, turn1, nil)
			if err != nil {
				t.Fatal(err)
			}
			if e.LoRA != "" || e.PredictedCachedTokens != 0 || len(e.Workers) != len(f.Engines) {
				t.Fatalf("%s via %s: base-model explain: lora %q, predicted %d, %d candidates", sess, r.Proc.Name, e.LoRA, e.PredictedCachedTokens, len(e.Workers))
			}
			for _, w := range e.Workers {
				if w.DirectoryBlocks != 0 || w.SpeculativeBlocks != 0 {
					t.Fatalf("%s via %s: the base model matched the adapter's blocks on %s: %+v", sess, r.Proc.Name, w.Worker, w)
				}
			}
		}
	}

	// New adapter sessions, through both routers: never on the engine
	// without the adapter. Base-model requests may go to any engine.
	for i := range 6 {
		c := chatRequest{Model: adapter, MaxTokens: 4, Messages: []message{
			{Role: "system", Content: systemPrompt(200 + i)}, {Role: "user", Content: "Which tables hold the orders?"}}}
		a, err := send(ctx, f.Routers[i%2].URL, fmt.Sprintf("lora-new-%d", i), c)
		if err != nil || a.status != 200 {
			t.Fatalf("adapter request %d: %v %+v", i, err, a)
		}
		if a.worker == without || !slices.Contains(with, a.worker) {
			t.Fatalf("adapter request %d went to %s; only %v serve %s", i, a.worker, with, adapter)
		}
	}

	resp, err := http.Post(f.Routers[0].URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"no-such-lora","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), adapter) || !strings.Contains(string(body), base) {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
}

// modelEntry is a card of a router's GET /v1/models.
type modelEntry struct {
	ID     string  `json:"id"`
	Parent *string `json:"parent"`
	Root   string  `json:"root"`
}

func routerModelList(ctx context.Context, url string) ([]modelEntry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Data []modelEntry `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	return list.Data, nil
}
