package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
)

func bodiesReading(t *testing.T, s *Server) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.bodiesReading.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestSlowBodiesBoundedAndTimedOut opens connections that announce the
// largest body the router takes and then stall or trickle: what the router
// holds for them stays small (it does not reserve from Content-Length), and
// each is answered 408 and closed once the body timeout passes.
func TestSlowBodiesBoundedAndTimedOut(t *testing.T) {
	const (
		conns   = 20
		limit   = 8 << 20
		timeout = time.Second
		// What the router may hold for all the connections together: a
		// few hundred KiB each at most (buffers, goroutines).
		heapBound = 16 << 20
	)
	up := newUpstream(t, "m", okJSON(0))
	s, url := testRouter(t, "least-load", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, func(c *Config) {
		c.MaxBodyBytes, c.BodyTimeout = limit, timeout
	})
	addr := strings.TrimPrefix(url, "http://")
	base := heapAfterGC()

	var wg sync.WaitGroup
	stop := make(chan struct{})
	defer func() { close(stop); wg.Wait() }()
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":", PathChat, limit); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 { // trickle a byte every 100 ms
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
		}
	}
	began := time.Now()
	testkit.Eventually(t, 5*time.Second, "every body being read", func() (bool, string) {
		n := bodiesReading(t, s)
		return n == conns, fmt.Sprintf("%v bodies being read", n)
	})
	if held := int64(heapAfterGC()) - int64(base); held > heapBound {
		t.Fatalf("%d stalled connections hold %d bytes of heap, want under %d", conns, held, heapBound)
	}
	for i, c := range cs {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("connection %d: no response after the body timeout: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "body timeout") {
			t.Fatalf("connection %d: got %d %s, want 408 naming the body timeout", i, resp.StatusCode, body)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("connection %d: still open after the 408 (read: %v)", i, err)
		}
	}
	if el := time.Since(began); el < timeout/2 {
		t.Fatalf("answered after %v, before the body timeout %v", el, timeout)
	}
	testkit.Eventually(t, 5*time.Second, "no body being read", func() (bool, string) {
		n := bodiesReading(t, s)
		return n == 0, fmt.Sprintf("%v bodies being read", n)
	})
}

// TestPromptSizeBounds checks that prompts past --max-prompt-bytes or
// --max-prompt-tokens are refused with 400 naming the flag, from the proxy
// and explain paths alike, and that nothing reaches the engine; and that
// with the defaults a body of spaces within the body limit (the slowest
// text to tokenize) is refused instead of tokenized.
func TestPromptSizeBounds(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	_, url := testRouter(t, "least-load", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, func(c *Config) {
		c.MaxPromptBytes, c.MaxPromptTokens, c.Explain = 1000, 200, ExplainOpen
	})
	chat := func(text string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	}
	cases := []struct {
		name, path, body, msg string
	}{
		{"chat text", PathChat, chat(strings.Repeat("x", 1000)), "--max-prompt-bytes"},
		{"chat parts", PathChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x", 600) + `"},{"type":"text","text":"` + strings.Repeat("y", 600) + `"}]}]}`, "--max-prompt-bytes"},
		{"completion text", PathCompletions, `{"model":"m","prompt":"` + strings.Repeat("x", 1001) + `"}`, "--max-prompt-bytes"},
		{"token ids", PathCompletions, `{"model":"m","prompt":[` + strings.Repeat("1,", 200) + `1]}`, "--max-prompt-tokens"},
		{"rendered tokens", PathCompletions, `{"model":"m","prompt":"` + strings.Repeat("7", 900) + `"}`, "renders to"},
		{"explain", PathExplain, chat(strings.Repeat("x", 1000)), "--max-prompt-bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, url+c.path, c.body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, c.msg) {
				t.Fatalf("got %d %s, want 400 naming %s", resp.StatusCode, body, c.msg)
			}
		})
	}
	if resp, body := post(t, url+PathChat, chat(strings.Repeat("x", 900))); resp.StatusCode != http.StatusOK {
		t.Fatalf("a prompt within the bounds: %d %s", resp.StatusCode, body)
	}
	if n := up.hits.Load(); n != 1 {
		t.Fatalf("the engine saw %d requests, want only the one within the bounds", n)
	}

	_, defURL := testRouter(t, "least-load", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, nil)
	resp, body := post(t, defURL+PathCompletions, `{"model":"m","prompt":"`+strings.Repeat(" ", 3<<20)+`"}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "--max-prompt-bytes") {
		t.Fatalf("3 MiB of spaces with the defaults: got %d %s, want 400", resp.StatusCode, body)
	}
}

// TestRefusedDirectoryTripsBreaker points the router at directory
// addresses that refuse connections: the look-ups fail as errors, not
// timeouts, so the breaker trips after breakerFailures requests and the
// next ones are placed at once without asking; and with workers to be
// discovered from that directory, the 503 names the directory, not the
// agents.
func TestRefusedDirectoryTripsBreaker(t *testing.T) {
	dead := []string{strings.TrimPrefix(deadAddress(t), "http://"), strings.TrimPrefix(deadAddress(t), "http://")}
	dc, err := dirclient.New(dirclient.Config{Addrs: dead, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	const matchTimeout = 200 * time.Millisecond
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dc, MatchTimeout: matchTimeout,
		Static: []StaticWorker{{ID: "a", Address: "http://127.0.0.1:1", Model: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.pool.replace([]workerSpec{{ID: "a", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16}})
	req := longChat(t)
	for i := range breakerFailures {
		d, aerr := s.decide(t.Context(), req, nil)
		if aerr != nil || d.fallback != FallbackError {
			t.Fatalf("look-up %d at refusing nodes: fallback %q (%v), want %q", i, d.fallback, aerr, FallbackError)
		}
	}
	start := time.Now()
	d, aerr := s.decide(t.Context(), req, nil)
	if aerr != nil || d.fallback != FallbackDown {
		t.Fatalf("after %d refused look-ups: fallback %q (%v), want %q", breakerFailures, d.fallback, aerr, FallbackDown)
	}
	if el := time.Since(start); el >= matchTimeout {
		t.Fatalf("a request with the breaker open took %v, the match timeout is %v", el, matchTimeout)
	}

	// Discovery from the same directory: nothing is known, and the answer
	// says the directory has not been reached.
	s2, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dc})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s2.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hs := httptest.NewServer(s2.Handler())
	t.Cleanup(hs.Close)
	testkit.Eventually(t, 5*time.Second, "a 503 naming the unreachable directory", func() (bool, string) {
		resp, body := post(t, hs.URL+PathChat, chatBody)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "not been loaded from the directory") &&
			strings.Contains(body, "last attempt") && !strings.Contains(body, "agents"), fmt.Sprintf("%d %s", resp.StatusCode, body)
	})
}

// TestExplainModes checks who sees the predicted cached tokens: with
// --explain token (given, or the default when a token is set) only requests
// carrying the operator's token reach the explain endpoint or get the
// predicted header, and the token never reaches the engine; with off (given,
// or the default without a token) nobody does; with open everyone does.
func TestExplainModes(t *testing.T) {
	var leaked atomic.Bool
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderExplainToken) != "" {
			leaked.Store(true)
		}
		okJSON(0)(w, r)
	})
	workers := []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}
	for _, mode := range []string{ExplainToken, ""} {
		_, url := testRouter(t, "least-load", workers, func(c *Config) { c.Explain, c.ExplainToken = mode, "s3cret" })
		for _, c := range []struct {
			name, token string
			code        int
		}{{"no token", "", 403}, {"wrong token", "guess", 403}, {"token", "s3cret", 200}} {
			resp, body := post(t, url+PathExplain, chatBody, HeaderExplainToken, c.token)
			if resp.StatusCode != c.code || (c.code == 403 && !strings.Contains(body, HeaderExplainToken)) {
				t.Fatalf("explain %q with %s: %d %s, want %d", mode, c.name, resp.StatusCode, body, c.code)
			}
			resp, body = post(t, url+PathChat, chatBody, HeaderExplainToken, c.token)
			_, has := resp.Header[http.CanonicalHeaderKey(HeaderPredicted)]
			if resp.StatusCode != 200 || resp.Header.Get(HeaderWorker) != "a" || has != (c.code == 200) {
				t.Fatalf("explain %q: chat with %s: %d %s, predicted header present %v", mode, c.name, resp.StatusCode, body, has)
			}
		}
	}
	if leaked.Load() {
		t.Fatalf("the engine received %s", HeaderExplainToken)
	}

	_, openURL := testRouter(t, "least-load", workers, func(c *Config) { c.Explain = ExplainOpen })
	if resp, body := post(t, openURL+PathExplain, chatBody); resp.StatusCode != 200 {
		t.Fatalf("explain open: %d %s", resp.StatusCode, body)
	}
	if resp, _ := post(t, openURL+PathChat, chatBody); resp.Header.Get(HeaderPredicted) == "" {
		t.Fatal("explain open: no predicted header")
	}
	for _, mode := range []string{ExplainOff, ""} {
		_, offURL := testRouter(t, "least-load", workers, func(c *Config) { c.Explain = mode })
		if resp, body := post(t, offURL+PathExplain, chatBody, HeaderExplainToken, "s3cret"); resp.StatusCode != 403 || !strings.Contains(body, "off") {
			t.Fatalf("explain %q: %d %s", mode, resp.StatusCode, body)
		}
		if resp, _ := post(t, offURL+PathChat, chatBody); resp.Header.Get(HeaderPredicted) != "" {
			t.Fatalf("explain %q: predicted header %q", mode, resp.Header.Get(HeaderPredicted))
		}
	}
	if _, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Static: workers, Explain: ExplainToken}); err == nil ||
		!strings.Contains(err.Error(), "needs the token") {
		t.Fatalf("token mode without a token: %v", err)
	}
}
