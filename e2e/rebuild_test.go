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

// rebuildPrompts is how many distinct prompts warm an engine before its
// worker is expired.
const rebuildPrompts = 8

// ctlWorker returns one worker as kvdirctl workers -o json shows it.
func ctlWorker(t *testing.T, f *fleet.Fleet, id string) (ctlview.Worker, bool) {
	t.Helper()
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
	if code != 0 {
		t.Fatalf("kvdirctl workers: exit %d: %s", code, errOut)
	}
	var list ctlview.WorkerList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("kvdirctl workers: %v", err)
	}
	for _, w := range list.Workers {
		if w.ID == id {
			return w, true
		}
	}
	return ctlview.Worker{}, false
}

// warmEngine sends distinct prompts straight to e and waits until the
// directory's block count of its worker stops changing; it returns that
// count, the engine's cache as the directory knows it, and the prompts.
func warmEngine(t *testing.T, ctx context.Context, f *fleet.Fleet, e *fleet.Engine) (ctlview.Worker, []chatRequest) {
	t.Helper()
	var chats []chatRequest
	for i := range rebuildPrompts {
		c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
			{Role: "system", Content: systemPrompt(300 + i)}, {Role: "user", Content: "Warm the cache."}}}
		if a, err := sendWith(ctx, e.URL, fmt.Sprintf("rebuild-%d", i), c, nil); err != nil || a.status != 200 {
			t.Fatalf("prompt %d on %s: %v %+v", i, e.WorkerID, err, a)
		}
		chats = append(chats, c)
	}
	var last ctlview.Worker
	var stable int
	testkit.Eventually(t, 15*time.Second, "the directory's view of "+e.WorkerID+" to settle", func() (bool, string) {
		w, ok := ctlWorker(t, f, e.WorkerID)
		if ok && w.Blocks > 0 && w.Blocks == last.Blocks && w.AppliedSeq == last.AppliedSeq {
			stable++
		} else {
			stable = 0
		}
		last = w
		return stable >= 3, fmt.Sprintf("%d blocks, seq %d", w.Blocks, w.AppliedSeq)
	})
	return last, chats
}

// viewMismatches compares, for each of chats, the directory's view of e's
// worker with the engine's own cache and returns every disagreement. The
// directory's side is kvdirctl match read through the leader: it renders
// the chat with the engine's template and tokenizer, hashes it in the
// worker's registered namespace and reports the tokens the engine would
// serve from cache (its matched blocks, short of the prompt's last token).
// The engine's side is the same chat asked again with one output token,
// whose usage.prompt_tokens_details.cached_tokens is what the engine
// holds of the prompt; with one output token the ask stores no block the
// prompt did not have. Every prompt must still be cached on the engine,
// so that an agreement on nothing cannot pass.
func viewMismatches(t *testing.T, ctx context.Context, f *fleet.Fleet, e *fleet.Engine, chats []chatRequest) []string {
	t.Helper()
	var bad []string
	for i, c := range chats {
		out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "match", "--consistent", "--messages", writeJSON(t, c), "-o", "json")
		if code != 0 {
			t.Fatalf("kvdirctl match of prompt %d: exit %d: %s", i, code, errOut)
		}
		var m ctlview.Match
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("kvdirctl match of prompt %d: %v\n%s", i, err, out)
		}
		var row ctlview.MatchRow
		for _, r := range m.Workers {
			if r.Worker == e.WorkerID {
				row = r
			}
		}
		ask := c
		ask.MaxTokens = 1
		a, err := sendWith(ctx, e.URL, "", ask, nil)
		if err != nil || a.status != 200 {
			t.Fatalf("asking %s for prompt %d: %v %+v", e.WorkerID, i, err, a)
		}
		if a.prompt != m.PromptTokens {
			t.Fatalf("prompt %d: the engine rendered %d tokens, kvdirctl match %d: they hash different tokens", i, a.prompt, m.PromptTokens)
		}
		if a.cached == 0 {
			t.Fatalf("prompt %d: %s no longer caches any of it; the check needs the warm prompts cached", i, e.WorkerID)
		}
		if uint64(a.cached) != row.HitTokens {
			bad = append(bad, fmt.Sprintf("prompt %d (%d tokens): engine served %d cached tokens, directory holds %d blocks (%d hit tokens)",
				i, a.prompt, a.cached, row.MatchedBlocks, row.HitTokens))
		}
	}
	return bad
}

// checkView fails t unless the directory's view of e's worker agrees with
// the engine's cache on every one of chats (viewMismatches).
func checkView(t *testing.T, ctx context.Context, f *fleet.Fleet, e *fleet.Engine, chats []chatRequest, when string) {
	t.Helper()
	for _, m := range viewMismatches(t, ctx, f, e, chats) {
		t.Errorf("%s: %s", when, m)
	}
}

// waitRebuilt waits for id to be registered in an epoch after before's
// and to hold before's blocks again, and returns how long that took from
// since.
func waitRebuilt(t *testing.T, f *fleet.Fleet, before ctlview.Worker, since time.Time) (time.Duration, ctlview.Worker) {
	t.Helper()
	var w ctlview.Worker
	testkit.Eventually(t, 20*time.Second, before.ID+" re-registered with its blocks", func() (bool, string) {
		var ok bool
		w, ok = ctlWorker(t, f, before.ID)
		return ok && w.State == "ACTIVE" && w.Epoch > before.Epoch && w.Blocks == before.Blocks && w.GPUBlocks == before.GPUBlocks,
			fmt.Sprintf("epoch %d (was %d), %d blocks (was %d)", w.Epoch, before.Epoch, w.Blocks, before.Blocks)
	})
	return time.Since(since), w
}

// TestRebuildAfterExpiry warms an engine, expires its worker with
// kvdirctl and checks that its agent registers it again with the engine's
// whole cache, replayed from the engine, without new traffic; then does
// the same for an agent paused past its lease. Both times it logs how long
// the view took to come back (target: 5 s from the agent's resume) and
// checks the rebuilt view against the engine's own cache, prompt by
// prompt (checkView).
func TestRebuildAfterExpiry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := fleet.New(t, fleet.Config{Engines: 1, DirectoryArgs: []string{"--lease", "2s"}})
	e := f.Engines[0]
	before, chats := warmEngine(t, ctx, f, e)

	if out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "expire", e.WorkerID); code != 0 || !strings.Contains(out, "expired "+e.WorkerID) {
		t.Fatalf("kvdirctl expire: exit %d: %s %s", code, out, errOut)
	}
	expired := time.Now()
	took, w := waitRebuilt(t, f, before, expired)
	t.Logf("after kvdirctl expire: view of %d blocks back in %v (epoch %d)", w.Blocks, took, w.Epoch)
	if took > 5*time.Second {
		t.Errorf("view rebuilt %v after the expiry, want <= 5s", took)
	}
	if w.ViewPartial {
		t.Errorf("%s marked partial after a complete replay", e.WorkerID)
	}
	checkView(t, ctx, f, e, chats, "after kvdirctl expire")

	// An agent paused past its lease: the leader expires the worker; once
	// resumed, the agent's heartbeat finds it unknown and registers again.
	before = w
	resume := pause(t, e.Agent)
	testkit.Eventually(t, 15*time.Second, e.WorkerID+" expired by its lease", func() (bool, string) {
		w, ok := ctlWorker(t, f, e.WorkerID)
		return !ok || w.State != "ACTIVE", w.State
	})
	resume()
	took, w = waitRebuilt(t, f, before, time.Now())
	t.Logf("after a pause past the lease: view of %d blocks back in %v from resume (epoch %d)", w.Blocks, took, w.Epoch)
	if took > 5*time.Second {
		t.Errorf("view rebuilt %v after the agent resumed, want <= 5s", took)
	}
	checkView(t, ctx, f, e, chats, "after a pause past the lease")
}

// TestRebuildPartialWithoutReplay runs an agent without the engine's
// replay endpoint: after an expiry it cannot rebuild, and says so in the
// directory (view_partial, ACTIVE(partial) in kvdirctl workers).
func TestRebuildPartialWithoutReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := fleet.New(t, fleet.Config{Engines: 1, AgentArgs: []string{"--kv-events-replay-endpoint", "", "--heartbeat-interval", "200ms"}})
	e := f.Engines[0]
	before, _ := warmEngine(t, ctx, f, e)
	if before.ViewPartial {
		t.Fatalf("%s partial before any expiry", e.WorkerID)
	}
	if _, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "expire", e.WorkerID); code != 0 {
		t.Fatalf("kvdirctl expire: exit %d: %s", code, errOut)
	}
	testkit.Eventually(t, 15*time.Second, e.WorkerID+" re-registered and marked partial", func() (bool, string) {
		w, ok := ctlWorker(t, f, e.WorkerID)
		return ok && w.Epoch > before.Epoch && w.ViewPartial, fmt.Sprintf("epoch %d, partial %v, %d blocks", w.Epoch, w.ViewPartial, w.Blocks)
	})
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers")
	if code != 0 || !strings.Contains(out, "ACTIVE(partial)") {
		t.Errorf("kvdirctl workers: exit %d, want ACTIVE(partial):\n%s%s", code, out, errOut)
	}
	if !strings.Contains(e.Agent.Tail(50), "partial") {
		t.Errorf("agent log has no partial warning:\n%s", e.Agent.Tail(50))
	}
}

// TestRebuildPartialShortReplayBuffer runs an engine whose replay buffer
// keeps fewer batches than its cache was filled by: after an expiry the
// replay starts after the engine's first batch, and the worker is partial.
func TestRebuildPartialShortReplayBuffer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := fleet.New(t, fleet.Config{Engines: 1, EngineArgs: []string{"--replay-buffer-steps", "2"},
		AgentArgs: []string{"--heartbeat-interval", "200ms"}})
	e := f.Engines[0]
	before, _ := warmEngine(t, ctx, f, e)
	if _, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "expire", e.WorkerID); code != 0 {
		t.Fatalf("kvdirctl expire: exit %d: %s", code, errOut)
	}
	testkit.Eventually(t, 15*time.Second, e.WorkerID+" re-registered and marked partial", func() (bool, string) {
		w, ok := ctlWorker(t, f, e.WorkerID)
		return ok && w.Epoch > before.Epoch && w.ViewPartial, fmt.Sprintf("epoch %d, partial %v, %d blocks", w.Epoch, w.ViewPartial, w.Blocks)
	})
	if w, _ := ctlWorker(t, f, e.WorkerID); w.Blocks >= before.Blocks {
		t.Errorf("%d blocks rebuilt from a 2-batch buffer, %d before: the buffer covered the cache", w.Blocks, before.Blocks)
	}
}
