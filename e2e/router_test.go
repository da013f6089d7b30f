package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// chatRequest is a minimal chat completion request.
type chatRequest struct {
	Model     string    `json:"model"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	// CacheSalt is the body's cache_salt, as vLLM and SGLang accept it
	// (and the router reads it into the hashing namespace).
	CacheSalt string `json:"cache_salt,omitempty"`
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// answer is what a test reads of a response.
type answer struct {
	status    int
	worker    string
	predicted string
	fallback  string
	prompt    int
	cached    int
	content   string
	body      string
}

func send(ctx context.Context, url, session string, c chatRequest) (answer, error) {
	return sendWith(ctx, url, session, c, nil)
}

// sendWith is send with extra request headers.
func sendWith(ctx context.Context, url, session string, c chatRequest, header map[string]string) (answer, error) {
	b, _ := json.Marshal(c)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+router.PathChat, strings.NewReader(string(b)))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, worker: resp.Header.Get(router.HeaderWorker), body: string(body),
		predicted: resp.Header.Get(router.HeaderPredicted), fallback: resp.Header.Get(router.HeaderFallback)}
	if resp.StatusCode == 200 {
		var err error
		if a.prompt, a.cached, a.content, err = decodeChat(body); err != nil {
			return a, err
		}
	}
	return a, nil
}

// decodeChat reads a chat completion's prompt and cached token counts and
// its first choice's content.
func decodeChat(body []byte) (prompt, cached int, content string, err error) {
	var out struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return 0, 0, "", fmt.Errorf("decode %q: %w", body, err)
	}
	if len(out.Choices) > 0 {
		content = out.Choices[0].Message.Content
	}
	return out.Usage.Prompt, out.Usage.Details.Cached, content, nil
}

// systemPrompt returns a distinct system prompt of a few hundred tokens.
func systemPrompt(i int) string {
	return fmt.Sprintf("Tenant %d. ", i) + strings.Repeat(fmt.Sprintf("You are assistant number %d of the serving team; answer briefly and cite the runbook. ", i), 12)
}

// TestEndToEnd runs real processes: a 3-node directory, three engine
// simulators with their agents, and two routers sharing the directory.
func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 3, Routers: 2,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "50ms", "--down-for", "1s", "--share-intents=false"}})
	r0, r1 := f.Routers[0].URL, f.Routers[1].URL

	// Turn 2 of each session lands on turn 1's worker and the engine reports
	// the cached prefix. Turn 1 goes through router 0, turn 2 through router
	// 1, which never saw the session: it must learn where the prefix lives
	// from the directory.
	t.Run("turn 2 follows turn 1 through the directory", func(t *testing.T) {
		workers := map[string]bool{}
		for i := range 6 {
			a1, _ := turnTwoFollowsTurnOne(t, ctx, r0, r1, fmt.Sprintf("session-%d", i), i, turnCheck{})
			workers[a1.worker] = true
		}
		if len(workers) < 2 {
			t.Errorf("6 idle-cluster sessions all went to %v: load is not spread", workers)
		}
	})

	// Kill one engine while requests run: every request still succeeds
	// (non-streamed, so nothing reached a client before the engine died).
	t.Run("worker killed mid-run", func(t *testing.T) {
		var mu sync.Mutex
		var failures []string
		counts := map[string]int{}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					sess := fmt.Sprintf("load-%d-%d", g, n%5)
					a, err := send(ctx, r0, sess, chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
						{Role: "system", Content: systemPrompt(100 + n%5)}, {Role: "user", Content: fmt.Sprintf("q %d", n)}}})
					mu.Lock()
					if err != nil || a.status != 200 {
						failures = append(failures, fmt.Sprintf("%v %d %s", err, a.status, a.body))
					} else {
						counts[a.worker]++
					}
					mu.Unlock()
				}
			}()
		}
		// The victim is the busiest worker once the load has settled (the
		// kvdir policy keeps each prefix where it first landed, so which
		// workers are busy depends on the first placements).
		var victim *fleet.Engine
		testkit.Eventually(t, 30*time.Second, "20 requests served", func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			n, best := 0, 0
			for _, e := range f.Engines {
				n += counts[e.WorkerID]
				if c := counts[e.WorkerID]; c > best {
					best, victim = c, e
				}
			}
			return n >= 20, ""
		})
		victim.Sim.Kill9()
		mu.Lock()
		before := counts[victim.WorkerID]
		total := 0
		for _, c := range counts {
			total += c
		}
		mu.Unlock()
		testkit.Eventually(t, 30*time.Second, "40 more requests after the kill", func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, c := range counts {
				n += c
			}
			return n >= total+40, ""
		})
		close(stop)
		wg.Wait()
		if len(failures) > 0 {
			t.Fatalf("%d requests failed after a worker was killed, first: %s", len(failures), failures[0])
		}
		if counts[victim.WorkerID] != before {
			t.Fatalf("the killed worker answered %d requests after its death", counts[victim.WorkerID]-before)
		}
		if err := victim.Sim.Start(); err != nil {
			t.Fatal(err)
		}
	})

	// Kill every directory node: requests are still served, placed by the
	// fallback policy.
	t.Run("directory killed", func(t *testing.T) {
		for _, n := range f.Directory.Nodes {
			n.Kill9()
		}
		for i := range 20 {
			a, err := send(ctx, r0, fmt.Sprintf("nodir-%d", i%4), chatRequest{Model: "llama3-8b", MaxTokens: 4,
				Messages: []message{{Role: "system", Content: systemPrompt(200 + i%4)}, {Role: "user", Content: fmt.Sprintf("hello %d", i)}}})
			if err != nil || a.status != 200 {
				t.Fatalf("request %d with the directory down: %v %+v", i, err, a)
			}
			if a.fallback == "" {
				t.Fatalf("request %d: no fallback reported with the directory down", i)
			}
		}
	})
}

// explainWith asks a router how it would place c, with extra request headers.
func explainWith(ctx context.Context, url, session string, c chatRequest, header map[string]string) (router.Explanation, error) {
	b, _ := json.Marshal(c)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+router.PathExplain, strings.NewReader(string(b)))
	req.Header.Set("X-Session-Id", session)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return router.Explanation{}, err
	}
	defer resp.Body.Close()
	var e router.Explanation
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		return e, fmt.Errorf("explain: %s: %s", resp.Status, body)
	}
	return e, json.NewDecoder(resp.Body).Decode(&e)
}
