package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/enginemetrics"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/trtevents"
)

// pullTRT drains the simulator's /kv_cache_events and decodes it.
func (s *sim) pullTRT(t *testing.T, dec *trtevents.Decoder) []trtevents.Event {
	t.Helper()
	code, body := s.post(t, "/kv_cache_events", "")
	if code != http.StatusOK {
		t.Fatalf("POST /kv_cache_events: %d %s", code, body)
	}
	evs, st, err := dec.Decode(body)
	if err != nil || st.Malformed+st.Unknown > 0 {
		t.Fatalf("decode %s: %v %+v", body, err, st)
	}
	return evs
}

func promptOf(n, base int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = base + i
	}
	return p
}

func TestTRTLLMEvents(t *testing.T) {
	s := startSim(t, "--kv-events-pull", "--metrics-format", "trtllm", "--time-scale", "0")
	if s.srv.cfg.blockSize != 32 {
		t.Fatalf("block size %d, want TensorRT-LLM's 32", s.srv.cfg.blockSize)
	}
	dec := trtevents.NewDecoder(32)
	evs := s.pullTRT(t, dec)
	if len(evs) != 1 || evs[0].ID != 0 || evs[0].Type != trtevents.TypeCreated {
		t.Fatalf("first pull %+v, want the created event 0", evs)
	}
	prompt := promptOf(70, 1000)
	s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": prompt, "max_tokens": 1}, nil)
	var stored *kvevents.BlockStored
	next := uint64(1)
	testkit.Eventually(t, 5*time.Second, "a store of the prompt's 2 full blocks", func() (bool, string) {
		for _, ev := range s.pullTRT(t, dec) {
			if ev.ID != next {
				t.Fatalf("event_id %d, want %d (consecutive)", ev.ID, next)
			}
			next++
			if e, ok := ev.Event.(*kvevents.BlockStored); ok && e.Parent == nil {
				stored = e
			}
		}
		return stored != nil, ""
	})
	if stored.BlockSize != 32 || len(stored.BlockHashes) != 2 || stored.TokenIDs[0] != 1000 || stored.TokenIDs[63] != 1063 {
		t.Fatalf("store: %d blocks of %d, tokens %v", len(stored.BlockHashes), stored.BlockSize, stored.TokenIDs)
	}
	// Drained: nothing twice.
	if evs := s.pullTRT(t, dec); len(evs) != 0 {
		t.Fatalf("second pull: %+v", evs)
	}
	// A restart numbers from 0 again with a created event.
	s.postOK(t, "/admin/restart", "", nil)
	if evs := s.pullTRT(t, dec); len(evs) != 1 || evs[0].ID != 0 || evs[0].Type != trtevents.TypeCreated {
		t.Fatalf("after restart: %+v", evs)
	}
}

func TestTRTLLMQueueDropsOldest(t *testing.T) {
	s := startSim(t, "--kv-events-pull", "--metrics-format", "trtllm", "--time-scale", "0", "--kv-events-queue-size", "2", "--kv-blocks", "8")
	// Enough distinct prompts to evict: stores and removals well over 2.
	for i := range 6 {
		s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": promptOf(70, 1000*(i+1)), "max_tokens": 1}, nil)
	}
	dec := trtevents.NewDecoder(32)
	evs := s.pullTRT(t, dec)
	if len(evs) != 2 || evs[0].ID < 2 || evs[1].ID != evs[0].ID+1 {
		t.Fatalf("bounded queue: %+v, want the 2 newest events", evs)
	}
}

func TestTRTLLMMetricsDrain(t *testing.T) {
	s := startSim(t, "--kv-events-pull", "--metrics-format", "trtllm", "--time-scale", "0")
	s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": promptOf(70, 5), "max_tokens": 1}, nil)
	s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": promptOf(70, 5), "max_tokens": 1}, nil)
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	l, err := enginemetrics.ParseWith(strings.NewReader(body), enginemetrics.Options{Kind: enginemetrics.KindTRTLLM, Force: true})
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	// The second request hit the first's 2 blocks: 64 of 128 tokens queried.
	if l.Kind != enginemetrics.KindTRTLLM || l.PrefixHits != 64 || l.PrefixQueries != 128 {
		t.Fatalf("load %+v from %s", l, body)
	}
	// Auto-detection reads it too.
	if l, err := enginemetrics.Parse(bytes.NewReader([]byte(body))); err != nil || l.Kind != enginemetrics.KindTRTLLM {
		t.Fatalf("detected %+v %v", l, err)
	}
	// Drained: no new iteration, no entry.
	if _, body := s.get(t, "/metrics"); strings.TrimSpace(body) != "[]" {
		t.Fatalf("second read %q, want []", body)
	}
}

func TestTRTLLMFlags(t *testing.T) {
	getenv := func(string) string { return "" }
	cfg, err := parseConfig([]string{"--kv-events-pull"}, getenv, io.Discard)
	if err != nil || cfg.blockSize != 32 {
		t.Fatalf("--kv-events-pull: block size %d, %v; want TensorRT-LLM's 32", cfg.blockSize, err)
	}
	if cfg, err := parseConfig([]string{"--kv-events-pull", "--block-size", "64"}, getenv, io.Discard); err != nil || cfg.blockSize != 64 {
		t.Fatalf("given block size: %d, %v", cfg.blockSize, err)
	}
	for _, args := range [][]string{
		{"--kv-events-pull", "--kv-cache-groups", "mla_attention"},
		{"--kv-events-pull", "--kv-events-dialect", "sglang"},
		{"--kv-events-pull", "--kv-events-queue-size", "0"},
		{"--kv-events-pull", "--data-parallel-size", "2"},
	} {
		if _, err := parseConfig(args, getenv, io.Discard); err == nil || !cli.IsUsage(err) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// TestTRTLLMLoRAStoresApart checks that an adapter's blocks carry lora_id,
// so that a poller does not take them for the base model's.
func TestTRTLLMLoRAStoresApart(t *testing.T) {
	s := startSim(t, "--kv-events-pull", "--time-scale", "0", "--lora-modules", "sql-lora=/adapters/sql")
	s.postOK(t, "/v1/completions", map[string]any{"model": "sql-lora", "prompt": promptOf(70, 7), "max_tokens": 1}, nil)
	dec := trtevents.NewDecoder(32)
	var stored *kvevents.BlockStored
	testkit.Eventually(t, 5*time.Second, "the adapter request's store", func() (bool, string) {
		for _, ev := range s.pullTRT(t, dec) {
			if e, ok := ev.Event.(*kvevents.BlockStored); ok {
				stored = e
			}
		}
		return stored != nil, ""
	})
	if stored.LoRAID == nil || *stored.LoRAID == 0 || !strings.HasPrefix(stored.LoRAName, "trtllm-lora-") {
		t.Fatalf("adapter store: lora_id %v, namespace %q", stored.LoRAID, stored.LoRAName)
	}
}
