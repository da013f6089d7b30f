package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// sim is a running enginesim.
type sim struct {
	srv  *server
	base string
}

// startSim runs the command with args (plus --addr 127.0.0.1:0) until the
// test ends.
func startSim(t *testing.T, args ...string) *sim {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *server, 1)
	errc := make(chan error, 1)
	args = append([]string{"--addr", "127.0.0.1:0", "--log-level", "warn"}, args...)
	go func() {
		errc <- run(ctx, args, func(string) string { return "" }, testWriter{t}, func(s *server) { ready <- s })
	}()
	var s *server
	select {
	case s = <-ready:
	case err := <-errc:
		cancel()
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("enginesim did not start")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("enginesim did not stop")
		}
	})
	return &sim{srv: s, base: "http://" + s.Addr()}
}

// testWriter sends the simulator's log to the test log.
type testWriter struct{ t *testing.T }

var logMu sync.Mutex

func (w testWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// post sends a JSON body and returns the status and body.
func (s *sim) post(t *testing.T, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	resp, err := http.Post(s.base+path, "application/json", rd)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", path, err)
	}
	return resp.StatusCode, data
}

// postOK posts and decodes a 200 answer into out.
func (s *sim) postOK(t *testing.T, path string, body, out any) {
	t.Helper()
	code, data := s.post(t, path, body)
	if code != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", path, code, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: decode %s: %v", path, data, err)
		}
	}
}

func (s *sim) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", path, err)
	}
	return resp.StatusCode, string(data)
}

// metric returns the value of the series whose line starts with name{...}.
func (s *sim) metric(t *testing.T, name string) float64 {
	t.Helper()
	_, body := s.get(t, "/metrics")
	v, err := metricValue(body, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func metricValue(body, name string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found in\n%s", name, body)
}

// newSub binds a SUB socket on a free loopback port; the simulator's PUB
// connects to the returned endpoint.
func newSub(t *testing.T) (*kvevents.Subscriber, string) {
	t.Helper()
	sub, err := kvevents.NewSubscriber(context.Background(), kvevents.SubscriberConfig{
		Endpoint: "tcp://127.0.0.1:0", Bind: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	port := sub.Addr().(*net.TCPAddr).Port
	return sub, "tcp://127.0.0.1:" + strconv.Itoa(port)
}

// recv returns the next message, or false after timeout.
func recv(t *testing.T, sub *kvevents.Subscriber, timeout time.Duration) (kvevents.Msg, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m, err := sub.Recv(ctx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return m, false
		}
		t.Fatalf("recv: %v", err)
	}
	return m, true
}

// drain returns the messages received until quiet passes without one.
func drain(t *testing.T, sub *kvevents.Subscriber, quiet time.Duration) []kvevents.Msg {
	t.Helper()
	var out []kvevents.Msg
	for {
		m, ok := recv(t, sub, quiet)
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

// syncEvents resets the prefix cache until the subscriber receives the
// AllBlocksCleared batch (the PUB connects in the background and drops
// messages until then), then drains the stragglers.
func (s *sim) syncEvents(t *testing.T, sub *kvevents.Subscriber) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.postOK(t, "/reset_prefix_cache", "", nil)
		if _, ok := recv(t, sub, 100*time.Millisecond); ok {
			drain(t, sub, 200*time.Millisecond)
			return
		}
	}
	t.Fatal("no KV events received")
}

// decode decodes a message's batch, failing on any problem.
func decode(t *testing.T, m kvevents.Msg) kvevents.Batch {
	t.Helper()
	b, st, err := kvevents.DecodeBatch(m.Payload)
	if err != nil {
		t.Fatalf("decode seq %d: %v", m.Seq, err)
	}
	if len(st.Problems) > 0 {
		t.Fatalf("decode seq %d: problems %v", m.Seq, st.Problems)
	}
	return b
}

// sseEvents splits an SSE body into its data payloads, checking framing.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("SSE body does not end with a blank line: %q", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("bad SSE event %q", ev)
		}
		out = append(out, data)
	}
	return out
}
