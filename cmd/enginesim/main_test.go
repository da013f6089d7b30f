package main

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

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// words returns n pseudo-random words of a small vocabulary.
func words(seed, n int) string {
	vocab := []string{"cache", "block", "router", "prefix", "engine", "token", "replica", "session",
		"latency", "decode", "prefill", "hash", "affinity", "batch", "memory", "queue"}
	var b strings.Builder
	x := uint32(seed*2654435761 + 1)
	for i := range n {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[x%uint32(len(vocab))])
	}
	return b.String()
}

func msg(role, text string) tokenize.Message {
	return tokenize.Message{Role: role, Content: tokenize.TextContent(text)}
}

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestTwoTurnChat replays the seed document's agent trajectory: a ~1,200
// token system prompt and a ~3,000 token document, a 700-token answer, then
// a second turn carrying the transcript and a ~200 token follow-up. Turn 1
// hits nothing; turn 2 hits the turn-1 prompt's full blocks. The turn's KV
// events arrive over ZMQ and carry the prompt's blocks.
func TestTwoTurnChat(t *testing.T) {
	sub, ep := newSub(t)
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", ep, "--kv-events-topic", "kv@sim",
		"--max-model-len", "16384")
	s.syncEvents(t, sub)
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}

	turn1 := []tokenize.Message{msg("system", words(1, 1200)), msg("user", words(2, 3000))}
	var r1 openai.ChatCompletion
	s.postOK(t, "/v1/chat/completions", map[string]any{"model": "llama3-8b", "messages": turn1, "max_tokens": 700}, &r1)
	p1, _ := tmpl.RenderChat(turn1, true)
	if r1.Usage.PromptTokens != len(p1) || r1.Usage.CompletionTokens != 700 || r1.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("turn 1 usage %+v (details %+v), want prompt %d, completion 700, cached 0", r1.Usage, r1.Usage.PromptTokensDetails, len(p1))
	}
	if len(r1.Choices) != 1 || r1.Choices[0].FinishReason != "length" || r1.Object != "chat.completion" {
		t.Fatalf("turn 1 response %+v", r1)
	}

	// Events of turn 1: BlockStored runs chained by parent hash whose
	// token_ids start with the prompt's full blocks.
	msgs := drain(t, sub, 300*time.Millisecond)
	if len(msgs) == 0 {
		t.Fatal("no events for turn 1")
	}
	var stored []uint32
	var last *kvevents.Hash
	for i, m := range msgs {
		if m.Topic != "kv@sim" {
			t.Fatalf("topic %q", m.Topic)
		}
		if i > 0 && m.Seq != msgs[i-1].Seq+1 {
			t.Fatalf("sequence gap %d -> %d", msgs[i-1].Seq, m.Seq)
		}
		b := decode(t, m)
		if b.DPRank == nil || *b.DPRank != 0 || b.TS <= 0 {
			t.Fatalf("batch header ts=%v dp=%v", b.TS, b.DPRank)
		}
		for _, ev := range b.Events {
			bs, ok := ev.(*kvevents.BlockStored)
			if !ok {
				t.Fatalf("unexpected %s event", ev.EventType())
			}
			if bs.BlockSize != 16 || bs.Medium != "GPU" || bs.LoRAName != "" || len(bs.TokenIDs) != 16*len(bs.BlockHashes) {
				t.Fatalf("bad BlockStored %+v", bs)
			}
			switch {
			case last == nil && bs.Parent != nil:
				t.Fatalf("first BlockStored has parent %v", bs.Parent)
			case last != nil && (bs.Parent == nil || *bs.Parent != *last):
				t.Fatalf("BlockStored parent %v, want %v", bs.Parent, last)
			}
			h := bs.BlockHashes[len(bs.BlockHashes)-1]
			last = &h
			stored = append(stored, bs.TokenIDs...)
		}
	}
	full := len(p1) / 16 * 16
	if len(stored) < full || !slices.Equal(stored[:full], p1[:full]) {
		t.Fatalf("stored %d tokens; first %d do not equal the prompt's full blocks", len(stored), full)
	}
	// Prompt plus 699 computed output tokens, in full blocks.
	if want := (len(p1) + 699) / 16 * 16; len(stored) != want {
		t.Errorf("stored %d tokens, want %d", len(stored), want)
	}

	turn2 := append(slices.Clone(turn1), msg("assistant", r1.Choices[0].Message.Content), msg("user", words(3, 200)))
	var r2 openai.ChatCompletion
	s.postOK(t, "/v1/chat/completions", map[string]any{"model": "llama3-8b", "messages": turn2, "max_tokens": 16}, &r2)
	p2, _ := tmpl.RenderChat(turn2, true)
	want := commonPrefix(p1, p2) / 16 * 16
	got := r2.Usage.PromptTokensDetails.CachedTokens
	t.Logf("turn 1 prompt %d tokens; turn 2 prompt %d tokens, cached %d", len(p1), len(p2), got)
	if r2.Usage.PromptTokens != len(p2) || got != want || got < full-16 {
		t.Fatalf("turn 2 usage %+v cached %d, want prompt %d cached %d (turn-1 full blocks %d)", r2.Usage, got, len(p2), want, full)
	}
	if hits := s.metric(t, "vllm:prefix_cache_hits_total"); hits != float64(got) {
		t.Errorf("prefix_cache_hits_total %v, want %d", hits, got)
	}
}

func TestStreamingFormat(t *testing.T) {
	s := startSim(t, "--time-scale", "0")
	t.Run("chat with usage", func(t *testing.T) {
		resp, err := http.Post(s.base+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"llama3-8b","messages":[{"role":"user","content":"hi there"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"unknown_field":1}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		evs := sseEvents(t, string(body))
		// role chunk, 5 token chunks, finish chunk, usage chunk, [DONE]
		if len(evs) != 9 || evs[8] != "[DONE]" {
			t.Fatalf("%d events: %q", len(evs), evs)
		}
		var id string
		for i, ev := range evs[:8] {
			var c openai.ChatCompletionChunk
			if err := json.Unmarshal([]byte(ev), &c); err != nil {
				t.Fatalf("chunk %d: %v", i, err)
			}
			if c.Object != "chat.completion.chunk" || c.Model != "llama3-8b" || c.ID == "" {
				t.Fatalf("chunk %d: %s", i, ev)
			}
			if id == "" {
				id = c.ID
			} else if c.ID != id {
				t.Fatalf("chunk %d id %q, want %q", i, c.ID, id)
			}
			switch {
			case i == 0:
				if c.Choices[0].Delta.Role != "assistant" || c.Choices[0].FinishReason != nil {
					t.Fatalf("first chunk %s", ev)
				}
			case i <= 5:
				if c.Choices[0].Delta.Content == nil || c.Choices[0].FinishReason != nil || c.Usage != nil {
					t.Fatalf("token chunk %d %s", i, ev)
				}
			case i == 6:
				if fr := c.Choices[0].FinishReason; fr == nil || *fr != "length" || c.Choices[0].Delta.Content != nil {
					t.Fatalf("finish chunk %s", ev)
				}
			case i == 7:
				u := c.Usage
				if len(c.Choices) != 0 || u == nil || u.PromptTokens == 0 || u.CompletionTokens != 5 ||
					u.TotalTokens != u.PromptTokens+5 || u.PromptTokensDetails == nil {
					t.Fatalf("usage chunk %s", ev)
				}
			}
		}
	})
	t.Run("completion without usage", func(t *testing.T) {
		code, body := s.post(t, "/v1/completions", `{"prompt":[1,2,3,4],"max_tokens":3,"stream":true}`)
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		evs := sseEvents(t, string(body))
		if len(evs) != 5 || evs[4] != "[DONE]" {
			t.Fatalf("%d events: %q", len(evs), evs)
		}
		for i, ev := range evs[:4] {
			var c openai.Completion
			if err := json.Unmarshal([]byte(ev), &c); err != nil || c.Object != "text_completion" || len(c.Choices) != 1 || c.Usage != nil {
				t.Fatalf("chunk %d %s: %v", i, ev, err)
			}
			if fr := c.Choices[0].FinishReason; (i == 3) != (fr != nil) || (fr != nil && *fr != "length") {
				t.Fatalf("chunk %d finish %v", i, fr)
			}
		}
	})
}

func TestNonStreamingUsage(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--default-max-tokens", "7")
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	for turn, wantCached := range []int{0, 32} {
		var c openai.Completion
		s.postOK(t, "/v1/completions", map[string]any{"prompt": prompt}, &c)
		u := c.Usage
		if c.Object != "text_completion" || len(c.Choices) != 1 || u == nil || u.PromptTokens != 40 || u.CompletionTokens != 7 ||
			u.TotalTokens != 47 || u.PromptTokensDetails.CachedTokens != wantCached {
			t.Fatalf("turn %d: %+v usage %+v", turn, c, u)
		}
	}
	// cache_salt puts the request in another namespace: no hit.
	var c openai.Completion
	s.postOK(t, "/v1/completions", map[string]any{"prompt": prompt, "cache_salt": "tenant-b", "max_tokens": 2}, &c)
	if c.Usage.PromptTokensDetails.CachedTokens != 0 || c.Usage.CompletionTokens != 2 {
		t.Fatalf("salted usage %+v", c.Usage)
	}
	var chat openai.ChatCompletion
	s.postOK(t, "/v1/chat/completions", map[string]any{"messages": []tokenize.Message{msg("user", "hello")}, "max_completion_tokens": 3}, &chat)
	if chat.Usage.CompletionTokens != 3 || chat.Choices[0].Message.Role != "assistant" {
		t.Fatalf("chat %+v", chat)
	}
	code, models := s.get(t, "/v1/models")
	var ml openai.ModelList
	if err := json.Unmarshal([]byte(models), &ml); err != nil || code != 200 || ml.Object != "list" || len(ml.Data) != 1 ||
		ml.Data[0].ID != "llama3-8b" || ml.Data[0].Object != "model" {
		t.Fatalf("models %d %s %v", code, models, err)
	}
	if code, body := s.get(t, "/health"); code != 200 || body != "" {
		t.Fatalf("health %d %q", code, body)
	}
}

func TestTokenize(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--max-model-len", "4096")
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenize.Message{msg("system", "You are terse."), msg("user", "Hello <|im_start|> world ✓")}
	for _, addGen := range []bool{true, false} {
		var tr openai.TokenizeResponse
		s.postOK(t, "/tokenize", map[string]any{"messages": msgs, "add_generation_prompt": addGen}, &tr)
		want, _ := tmpl.RenderChat(msgs, addGen)
		if !slices.Equal(tr.Tokens, want) || tr.Count != len(want) || tr.MaxModelLen != 4096 {
			t.Fatalf("add_generation_prompt=%v: got %+v, want %v", addGen, tr, want)
		}
	}
	var tr openai.TokenizeResponse
	s.postOK(t, "/tokenize", map[string]any{"prompt": "Hello world"}, &tr)
	if want := tmpl.RenderCompletion("Hello world"); !slices.Equal(tr.Tokens, want) {
		t.Fatalf("prompt: got %v, want %v", tr.Tokens, want)
	}
}

func TestMetrics(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--model", "m1")
	_, body := s.get(t, "/metrics")
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
		"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
	} {
		if !strings.Contains(body, name+`{engine="0",`) || !strings.Contains(body, `model_name="m1"`) {
			t.Errorf("metric %s with labels missing", name)
		}
	}
	if v, _ := metricValue(body, "vllm:prefix_cache_queries_total"); v != 0 {
		t.Fatalf("queries before any request: %v", v)
	}
	for range 2 {
		s.postOK(t, "/v1/completions", map[string]any{"model": "m1", "prompt": words(5, 100), "max_tokens": 4}, nil)
	}
	if v := s.metric(t, "vllm:prefix_cache_queries_total"); v < 200 {
		t.Errorf("prefix_cache_queries_total %v, want >= 200", v)
	}
	if v := s.metric(t, "vllm:prefix_cache_hits_total"); v < 96 {
		t.Errorf("prefix_cache_hits_total %v, want >= 96", v)
	}
	if v := s.metric(t, "vllm:time_to_first_token_seconds_count"); v != 2 {
		t.Errorf("ttft count %v, want 2", v)
	}
	if v := s.metric(t, "vllm:kv_cache_usage_perc"); v != 0 {
		t.Errorf("kv usage %v with nothing running", v)
	}
}

// TestFaults covers dropped events (a sequence gap), restart (sequence back
// to 0, empty cache, no AllBlocksCleared), reset_prefix_cache, slow_factor,
// fail_fraction and replay.
func TestFaults(t *testing.T) {
	sub, ep := newSub(t)
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", ep, "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--kv-events-form", "map", "--replay-layout", "new")
	s.syncEvents(t, sub)
	req := map[string]any{"prompt": words(7, 64), "max_tokens": 2}

	s.postOK(t, "/v1/completions", req, nil)
	before := drain(t, sub, 300*time.Millisecond)
	if len(before) == 0 {
		t.Fatal("no events")
	}
	lastSeq := before[len(before)-1].Seq

	// Drop everything, then publish one more batch: the subscriber sees a gap.
	s.postOK(t, "/admin/faults", map[string]any{"drop_event_fraction": 1.0}, nil)
	s.postOK(t, "/v1/completions", map[string]any{"prompt": words(8, 64), "max_tokens": 2}, nil)
	if got := drain(t, sub, 300*time.Millisecond); len(got) != 0 {
		t.Fatalf("received %d batches while dropping", len(got))
	}
	var f faults
	s.postOK(t, "/admin/faults", map[string]any{"drop_event_fraction": 0.0}, &f)
	if f.DropEventFraction != 0 || f.SlowFactor != 1 {
		t.Fatalf("faults %+v", f)
	}
	s.postOK(t, "/reset_prefix_cache", "", nil)
	m, ok := recv(t, sub, 2*time.Second)
	if !ok {
		t.Fatal("no batch after the drop")
	}
	if m.Seq <= lastSeq+1 {
		t.Fatalf("seq %d after %d: no gap", m.Seq, lastSeq)
	}
	if evs := decode(t, m).Events; len(evs) != 1 || evs[0].EventType() != kvevents.TypeAllBlocksCleared {
		t.Fatalf("reset batch %v", evs)
	}
	t.Logf("gap: %d -> %d", lastSeq, m.Seq)

	// Replay serves what was kept (dropped batches are not kept).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	replayed, err := kvevents.Replay(ctx, "tcp://"+s.srv.ReplayAddr(), 0)
	cancel()
	if err != nil || len(replayed) == 0 || replayed[len(replayed)-1].Seq != m.Seq {
		t.Fatalf("replay: %d msgs, err %v", len(replayed), err)
	}

	// Restart: the cache is empty and the sequence restarts at 0 with a
	// BlockStored batch, not AllBlocksCleared.
	var c openai.Completion
	s.postOK(t, "/v1/completions", req, &c)
	if c.Usage.PromptTokensDetails.CachedTokens != 0 { // the reset above emptied the cache
		t.Fatalf("cached %d after reset", c.Usage.PromptTokensDetails.CachedTokens)
	}
	s.postOK(t, "/v1/completions", req, &c)
	if c.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("no hit before restart")
	}
	drain(t, sub, 300*time.Millisecond)
	s.postOK(t, "/admin/restart", "", nil)
	if got := drain(t, sub, 300*time.Millisecond); len(got) != 0 {
		t.Fatalf("restart published %d batches", len(got))
	}
	s.postOK(t, "/v1/completions", req, &c)
	if c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cached %d after restart", c.Usage.PromptTokensDetails.CachedTokens)
	}
	after := drain(t, sub, 300*time.Millisecond)
	if len(after) == 0 || after[0].Seq != 0 {
		t.Fatalf("after restart: %d batches, first seq %v", len(after), after)
	}
	if evs := decode(t, after[0]).Events; len(evs) == 0 || evs[0].EventType() != kvevents.TypeBlockStored {
		t.Fatalf("first batch after restart: %v", evs)
	}

	// fail_fraction 1: every completion is a 500.
	s.postOK(t, "/admin/faults", map[string]any{"fail_fraction": 1}, nil)
	if code, body := s.post(t, "/v1/completions", req); code != 500 || !strings.Contains(string(body), `"code":500`) {
		t.Fatalf("fail_fraction: %d %s", code, body)
	}
	s.postOK(t, "/admin/faults", map[string]any{"fail_fraction": 0}, nil)
	if code, body := s.post(t, "/admin/faults", map[string]any{"loss_fraction": 2}); code != 400 {
		t.Fatalf("bad fault: %d %s", code, body)
	}
}

// TestSlowFactor checks that slow_factor stretches the latency a client sees.
func TestSlowFactor(t *testing.T) {
	s := startSim(t, "--time-scale", "1")
	req := map[string]any{"prompt": "hello", "max_tokens": 20, "stream": true}
	timeIt := func() time.Duration {
		start := time.Now()
		if code, body := s.post(t, "/v1/completions", req); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		return time.Since(start)
	}
	base := timeIt()
	s.postOK(t, "/admin/faults", map[string]any{"slow_factor": 4}, nil)
	slow := timeIt()
	t.Logf("base %v, slow_factor 4: %v", base, slow)
	if slow < 2*base {
		t.Fatalf("slow_factor 4: %v vs %v", slow, base)
	}
}

func TestBadRequests(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--max-model-len", "1000", "--max-body-bytes", "4096")
	cases := []struct {
		name, path, body string
		code             int
	}{
		{"invalid json", "/v1/chat/completions", `{"messages":[`, 400},
		{"messages wrong type", "/v1/chat/completions", `{"messages":"hi"}`, 400},
		{"no messages", "/v1/chat/completions", `{"model":"llama3-8b"}`, 400},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, 400},
		{"image content", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400},
		{"max_tokens 0", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400},
		{"negative max_tokens", "/v1/completions", `{"prompt":"x","max_tokens":-3}`, 400},
		{"n=2", "/v1/completions", `{"prompt":"x","n":2}`, 400},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, 400},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400},
		{"object prompt", "/v1/completions", `{"prompt":{"a":1}}`, 400},
		{"batch prompt", "/v1/completions", `{"prompt":["a","b"]}`, 400},
		{"negative token", "/v1/completions", `{"prompt":[1,-2]}`, 400},
		{"fractional token", "/v1/completions", `{"prompt":[1.5]}`, 400},
		{"token out of vocab", "/v1/completions", `{"prompt":[1,999999]}`, 400},
		{"too long", "/v1/completions", `{"prompt":[1,2,3],"max_tokens":999}`, 400},
		{"stream_options without stream", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400},
		{"trailing data", "/v1/completions", `{"prompt":"x"} {}`, 400},
		{"body too large", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 5000) + `"}`, 413},
		{"wrong model", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"x"}]}`, 404},
		{"wrong model completions", "/v1/completions", `{"model":"gpt-4","prompt":"x"}`, 404},
		{"tokenize nothing", "/tokenize", `{}`, 400},
		{"tokenize wrong model", "/tokenize", `{"model":"other","prompt":"x"}`, 404},
		{"unknown path", "/v2/whatever", `{}`, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := s.post(t, c.path, c.body)
			var e openai.Error
			if err := json.Unmarshal(body, &e); err != nil || code != c.code || e.Error.Code != c.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("status %d body %s (err %v), want %d", code, body, err, c.code)
			}
		})
	}
	if code, _ := s.get(t, "/v1/chat/completions"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET chat: %d", code)
	}
	// Token-array prompts in the one-element batch form are accepted.
	s.postOK(t, "/v1/completions", `{"prompt":[[5,6,7]],"max_tokens":1}`, nil)
}

// TestClientDisconnect checks that a client going away aborts its request.
func TestClientDisconnect(t *testing.T) {
	s := startSim(t, "--time-scale", "1")
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := fmt.Sprintf(`{"prompt":"a long story","max_tokens":5000,"stream":%v}`, stream)
			hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/v1/completions", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(hreq)
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				errc <- err
			}()
			testkit.Eventually(t, 5*time.Second, "vllm:num_requests_running == 1", func() (bool, string) { return s.metric(t, "vllm:num_requests_running") == 1, "" })
			if code, body := s.post(t, "/reset_prefix_cache", ""); code != http.StatusConflict {
				t.Errorf("reset while running: %d %s", code, body)
			}
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("request finished normally")
			}
			testkit.Eventually(t, 5*time.Second, "vllm:num_requests_running == 0", func() (bool, string) { return s.metric(t, "vllm:num_requests_running") == 0, "" })
		})
	}
}

func TestConfig(t *testing.T) {
	env := map[string]string{"KVDIR_ENGINESIM_KV_BLOCKS": "123", "KVDIR_ENGINESIM_MODEL": "from-env"}
	cfg, err := parseConfig([]string{"--model", "from-flag"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.kvBlocks != 123 || cfg.model != "from-flag" || cfg.addr != "127.0.0.1:8000" {
		t.Fatalf("cfg %+v err %v", cfg, err)
	}
	env["KVDIR_ENGINESIM_TIME_SCALE"] = "fast"
	if _, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Fatal("bad env accepted")
	}
	for _, args := range [][]string{
		{"--profile", "nope"}, {"--kv-events-form", "xml", "--kv-events-endpoint", "tcp://*:0"},
		{"--replay-layout", "mid", "--kv-events-endpoint", "tcp://*:0"}, {"--time-scale", "-1"}, {"extra"},
		{"--kv-blocks", "0"}, {"--addr", "256.0.0.1:1"},
	} {
		err := run(context.Background(), args, func(string) string { return "" }, io.Discard, nil)
		if err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
