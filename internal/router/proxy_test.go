package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
)

// TestStreamingPassthrough checks that an event stream reaches the client
// byte for byte and that each event is flushed as it arrives: the upstream
// sends the second event only after the client has read the first.
func TestStreamingPassthrough(t *testing.T) {
	gotFirst := make(chan struct{})
	events := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"llo\\u00e9 \"}}]}\n\n",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":7}}}\n\n",
		"data: [DONE]\n\n",
	}
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Engine", "sim")
		f := w.(http.Flusher)
		for i, e := range events {
			_, _ = io.WriteString(w, e)
			f.Flush()
			if i == 0 {
				select {
				case <-gotFirst:
				case <-time.After(10 * time.Second):
					return // the router buffered the first event: the test fails below
				}
			}
		}
	})
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)

	resp, err := http.Post(url+PathChat, "application/json", strings.NewReader(strings.Replace(chatBody, `"max_tokens":4`, `"stream":true`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("X-Engine") != "sim" || resp.Header.Get(HeaderWorker) != "w0" || resp.Header.Get(HeaderPolicy) != "round-robin" {
		t.Fatalf("headers: %v", resp.Header)
	}
	first := make([]byte, len(events[0]))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("reading the first event before the upstream sent the second: %v", err)
	}
	close(gotFirst)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(first)+string(rest), strings.Join(events, ""); got != want {
		t.Fatalf("stream differs:\n got %q\nwant %q", got, want)
	}
	testkit.Eventually(t, 5*time.Second, "engine-reported cached tokens counted", func() (bool, string) {
		return counterValue(t, s, "kvdir_router_engine_cached_tokens_total", "w0") == 7, ""
	})
}

// TestCancellationReachesEngine checks that a client that goes away
// mid-stream cancels the upstream request.
func TestCancellationReachesEngine(t *testing.T) {
	cancelled := make(chan struct{})
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(20 * time.Second):
		}
	})
	_, url := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+PathChat, strings.NewReader(chatBody))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's request was not cancelled after the client went away")
	}
}

// TestRetryBeforeFirstByte checks that a worker refusing connections, or
// closing one before answering, does not fail the request: it is placed on
// another worker.
func TestRetryBeforeFirstByte(t *testing.T) {
	hangUp := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	good := newUpstream(t, "m", okJSON(0))
	workers := []StaticWorker{
		{ID: "a-dead", Address: deadAddress(t), Model: "m"},
		{ID: "b-hangup", Address: hangUp.URL, Model: "m"},
		{ID: "c-good", Address: good.URL, Model: "m"},
	}
	s, url := testRouter(t, "round-robin", workers, func(c *Config) { c.ScrapeInterval = time.Hour })
	for i := range 6 {
		resp, body := post(t, url+PathChat, chatBody)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderWorker) != "c-good" {
			t.Fatalf("request %d: %d from %q: %s", i, resp.StatusCode, resp.Header.Get(HeaderWorker), body)
		}
	}
	if got := good.hits.Load(); got != 6 {
		t.Fatalf("good worker served %d requests, want 6", got)
	}
	if got := counterValue(t, s, "kvdir_router_retries_total", "connection-refused"); got < 1 {
		t.Fatalf("connection-refused retries = %v, want >= 1", got)
	}
	if got := counterValue(t, s, "kvdir_router_retries_total", "transport-error"); got < 1 {
		t.Fatalf("transport-error retries = %v, want >= 1", got)
	}
}

// TestAllWorkersFailing checks the error a client gets when no worker can
// answer: an OpenAI-style 502 after MaxAttempts workers.
func TestAllWorkersFailing(t *testing.T) {
	workers := []StaticWorker{{ID: "a", Address: deadAddress(t), Model: "m"}, {ID: "b", Address: deadAddress(t), Model: "m"}}
	s, err := New(Config{Policy: mustPolicy(t, "round-robin"), Renderer: mustRenderer(t), Static: workers, ScrapeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s.pool.replace([]workerSpec{{ID: "a", Address: workers[0].Address, Model: "m"}, {ID: "b", Address: workers[1].Address, Model: "m"}})
	s.groups[0].synced.Store(true)
	rec := &bodyRecorder{hdr: http.Header{}}
	req, _ := http.NewRequest(http.MethodPost, PathChat, strings.NewReader(chatBody))
	s.Handler().ServeHTTP(rec, req)
	if rec.code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", rec.code, rec.body.String())
	}
	var e openai.Error
	if err := json.Unmarshal(rec.body.Bytes(), &e); err != nil || e.Error.Code != 502 || !strings.Contains(e.Error.Message, "failed before responding") {
		t.Fatalf("error body %q (%v)", rec.body.String(), err)
	}
}

// TestErrorAfterFirstByte checks that once response bytes reached the
// client, a broken upstream is not retried elsewhere: the client sees what
// the engine sent, then the end of the stream.
func TestErrorAfterFirstByte(t *testing.T) {
	broken := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"partial\":true}\n\n")
		w.(http.Flusher).Flush()
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = buf.Flush()
			conn.Close()
		}
	})
	other := newUpstream(t, "m", okJSON(0))
	_, url := testRouter(t, "prefix", []StaticWorker{{ID: "a", Address: broken.URL, Model: "m"}}, nil)
	resp, err := http.Post(url+PathChat, "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(b), "data: {\"partial\":true}") {
		t.Fatalf("client got %q, want the engine's partial stream", b)
	}
	if other.hits.Load() != 0 {
		t.Fatal("request was retried after its first byte")
	}
}

// TestUpstreamErrorsPassThrough checks that an engine's own error response
// reaches the client unchanged, without a retry.
func TestUpstreamErrorsPassThrough(t *testing.T) {
	const body = `{"error":{"message":"This model's maximum context length is 10 tokens.","type":"BadRequestError","code":400}}`
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, body)
	})
	_, url := testRouter(t, "least-load", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, nil)
	resp, got := post(t, url+PathChat, chatBody)
	if resp.StatusCode != http.StatusBadRequest || got != body || up.hits.Load() != 1 {
		t.Fatalf("got %d %q after %d upstream hits", resp.StatusCode, got, up.hits.Load())
	}
}

// TestBadRequests checks the router's own errors: OpenAI-style bodies with
// 4xx codes, and nothing sent upstream.
func TestBadRequests(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	_, url := testRouter(t, "kvdir", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, func(c *Config) { c.MaxBodyBytes = 4096 })
	cases := []struct {
		name, path, body string
		code             int
		msg              string
	}{
		{"malformed JSON", PathChat, `{"model":"m","messages":[`, 400, "malformed JSON"},
		{"not an object", PathChat, `[1,2]`, 400, "malformed JSON"},
		{"empty body", PathChat, ``, 400, "empty"},
		{"no messages", PathChat, `{"model":"m"}`, 400, "messages must be"},
		{"no model", PathChat, `{"messages":[{"role":"user","content":"x"}]}`, 400, "model is required"},
		{"bad role", PathChat, `{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, 400, "render"},
		{"wrong type", PathChat, `{"model":"m","messages":"hi"}`, 400, "messages"},
		{"no prompt", PathCompletions, `{"model":"m"}`, 400, "prompt is required"},
		{"batched prompt", PathCompletions, `{"model":"m","prompt":["a","b"]}`, 400, "malformed"},
		{"unknown model", PathChat, `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "does not exist"},
		{"too large", PathChat, `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, 413, "larger than"},
		{"unknown path", "/v1/embeddings", `{}`, 404, "no route"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, url+c.path, c.body)
			var e openai.Error
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("body %q is not an OpenAI error: %v", body, err)
			}
			if resp.StatusCode != c.code || e.Error.Code != c.code || !strings.Contains(e.Error.Message, c.msg) {
				t.Fatalf("got %d %+v, want %d with %q", resp.StatusCode, e.Error, c.code, c.msg)
			}
		})
	}
	if up.hits.Load() != 0 {
		t.Fatalf("%d bad requests reached the engine", up.hits.Load())
	}
}

// TestClientCannotChooseUpstream sends requests that try to steer the proxy
// (absolute-form targets, Host headers, forwarding headers, dot segments):
// every one reaches only the registered worker, on the fixed path.
func TestClientCannotChooseUpstream(t *testing.T) {
	victim := newUpstream(t, "m", okJSON(0))
	worker := newUpstream(t, "m", okJSON(0))
	_, url := testRouter(t, "round-robin", []StaticWorker{{ID: "a", Address: worker.URL, Model: "m"}}, nil)
	victimHost := strings.TrimPrefix(victim.URL, "http://")
	routerHost := strings.TrimPrefix(url, "http://")
	raw := []string{
		"POST " + victim.URL + PathChat + " HTTP/1.1\r\nHost: " + victimHost + "\r\n",
		"POST " + PathChat + " HTTP/1.1\r\nHost: " + victimHost + "\r\nX-Forwarded-Host: " + victimHost + "\r\n",
		"POST /v1/../v1/chat/completions HTTP/1.1\r\nHost: " + routerHost + "\r\n",
		"POST " + PathChat + "?upstream=" + victim.URL + " HTTP/1.1\r\nHost: " + routerHost + "\r\nX-Kvdir-Worker: " + victim.URL + "\r\n",
	}
	for i, head := range raw {
		conn, err := net.Dial("tcp", routerHost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", head, len(chatBody), chatBody)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	if victim.hits.Load() != 0 {
		t.Fatalf("a client steered %d requests to an address it chose", victim.hits.Load())
	}
	if h := worker.lastHost.Load(); h == nil || *h != strings.TrimPrefix(worker.URL, "http://") {
		t.Fatalf("the worker saw Host %v, want its own address", h)
	}
}

// TestModelsUnion checks /v1/models lists every worker's model once.
func TestModelsUnion(t *testing.T) {
	a, b, c := newUpstream(t, "m1", okJSON(0)), newUpstream(t, "m2", okJSON(0)), newUpstream(t, "m1", okJSON(0))
	// c's model is learned from its metrics.
	_, url := testRouter(t, "kvdir", []StaticWorker{{ID: "a", Address: a.URL, Model: "m1"}, {ID: "b", Address: b.URL, Model: "m2"}, {ID: "c", Address: c.URL}}, nil)
	var ids []string
	for _, m := range routerModels(t, url).Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "m1,m2" {
		t.Fatalf("models %v, want [m1 m2]", ids)
	}
	// A request for m2 goes to b only.
	for range 3 {
		resp, body := post(t, url+PathChat, strings.Replace(chatBody, `"model":"m"`, `"model":"m2"`, 1))
		if resp.StatusCode != 200 || resp.Header.Get(HeaderWorker) != "b" {
			t.Fatalf("m2 request went to %q (%d): %s", resp.Header.Get(HeaderWorker), resp.StatusCode, body)
		}
	}
}

// TestNoDirectoryFallback checks that a directory-based policy without a
// directory places by session-hash and says so: the same session goes to
// the same worker.
func TestNoDirectoryFallback(t *testing.T) {
	a, b := newUpstream(t, "m", okJSON(0)), newUpstream(t, "m", okJSON(0))
	s, url := testRouter(t, "kvdir", []StaticWorker{{ID: "a", Address: a.URL, Model: "m"}, {ID: "b", Address: b.URL, Model: "m"}}, nil)
	var first string
	for i := range 5 {
		resp, _ := post(t, url+PathChat, chatBody, "X-Session-Id", "sess-1")
		if resp.Header.Get(HeaderFallback) != FallbackNoDirectory || resp.Header.Get(HeaderPolicy) != "session-hash" {
			t.Fatalf("headers %v", resp.Header)
		}
		if i == 0 {
			first = resp.Header.Get(HeaderWorker)
		} else if resp.Header.Get(HeaderWorker) != first {
			t.Fatalf("session moved from %s to %s", first, resp.Header.Get(HeaderWorker))
		}
	}
	if got := counterValue(t, s, "kvdir_router_fallbacks_total", FallbackNoDirectory); got != 5 {
		t.Fatalf("fallbacks = %v, want 5", got)
	}
}

// bodyRecorder is a minimal ResponseWriter for handler-level tests.
type bodyRecorder struct {
	hdr  http.Header
	code int
	body bytes.Buffer
}

func (r *bodyRecorder) Header() http.Header         { return r.hdr }
func (r *bodyRecorder) WriteHeader(c int)           { r.code = c }
func (r *bodyRecorder) Write(p []byte) (int, error) { return r.body.Write(p) }
