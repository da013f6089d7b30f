package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// fullReportKVBlocks is the KV capacity of the engines of the full
// report-mode row: small, so that a few prompts evict everything.
const fullReportKVBlocks = 64

// fullReportEvictions runs after the turns of the full report-mode row
// (engine and agent with --kv-report-mode full). On each engine a prompt
// is sent twice, so its blocks are stored and then re-announced, then
// distinct prompts of more blocks than the cache holds evict them once.
// The directory's block count of every worker must never exceed the
// engine's capacity, and the evicted prompt's blocks must leave the
// directory: an agent counting the re-announcement as a second reference
// would keep them (and exceed the capacity).
func fullReportEvictions(t *testing.T, ctx context.Context, f *fleet.Fleet) {
	t.Helper()
	for i, e := range f.Engines {
		x := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
			{Role: "system", Content: systemPrompt(100 + i)}, {Role: "user", Content: "Which blocks are held?"}}}
		for range 2 {
			if a, err := sendWith(ctx, e.URL, fmt.Sprintf("full-x-%d", i), x, nil); err != nil || a.status != 200 {
				t.Fatalf("prompt x on %s: %v %+v", e.WorkerID, err, a)
			}
		}
		testkit.Eventually(t, 15*time.Second, "the directory to hold prompt x on "+e.WorkerID, func() (bool, string) {
			ex, err := explainWith(ctx, f.Routers[0].URL, fmt.Sprintf("full-x-%d", i), x, nil)
			if err != nil {
				return false, err.Error()
			}
			return ex.Pick == e.WorkerID && ex.PredictedCachedTokens > 0, fmt.Sprintf("pick %s, predicted %d", ex.Pick, ex.PredictedCachedTokens)
		})
		for j := range 6 {
			flood := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
				{Role: "system", Content: strings.Repeat(systemPrompt(200+10*i+j), 3)}, {Role: "user", Content: "Fill the cache."}}}
			a, err := sendWith(ctx, e.URL, fmt.Sprintf("full-flood-%d-%d", i, j), flood, nil)
			if err != nil || a.status != 200 {
				t.Fatalf("flood %d on %s: %v %+v", j, e.WorkerID, err, a)
			}
			directoryWithinCapacity(t, f)
		}
		testkit.Eventually(t, 15*time.Second, "prompt x's evicted blocks to leave the directory", func() (bool, string) {
			directoryWithinCapacity(t, f)
			ex, err := explainWith(ctx, f.Routers[0].URL, fmt.Sprintf("full-x-%d", i), x, nil)
			if err != nil {
				return false, err.Error()
			}
			return ex.PredictedCachedTokens == 0, fmt.Sprintf("%d tokens of x still predicted cached on %s", ex.PredictedCachedTokens, ex.Pick)
		})
	}
}

// directoryWithinCapacity fails the test if the directory holds more
// blocks for a worker than its engine's KV cache has.
func directoryWithinCapacity(t *testing.T, f *fleet.Fleet) {
	t.Helper()
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
	if code != 0 {
		t.Fatalf("kvdirctl workers: %s", errOut)
	}
	var workers ctlview.WorkerList
	if err := json.Unmarshal([]byte(out), &workers); err != nil {
		t.Fatalf("kvdirctl workers: %v", err)
	}
	for _, w := range workers.Workers {
		if w.Blocks > fullReportKVBlocks || w.GPUBlocks > fullReportKVBlocks {
			t.Fatalf("directory holds %d blocks (%d GPU) of %s, whose engine has %d", w.Blocks, w.GPUBlocks, w.ID, fullReportKVBlocks)
		}
	}
}
