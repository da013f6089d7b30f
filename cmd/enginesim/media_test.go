package main

import (
	"io"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
)

func TestMediaFlags(t *testing.T) {
	env := func(string) string { return "" }
	cfg, err := parseConfig([]string{"--kv-offload-medium", "CPU", "--kv-offload-blocks", "64"}, env, io.Discard)
	if err != nil || cfg.media.offloadMedium != "CPU" || cfg.media.offloadBlocks != 64 {
		t.Fatalf("cfg %+v err %v", cfg.media, err)
	}
	cfg, err = parseConfig([]string{"--kv-events-dialect", "trtllm", "--trtllm-remote-every", "2", "--trtllm-mm-tokens", "3"}, env, io.Discard)
	if err != nil || cfg.shape.RemoteEvery != 2 || cfg.shape.MMEvery != 3 {
		t.Fatalf("cfg %+v err %v", cfg.shape, err)
	}
	for _, args := range [][]string{
		{"--kv-offload-medium", "GPU"},
		{"--kv-offload-medium", "CPU_TIER1"}, // SGLang's name in the vllm dialect
		{"--kv-offload-medium", "CPU", "--kv-offload-blocks", "0"},
		{"--kv-offload-medium", "CPU", "--kv-cache-groups", "mla_attention"},
		{"--kv-offload-medium", "CPU", "--kv-events-pull"},
		{"--trtllm-remote-every", "2"},
		{"--kv-events-dialect", "sglang", "--trtllm-mm-tokens", "1"},
		{"--kv-events-dialect", "trtllm", "--trtllm-remote-every", "-1"},
	} {
		if _, err := parseConfig(args, env, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestTRTLLMZMQEvents checks the trtllm dialect over ZMQ: batches of three
// items with the rank, BlockStored with locality REMOTE for every
// request (--trtllm-remote-every 1), no lora_name.
func TestTRTLLMZMQEvents(t *testing.T) {
	sub, ep := newSub(t)
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", ep, "--kv-events-dialect", "trtllm", "--trtllm-remote-every", "1")
	s.syncEvents(t, sub)
	s.postOK(t, "/v1/completions", map[string]any{"model": "llama3-8b", "prompt": words(3, 60), "max_tokens": 2}, nil)
	var stores int
	deadline := time.Now().Add(10 * time.Second)
	for stores == 0 && time.Now().Before(deadline) {
		for _, m := range drain(t, sub, 200*time.Millisecond) {
			if m.Payload[0] != 0x93 {
				t.Fatalf("batch is not a 3-item array: %x", m.Payload[:1])
			}
			for _, ev := range decode(t, m).Events {
				st, ok := ev.(*kvevents.BlockStored)
				if !ok {
					continue
				}
				if st.Locality != kvevents.LocalityRemote || st.LoRAName != "" || st.Medium != "GPU" {
					t.Fatalf("store %+v", st)
				}
				stores++
			}
		}
	}
	if stores == 0 {
		t.Fatal("no BlockStored received")
	}
}
