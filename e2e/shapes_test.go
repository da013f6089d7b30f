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

// turnCheck says what a two-turn session must show.
type turnCheck struct {
	// Model is the request's "model" (default llama3-8b).
	Model string
	// BlockSize is the engine's block size (default 16): turn 2 must find
	// all of turn 1's full blocks but the last cached.
	BlockSize int
	// Header is set on both turns' requests (e.g. a cache salt carrier).
	Header map[string]string
	// CacheSalt is both turns' cache_salt; then a third request, turn 2
	// with another salt, must not be predicted as cached.
	CacheSalt string
	// SystemRepeat repeats the system prompt (default once), so that turn
	// 1 spans several blocks of a large block size.
	SystemRepeat int
	// BetweenTurns, if set, runs after turn 1 with its worker (e.g. to
	// evict turn 1's blocks from the engine's GPU cache).
	BetweenTurns func(worker string)
}

// turnTwoFollowsTurnOne sends turn 1 of session sess through router r0
// and turn 2 through r1 (which may be r0), after waiting until r1 learns
// from the directory where turn 1's blocks live. It checks that turn 2
// lands on turn 1's worker, not by a fallback, that the router predicted
// cached tokens, and that the engine reports at least all of turn 1's
// full blocks but the last as cached. It returns both answers. Fleets
// that call it with two routers run them with --share-intents=false: r1
// must learn where turn 1 went from the directory (the engine's events),
// not from r0's placement intent.
func turnTwoFollowsTurnOne(t *testing.T, ctx context.Context, r0, r1, sess string, i int, tc turnCheck) (a1, a2 answer) {
	t.Helper()
	if tc.Model == "" {
		tc.Model = "llama3-8b"
	}
	if tc.BlockSize == 0 {
		tc.BlockSize = 16
	}
	system := strings.Repeat(systemPrompt(i), max(tc.SystemRepeat, 1))
	c := chatRequest{Model: tc.Model, MaxTokens: 4, CacheSalt: tc.CacheSalt, Messages: []message{
		{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprintf("Question %d: what does a prefix cache save?", i)}}}
	a1, err := sendWith(ctx, r0, sess, c, tc.Header)
	if err != nil || a1.status != 200 {
		t.Fatalf("turn 1 of %s: %v %+v", sess, err, a1)
	}
	if a1.prompt < 2*tc.BlockSize {
		t.Fatalf("%s: turn 1 has %d prompt tokens, less than two blocks of %d: lengthen it (SystemRepeat)", sess, a1.prompt, tc.BlockSize)
	}
	if tc.BetweenTurns != nil {
		tc.BetweenTurns(a1.worker)
	}
	c.Messages = append(c.Messages, message{Role: "assistant", Content: a1.content}, message{Role: "user", Content: "And what does it cost?"})
	testkit.Eventually(t, 15*time.Second, "the directory to hold turn 1's blocks", func() (bool, string) {
		e, err := explainWith(ctx, r1, sess, c, tc.Header)
		if err != nil {
			return false, err.Error()
		}
		return e.Pick == a1.worker && e.PredictedCachedTokens > 0 && e.Fallback == "",
			fmt.Sprintf("pick %s (turn 1 on %s), predicted %d, fallback %q", e.Pick, a1.worker, e.PredictedCachedTokens, e.Fallback)
	})
	a2, err = sendWith(ctx, r1, sess, c, tc.Header)
	if err != nil || a2.status != 200 {
		t.Fatalf("turn 2 of %s: %v %+v", sess, err, a2)
	}
	if a2.worker != a1.worker || a2.fallback != "" {
		t.Fatalf("%s: turn 1 on %s, turn 2 on %s (fallback %q)", sess, a1.worker, a2.worker, a2.fallback)
	}
	// Turn 1's prompt ends with the generation prompt, which turn 2
	// renders differently, so all but its last partial block and those
	// few tokens must come from the cache.
	if a2.cached < (a1.prompt/tc.BlockSize-1)*tc.BlockSize || a2.cached == 0 {
		t.Fatalf("%s: engine reported %d cached tokens of turn 2 (turn 1 had %d prompt tokens, block size %d)", sess, a2.cached, a1.prompt, tc.BlockSize)
	}
	if a2.predicted == "" || a2.predicted == "0" {
		t.Fatalf("%s: router predicted no cached tokens (%q)", sess, a2.predicted)
	}
	if tc.CacheSalt != "" {
		// The same conversation under another salt is another namespace:
		// nothing of it is cached anywhere.
		other := c
		other.CacheSalt = tc.CacheSalt + "-other"
		e, err := explainWith(ctx, r1, sess+"-other", other, tc.Header)
		if err != nil {
			t.Fatalf("%s: explain with another salt: %v", sess, err)
		}
		if e.PredictedCachedTokens != 0 {
			t.Fatalf("%s: salt %q predicted %d cached tokens on %s; only salt %q's blocks exist", sess, other.CacheSalt, e.PredictedCachedTokens, e.Pick, tc.CacheSalt)
		}
	}
	return a1, a2
}

// engineShape is one way an engine can present itself to kvdir: the
// flags that make the simulator (and, where the operator must say so, the
// agent and router) take that shape.
type engineShape struct {
	name                              string
	engineArgs, agentArgs, routerArgs []string
	check                             turnCheck
	// loadCounters, if set, are the engine's prompt-token and cached-token
	// counters: after the sessions the directory's load of every worker
	// must show their values (the agent read the engine's metrics).
	loadCounters [2]string
	// pull makes the engines TensorRT-LLM ones whose agents poll POST
	// /kv_cache_events (fleet.Config.PullEvents).
	pull bool
	// betweenTurns, if set, runs between each session's turns with turn
	// 1's worker; after, if set, once the sessions are done (media_test.go).
	betweenTurns func(t *testing.T, ctx context.Context, f *fleet.Fleet, worker string)
	after        func(t *testing.T, ctx context.Context, f *fleet.Fleet)
}

// engineShapes are the model families and engines kvdir serves; each
// runs end to end: simulator in that shape, ZMQ (or the pull endpoint),
// agent, 3-node directory, two routers.
//
// Rows may pass the engine's block size to the agent (--block-size) or
// not: the directory learns it from the events either way, and routers
// hash with the learned size.
var engineShapes = []engineShape{
	{name: "vllm full attention, block 16"},
	{name: "vllm MLA, block 64",
		engineArgs: []string{"--kv-cache-groups", "mla_attention", "--block-size", "64"},
		agentArgs:  []string{"--block-size", "64"},
		check:      turnCheck{BlockSize: 64}},
	{name: "vllm hybrid, sliding window group 0, full attention group 1, block 528",
		engineArgs: []string{"--kv-cache-groups", "sliding_window:1024,full_attention", "--block-size", "528", "--kv-blocks", "1024",
			"--kv-events-form", "map"},
		agentArgs: []string{"--block-size", "528"},
		check:     turnCheck{BlockSize: 528, SystemRepeat: 12}},
	{name: "vllm salted",
		check: turnCheck{CacheSalt: "tenant-v"}},
	{name: "sglang array layout, EAGLE bigrams, salt in metadata",
		engineArgs: []string{"--kv-events-dialect", "sglang", "--kv-events-form", "array", "--speculative-bigrams", "--metrics-format", "sglang"},
		agentArgs:  []string{"--engine-kind", "sglang"},
		check:      turnCheck{CacheSalt: "tenant-a"}},
	{name: "sglang map layout, top-level salt",
		engineArgs: []string{"--kv-events-dialect", "sglang", "--kv-events-form", "map", "--metrics-format", "sglang"},
		agentArgs:  []string{"--engine-kind", "sglang"},
		check:      turnCheck{CacheSalt: "tenant-b"}},
	{name: "sglang metrics",
		engineArgs:   []string{"--kv-events-dialect", "sglang", "--metrics-format", "sglang"},
		agentArgs:    []string{"--engine-kind", "sglang"},
		loadCounters: [2]string{"sglang:prompt_tokens_total", "sglang:cached_tokens_total"}},
	// trtllm-serve: events pulled as JSON, block size 32, JSON iteration
	// stats; the agent registers 32 (it could be left out: the size is
	// learned from the events).
	{name: "trtllm pull endpoint, block 32", pull: true, agentArgs: []string{"--block-size", "32"},
		check: turnCheck{BlockSize: 32}},
	// The agent is not told the engine's block size: the directory learns
	// 64 from the events and the routers hash with it.
	{name: "block 64, agent not told", engineArgs: []string{"--block-size", "64"},
		check: turnCheck{BlockSize: 64, SystemRepeat: 3}},
	// A hybrid model's layout (a sliding-window group, not indexed, and a
	// full-attention group of 528-token blocks), learned with no flag.
	{name: "vllm hybrid, block 528, agent not told",
		engineArgs: []string{"--kv-cache-groups", "sliding_window:1024,full_attention", "--block-size", "528", "--kv-blocks", "1024"},
		check:      turnCheck{BlockSize: 528, SystemRepeat: 12}},
	// vLLM's kv_cache_report_mode="full": reused prefixes are stored
	// again, and the agent counts each held block once; a small cache
	// shows the evictions reach the directory (reportmode_test.go).
	{name: "vllm kv_cache_report_mode full, evictions",
		engineArgs: []string{"--kv-report-mode", "full", "--kv-blocks", fmt.Sprint(fullReportKVBlocks)},
		agentArgs:  []string{"--kv-report-mode", "full"},
		after:      fullReportEvictions},
	// A hybrid Mamba model: the Mamba group 0 stores only its state
	// blocks and is counted, not indexed; full attention is group 1.
	{name: "vllm hybrid, Mamba group 0, full attention group 1, block 64",
		engineArgs: []string{"--kv-cache-groups", "mamba,full_attention", "--block-size", "64"},
		check:      turnCheck{BlockSize: 64, SystemRepeat: 3}},
	// Offloading: a GPU cache of 24 blocks is flushed between the turns,
	// so turn 1's blocks are on the tier when turn 2 comes: the directory
	// holds them on CPU (DISK), the router credits them and the engine
	// serves them from the tier.
	{name: "vllm CPU offload, GPU flushed between turns",
		engineArgs:   []string{"--kv-blocks", "24", "--kv-offload-medium", "CPU", "--kv-offload-blocks", "1024"},
		betweenTurns: flushGPU(24), after: mediumHeld("cpu")},
	{name: "vllm STORAGE offload, GPU flushed between turns",
		engineArgs:   []string{"--kv-blocks", "24", "--kv-offload-medium", "STORAGE", "--kv-offload-blocks", "1024", "--kv-events-form", "map"},
		betweenTurns: flushGPU(24), after: mediumHeld("disk")},
	// TensorRT-LLM's ZMQ events, every second request's stores remote:
	// each session's turn 2 is, so turn 2 lands on turn 1's local blocks,
	// and a probe shows remote blocks are not credited.
	{name: "trtllm zmq, remote stores",
		engineArgs: []string{"--kv-events-dialect", "trtllm", "--trtllm-remote-every", "2"},
		after:      remoteNotCredited},
}

// TestEngineShapes checks, for every engine shape, that turn 2 of a
// session lands where turn 1's blocks are and the engine reports them
// cached.
func TestEngineShapes(t *testing.T) {
	ctx := context.Background()
	for _, sh := range engineShapes {
		t.Run(sh.name, func(t *testing.T) {
			f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2, Model: sh.check.Model, PullEvents: sh.pull,
				EngineArgs: append([]string{"--time-scale", "0.02", "--default-max-tokens", "4"}, sh.engineArgs...),
				AgentArgs:  sh.agentArgs,
				RouterArgs: append([]string{"--policy", "kvdir", "--match-timeout", "200ms", "--share-intents=false"}, sh.routerArgs...)})
			check := sh.check
			if sh.betweenTurns != nil {
				check.BetweenTurns = func(worker string) { sh.betweenTurns(t, ctx, f, worker) }
			}
			for i := range 2 {
				turnTwoFollowsTurnOne(t, ctx, f.Routers[0].URL, f.Routers[1].URL, fmt.Sprintf("shape-%d", i), i, check)
			}
			if sh.loadCounters[0] != "" {
				loadReachesDirectory(t, f, sh.loadCounters)
			}
			if sh.after != nil {
				sh.after(t, ctx, f)
			}
		})
	}
}

// loadReachesDirectory waits until the directory's load of every worker
// shows its engine's prompt-token and cached-token counters (names as the
// engine's /metrics spells them), which only happens when the agent read
// them from the engine's metrics.
func loadReachesDirectory(t *testing.T, f *fleet.Fleet, counters [2]string) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, "the engines' "+counters[0]+" and "+counters[1]+" in the directory", func() (bool, string) {
		out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
		if code != 0 {
			return false, errOut
		}
		var workers ctlview.WorkerList
		if err := json.Unmarshal([]byte(out), &workers); err != nil {
			return false, err.Error()
		}
		byID := map[string]ctlview.Worker{}
		for _, w := range workers.Workers {
			byID[w.ID] = w
		}
		var prompt, cached float64
		for _, e := range f.Engines {
			q, h := engineMetric(t, e.URL, counters[0]), engineMetric(t, e.URL, counters[1])
			w := byID[e.WorkerID]
			if float64(w.PrefixQueries) != q || float64(w.PrefixHits) != h {
				return false, fmt.Sprintf("%s: directory %d/%d, engine %v/%v", e.WorkerID, w.PrefixQueries, w.PrefixHits, q, h)
			}
			prompt, cached = prompt+q, cached+h
		}
		// Turn 2 of each session hit turn 1's blocks.
		return prompt > 0 && cached > 0, fmt.Sprintf("engines' totals %v/%v", prompt, cached)
	})
}
