package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
)

func TestShapeFlags(t *testing.T) {
	cfg, err := parseConfig([]string{"--kv-cache-groups", "sliding_window:1024,full_attention", "--block-size", "528"}, func(string) string { return "" }, io.Discard)
	if err != nil || len(cfg.shape.Groups) != 2 || cfg.shape.Groups[1].Kind != kvevents.SpecKindFullAttention {
		t.Fatalf("cfg %+v err %v", cfg.shape, err)
	}
	for _, args := range [][]string{
		{"--kv-cache-groups", "sliding_window:1024"},
		{"--kv-cache-groups", "mamba"},
		{"--kv-events-dialect", "tgi"},
		{"--speculative-bigrams"},
		{"--kv-events-dialect", "sglang", "--kv-cache-groups", "mla_attention"},
		{"--metrics-format", "json"},
	} {
		if err := run(context.Background(), args, func(string) string { return "" }, io.Discard, nil); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestSGLangEvents checks the events of a salted request in the sglang
// dialect with bigrams, over ZMQ: one page per BlockStored in SGLang's
// array layout (seven items, the metadata map as the eighth), the salt
// and the bigram pairs decoded.
func TestSGLangEvents(t *testing.T) {
	sub, ep := newSub(t)
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", ep, "--kv-events-dialect", "sglang", "--speculative-bigrams", "--block-size", "16")
	s.syncEvents(t, sub)
	s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": words(3, 60), "max_tokens": 2, "cache_salt": "tenant-a"}, nil)
	var pages int
	deadline := time.Now().Add(10 * time.Second)
	for pages == 0 && time.Now().Before(deadline) {
		for _, m := range drain(t, sub, 200*time.Millisecond) {
			if m.Payload[0] != 0x93 {
				t.Fatalf("batch is not SGLang's 3-item array: %x", m.Payload[:1])
			}
			for _, ev := range decode(t, m).Events {
				st, ok := ev.(*kvevents.BlockStored)
				if !ok {
					continue
				}
				if len(st.BlockHashes) != 1 || !st.Bigram || st.CacheSalt != "tenant-a" || st.LoRAName != "" || st.Medium != "GPU" {
					t.Fatalf("store %+v", st)
				}
				pages++
			}
		}
	}
	if pages == 0 {
		t.Fatal("no BlockStored received")
	}
}

func TestSGLangMetrics(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--model", "m1", "--metrics-format", "sglang")
	for range 2 {
		s.postOK(t, "/v1/completions", map[string]any{"model": "m1", "prompt": words(5, 100), "max_tokens": 4}, nil)
	}
	_, body := s.get(t, "/metrics")
	if strings.Contains(body, "vllm:") {
		t.Fatal("sglang metrics format exports vllm: names")
	}
	for _, name := range []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"} {
		if !strings.Contains(body, name+`{engine_type="unified",model_name="m1",pp_rank="0",tp_rank="0"}`) {
			t.Errorf("scheduler gauge %s with SGLang's labels missing:\n%s", name, body)
		}
	}
	if v := s.metric(t, "sglang:prompt_tokens_total"); v < 200 {
		t.Errorf("prompt_tokens_total %v, want >= 200", v)
	}
	if v := s.metric(t, "sglang:cached_tokens_total"); v < 96 {
		t.Errorf("cached_tokens_total %v, want >= 96", v)
	}
	if v := s.metric(t, "sglang:time_to_first_token_seconds_count"); v != 2 {
		t.Errorf("ttft count %v, want 2", v)
	}
}
