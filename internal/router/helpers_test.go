package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// upstream is an engine stand-in for unit tests: a real HTTP server that
// exports vLLM's load gauges and answers completions with a handler the
// test chooses.
type upstream struct {
	*httptest.Server
	model    string
	hits     atomic.Int64 // completion requests received
	handler  http.HandlerFunc
	lastHost atomic.Pointer[string]
	adapters atomic.Pointer[[]string] // LoRA adapters its /v1/models lists, with model as parent
}

func newUpstream(t testing.TB, model string, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{model: model, handler: h}
	u.adapters.Store(&[]string{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=%q} 0\n", model)
		fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"0\",model_name=%q} 0\n", model)
		fmt.Fprintf(w, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=%q} 0.25\n", model)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","root":%q,"parent":null}`, model, model)
		for _, a := range *u.adapters.Load() {
			fmt.Fprintf(w, `,{"id":%q,"object":"model","root":"/adapters/%s","parent":%q}`, a, a, model)
		}
		fmt.Fprint(w, "]}")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		host := r.Host
		u.lastHost.Store(&host)
		u.handler(w, r)
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

// okJSON answers a non-streamed completion with usage.
func okJSON(cached int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":%d}}}`, cached)
	}
}

// testRouter starts a router over static workers and returns its URL.
func testRouter(t testing.TB, policy string, workers []StaticWorker, tweak func(*Config)) (*Server, string) {
	t.Helper()
	cfg := Config{Policy: mustPolicy(t, policy), Renderer: mustRenderer(t), Static: workers, ScrapeInterval: 20 * time.Millisecond, DownFor: time.Minute}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testkit.Eventually(t, 5*time.Second, "router ready", func() (bool, string) {
		resp, err := http.Get(hs.URL + "/readyz")
		if err != nil {
			return false, ""
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, ""
	})
	return s, hs.URL
}

// deadAddress returns the URL of a port nothing listens on.
func deadAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello there, tell me about prefix caches"}],"max_tokens":4}`

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes (log handlers).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
