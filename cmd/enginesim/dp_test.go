package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
)

// rankPrompt is a token prompt of n full blocks, distinct per seed.
func rankPrompt(seed, blocks int) []uint32 {
	ids := make([]uint32, 16*blocks)
	for i := range ids {
		ids[i] = uint32(1000*seed + i + 1)
	}
	return ids
}

// complete posts a token-prompt completion, with X-data-parallel-rank when
// rank is not "", and returns the status, body and cached tokens.
func (s *sim) complete(t *testing.T, rank string, prompt []uint32) (int, string, int) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"llama3-8b","prompt":%s,"max_tokens":1}`, strings.Join(strings.Fields(fmt.Sprint(prompt)), ","))
	req, err := http.NewRequest(http.MethodPost, s.base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if rank != "" {
		req.Header.Set("X-Data-Parallel-Rank", rank) // any case: vLLM's server matches it case-insensitively
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var c openai.Completion
	cached := -1
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("decode %s: %v", data, err)
		}
		cached = c.Usage.PromptTokensDetails.CachedTokens
	}
	return resp.StatusCode, string(data), cached
}

// rankMetric returns the value of name's series for engine rank.
func (s *sim) rankMetric(t *testing.T, name string, rank int) float64 {
	t.Helper()
	_, body := s.get(t, "/metrics")
	prefix := fmt.Sprintf(`%s{engine="%d",`, name, rank)
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s series for engine %d in\n%s", name, rank, body)
	return 0
}

func TestDataParallelHeaderPicksTheRank(t *testing.T) {
	s := startSim(t, "--data-parallel-size", "2", "--time-scale", "0")
	p := rankPrompt(1, 4) // 64 tokens
	if code, body, cached := s.complete(t, "1", p); code != 200 || cached != 0 {
		t.Fatalf("turn 1 on rank 1: %d %s (cached %d)", code, body, cached)
	}
	if _, _, cached := s.complete(t, "1", p); cached < 48 {
		t.Fatalf("same prompt on rank 1 again: cached %d, want at least 48 (rank 1's cache)", cached)
	}
	if _, _, cached := s.complete(t, "0", p); cached != 0 {
		t.Fatalf("same prompt on rank 0: cached %d, want 0 (rank 0 has its own, cold cache)", cached)
	}
	// Each rank's series carry its engine label.
	if q0, q1 := s.rankMetric(t, "vllm:prefix_cache_queries_total", 0), s.rankMetric(t, "vllm:prefix_cache_queries_total", 1); q0 != 64 || q1 != 128 {
		t.Fatalf("prefix cache queries: rank 0 %v, rank 1 %v; want 64 and 128", q0, q1)
	}
	if h0, h1 := s.rankMetric(t, "vllm:prefix_cache_hits_total", 0), s.rankMetric(t, "vllm:prefix_cache_hits_total", 1); h0 != 0 || h1 < 48 {
		t.Fatalf("prefix cache hits: rank 0 %v, rank 1 %v; want 0 and at least 48", h0, h1)
	}
	// Out of range: 400, as vLLM; not an integer: ignored, as vLLM.
	for _, bad := range []string{"2", "-1"} {
		code, body, _ := s.complete(t, bad, p)
		if code != http.StatusBadRequest || !strings.Contains(body, "out of range [0, 2)") {
			t.Fatalf("rank %s: %d %s, want 400 out of range", bad, code, body)
		}
	}
	if code, body, _ := s.complete(t, "x", p); code != 200 {
		t.Fatalf("rank x: %d %s, want 200 (ignored)", code, body)
	}
}

func TestDataParallelWithoutHeaderPicksTheLeastLoaded(t *testing.T) {
	s := startSim(t, "--data-parallel-size", "2", "--time-scale", "1")
	// Keep rank 0 busy with a long streamed request.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := fmt.Sprintf(`{"model":"llama3-8b","prompt":%s,"max_tokens":100000,"stream":true}`, strings.Join(strings.Fields(fmt.Sprint(rankPrompt(9, 2))), ","))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("X-data-parallel-rank", "0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	testkit.Eventually(t, 10*time.Second, "rank 0 running its request", func() (bool, string) {
		v := s.rankMetric(t, "vllm:num_requests_running", 0)
		return v == 1, fmt.Sprint(v)
	})
	for i := range 4 {
		if code, body, _ := s.complete(t, "", rankPrompt(10+i, 1)); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	if q0, q1 := s.rankMetric(t, "vllm:prefix_cache_queries_total", 0), s.rankMetric(t, "vllm:prefix_cache_queries_total", 1); q0 != 32 || q1 != 64 {
		t.Fatalf("prefix cache queries: rank 0 %v, rank 1 %v; want 32 (its long request) and 64 (every other)", q0, q1)
	}
	cancel()

	// Idle ranks share the requests.
	idle := startSim(t, "--data-parallel-size", "2", "--time-scale", "0")
	for i := range 4 {
		if code, body, _ := idle.complete(t, "", rankPrompt(20+i, 1)); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	if q0, q1 := idle.rankMetric(t, "vllm:prefix_cache_queries_total", 0), idle.rankMetric(t, "vllm:prefix_cache_queries_total", 1); q0 != 32 || q1 != 32 {
		t.Fatalf("idle ranks: queries %v and %v, want 32 each", q0, q1)
	}
}

// Each rank publishes on its own ports, bound on every interface (a
// wildcard endpoint) or, with --kv-events-bind, on loopback.
func TestDataParallelEventsPerRank(t *testing.T) {
	t.Run("wildcard", func(t *testing.T) { testDataParallelEventsPerRank(t, "*") })
	t.Run("loopback", func(t *testing.T) { testDataParallelEventsPerRank(t, "127.0.0.1", "--kv-events-bind") })
}

func testDataParallelEventsPerRank(t *testing.T, host string, extra ...string) {
	pub, replay := testkit.FreePortRun(t, 2), testkit.FreePortRun(t, 2)
	s := startSim(t, append([]string{"--data-parallel-size", "2", "--time-scale", "0",
		"--kv-events-endpoint", fmt.Sprintf("tcp://%s:%d", host, pub), "--kv-events-replay-endpoint", fmt.Sprintf("tcp://%s:%d", host, replay)}, extra...)...)
	prefix := "" // any interface
	if host != "*" {
		prefix = host + ":"
	}
	for r, rs := range s.srv.ranks {
		if got, want := rs.EventsAddr(), ":"+strconv.Itoa(pub+r); !strings.HasSuffix(got, want) || !strings.HasPrefix(got, prefix) {
			t.Fatalf("rank %d publishes on %s, want %sport %s", r, got, prefix, want)
		}
		if got, want := rs.ReplayAddr(), ":"+strconv.Itoa(replay+r); !strings.HasSuffix(got, want) || !strings.HasPrefix(got, prefix) {
			t.Fatalf("rank %d replays on %s, want %sport %s", r, got, prefix, want)
		}
	}
	var subs []*kvevents.Subscriber
	for r := range 2 {
		sub, err := kvevents.NewSubscriber(context.Background(), kvevents.SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pub+r)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		subs = append(subs, sub)
	}
	// Reset (every rank's cache) until both streams deliver.
	got := [2]bool{}
	testkit.Eventually(t, 10*time.Second, "both ranks' event streams", func() (bool, string) {
		s.postOK(t, "/reset_prefix_cache", "", nil)
		for r, sub := range subs {
			if m, ok := recv(t, sub, 100*time.Millisecond); ok {
				if b := decode(t, m); b.DPRank == nil || *b.DPRank != r {
					t.Fatalf("stream %d: batch rank %v", r, b.DPRank)
				}
				got[r] = true
			}
		}
		return got[0] && got[1], fmt.Sprint(got)
	})
	for _, sub := range subs {
		drain(t, sub, 200*time.Millisecond)
	}
	p := rankPrompt(3, 2)
	if code, body, _ := s.complete(t, "1", p); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	stored := func(ms []kvevents.Msg) int {
		n := 0
		for _, m := range ms {
			for _, e := range decode(t, m).Events {
				if _, ok := e.(*kvevents.BlockStored); ok {
					n++
				}
			}
		}
		return n
	}
	if n := stored(drain(t, subs[1], 300*time.Millisecond)); n == 0 {
		t.Fatal("rank 1 published no BlockStored for its request")
	}
	if n := stored(drain(t, subs[0], 100*time.Millisecond)); n != 0 {
		t.Fatalf("rank 0 published %d BlockStored for rank 1's request", n)
	}
}

func TestDataParallelSizeFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--data-parallel-size", "0"},
		{"--data-parallel-size", "257"},
		{"--data-parallel-size", "2", "--data-parallel-rank", "1"},
		{"--data-parallel-size", "2", "--metrics-format", "sglang"},
	} {
		if _, err := parseConfig(args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "data-parallel") {
			t.Errorf("%v: %v, want a data-parallel usage error", args, err)
		}
	}
}
