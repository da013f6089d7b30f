package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// Hooks of the engineShapes rows for media beyond the GPU (the
// simulator's offload tier) and TensorRT-LLM's remote locality.

// engineOf returns the fleet's engine of worker id.
func engineOf(t *testing.T, f *fleet.Fleet, worker string) *fleet.Engine {
	t.Helper()
	for _, e := range f.Engines {
		if e.WorkerID == worker {
			return e
		}
	}
	t.Fatalf("no engine for worker %q", worker)
	return nil
}

// flushGPU sends the engine of worker, directly, prompts of token ids
// that together need more blocks than its GPU cache of kvBlocks blocks
// (block size 16) holds, so every block cached before is evicted (and, with
// an offload tier, moved there).
func flushGPU(kvBlocks int) func(t *testing.T, ctx context.Context, f *fleet.Fleet, worker string) {
	return func(t *testing.T, ctx context.Context, f *fleet.Fleet, worker string) {
		t.Helper()
		e := engineOf(t, f, worker)
		n := (kvBlocks - 2) * 16 // one prompt nearly fills the cache
		for k := range 3 {
			prompt := make([]int, n)
			for i := range prompt {
				prompt[i] = 50000 + 7919*k + i
			}
			body, _ := json.Marshal(map[string]any{"model": "llama3-8b", "prompt": prompt, "max_tokens": 1})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("flush %s: %v", worker, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("flush %s: status %d", worker, resp.StatusCode)
			}
		}
	}
}

// mediumHeld returns a check that the directory shows blocks on medium
// ("cpu" or "disk") for some worker: the agent credited the tier's
// stores.
func mediumHeld(medium string) func(t *testing.T, ctx context.Context, f *fleet.Fleet) {
	return func(t *testing.T, ctx context.Context, f *fleet.Fleet) {
		t.Helper()
		testkit.Eventually(t, 15*time.Second, "the directory to show "+medium+" blocks", func() (bool, string) {
			workers, err := listWorkers(t, f)
			if err != "" {
				return false, err
			}
			var got []string
			for _, w := range workers {
				held := w.CPUBlocks
				if medium == "disk" {
					held = w.DiskBlocks
				}
				if held > 0 {
					return true, ""
				}
				got = append(got, fmt.Sprintf("%s gpu %d cpu %d disk %d", w.ID, w.GPUBlocks, w.CPUBlocks, w.DiskBlocks))
			}
			return false, strings.Join(got, "; ")
		})
	}
}

func listWorkers(t *testing.T, f *fleet.Fleet) ([]ctlview.Worker, string) {
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
	if code != 0 {
		return nil, errOut
	}
	var workers ctlview.WorkerList
	if err := json.Unmarshal([]byte(out), &workers); err != nil {
		return nil, err.Error()
	}
	return workers.Workers, ""
}

// remoteNotCredited runs a probe session on an engine started with
// --trtllm-remote-every 2 after the rows' sessions, which sent each engine
// an even number of requests: the probe's turn 1 is local, its turn 2
// remote. Turn 2 must land on turn 1's blocks (local ones are credited),
// a barrier request (local) must reach the directory, and then turn 3's
// prediction by router 0, which did not route turn 2, must stop at turn
// 1's blocks although the engine holds and reports turn 2's too: the
// remote stores were not credited.
func remoteNotCredited(t *testing.T, ctx context.Context, f *fleet.Fleet) {
	t.Helper()
	const bs = 16
	r0, r1 := f.Routers[0].URL, f.Routers[1].URL
	c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
		{Role: "system", Content: systemPrompt(50)}, {Role: "user", Content: "Question 50: what does a prefix cache save?"}}}
	a1, err := send(ctx, r0, "remote-probe", c)
	if err != nil || a1.status != 200 {
		t.Fatalf("probe turn 1: %v %+v", err, a1)
	}
	long := strings.Repeat("Explain also how blocks move between tiers of memory and who pays for the transfers. ", 6)
	c.Messages = append(c.Messages, message{Role: "assistant", Content: a1.content}, message{Role: "user", Content: long})
	testkit.Eventually(t, 15*time.Second, "the directory to hold the probe's turn 1", func() (bool, string) {
		e, err := explainWith(ctx, r1, "remote-probe", c, nil)
		if err != nil {
			return false, err.Error()
		}
		return e.Pick == a1.worker && e.PredictedCachedTokens > 0, fmt.Sprintf("pick %s (turn 1 on %s), predicted %d", e.Pick, a1.worker, e.PredictedCachedTokens)
	})
	a2, err := send(ctx, r1, "remote-probe", c)
	if err != nil || a2.status != 200 || a2.worker != a1.worker || a2.cached == 0 {
		t.Fatalf("probe turn 2 (turn 1 on %s): %v %+v", a1.worker, err, a2)
	}
	if a2.prompt/bs-1 <= a1.prompt/bs+1 {
		t.Fatalf("probe turn 2 has %d prompt tokens, turn 1 %d: too few new blocks to tell", a2.prompt, a1.prompt)
	}
	// A local request after turn 2 on the same engine: once the directory
	// holds it, the agent has read (and skipped) turn 2's remote stores.
	barrier := chatRequest{Model: "llama3-8b", MaxTokens: 1, Messages: []message{{Role: "system", Content: systemPrompt(51)}}}
	if b, err := send(ctx, engineOf(t, f, a1.worker).URL, "", barrier); err != nil || b.status != 200 {
		t.Fatalf("barrier: %v %+v", err, b)
	}
	testkit.Eventually(t, 15*time.Second, "the directory to hold the barrier request", func() (bool, string) {
		e, err := explainWith(ctx, r0, "remote-barrier", barrier, nil)
		if err != nil {
			return false, err.Error()
		}
		return e.Pick == a1.worker && e.PredictedCachedTokens > 0, fmt.Sprintf("pick %s, predicted %d", e.Pick, e.PredictedCachedTokens)
	})
	c.Messages = append(c.Messages, message{Role: "assistant", Content: a2.content}, message{Role: "user", Content: "Thanks."})
	// Router 0 did not route turn 2: what it knows of it comes from the
	// directory alone (router 1 remembers what it sent where).
	e, err := explainWith(ctx, r0, "remote-probe", c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Pick != a1.worker || e.PredictedCachedTokens == 0 || e.PredictedCachedTokens > a1.prompt {
		t.Fatalf("turn 3: pick %s predicted %d; want %s and at most turn 1's %d prompt tokens (turn 2's blocks are remote)",
			e.Pick, e.PredictedCachedTokens, a1.worker, a1.prompt)
	}
	a3, err := send(ctx, r0, "remote-probe", c)
	if err != nil || a3.status != 200 || a3.worker != a1.worker {
		t.Fatalf("probe turn 3: %v %+v", err, a3)
	}
	if a3.cached < (a2.prompt/bs-1)*bs {
		t.Fatalf("turn 3: engine reported %d cached tokens, want turn 2's blocks (%d prompt tokens)", a3.cached, a2.prompt)
	}
}
