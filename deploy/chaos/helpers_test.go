package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// These tests run in `go test ./...` (no Docker needed).

func TestCommonBlocks(t *testing.T) {
	a := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, c := range []struct {
		b    []uint32
		bs   int
		want int
	}{
		{a, 4, 2},                                // 9 equal tokens: 2 full blocks of 4
		{[]uint32{1, 2, 3, 4, 5, 6, 7, 0}, 4, 1}, // differs inside block 2
		{[]uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, 2},
		{[]uint32{9}, 4, 0},
		{nil, 4, 0},
	} {
		if got := commonBlocks(a, c.b, c.bs); got != c.want {
			t.Errorf("commonBlocks(a, %v, %d) = %d, want %d", c.b, c.bs, got, c.want)
		}
	}
}

func TestModelExpect(t *testing.T) {
	m := NewModel(2)
	t0 := time.Unix(1000, 0)
	p := []uint32{1, 2, 3, 4, 5, 6}
	served := []Served{
		{Worker: "a", Prompt: []uint32{1, 2, 3, 4, 9}, At: t0, Done: t0.Add(time.Second)}, // shares 2 blocks with p
		{Worker: "a", Prompt: p, At: t0.Add(2 * time.Second)},                             // still running: up to 3
		{Worker: "b", Prompt: p, At: t0, Done: t0.Add(5 * time.Second)},                   // completes after asOf
	}
	got := m.Expect(p, served, t0.Add(3*time.Second))
	if got["a"] != (Expectation{Min: 2, Max: 3}) || got["b"] != (Expectation{Min: 0, Max: 3}) {
		t.Fatalf("Expect = %v", got)
	}
	// b's engine restarted after it ran p: it holds nothing of it.
	m.Restarted("b", t0.Add(time.Second))
	if got := m.Expect(p, served, t0.Add(10*time.Second)); got["b"] != (Expectation{}) {
		t.Fatalf("after b's restart: %v", got["b"])
	}
	// A request the test sent itself counts like any other.
	m.AddDirect(Served{Worker: "c", Prompt: p[:4], At: t0.Add(2 * time.Second), Done: t0.Add(2 * time.Second)})
	if got := m.Expect(p, served, t0.Add(10*time.Second)); got["c"] != (Expectation{Min: 2, Max: 2}) {
		t.Fatalf("direct request on c: %v", got["c"])
	}
}

func TestEngineCachedTokens(t *testing.T) {
	// 48 tokens, 3 blocks held: the engine recomputes the last token, so
	// only 2 blocks count.
	if got := EngineCachedTokens(3, 48, 16); got != 32 {
		t.Fatalf("got %d, want 32", got)
	}
	if got := EngineCachedTokens(1, 49, 16); got != 16 {
		t.Fatalf("got %d, want 16", got)
	}
}

func TestGapRefusals(t *testing.T) {
	log := `time=x level=WARN msg="dirclient: publisher stopped" worker=w epoch=3 err="dirclient: publish for worker \"w\" epoch 3: batch 41..41 refused: PUBLISH_STATUS_GAP: the directory applied up to sequence 37 and the batches do not follow on; register the worker again"
time=y level=WARN msg="dirclient: publisher stopped" err="... batch 5..6 refused: PUBLISH_STATUS_STALE_EPOCH: a newer registration (epoch 4) fenced this epoch"`
	n, lost := GapRefusals(log)
	if n != 1 || lost != 3 {
		t.Fatalf("GapRefusals = %d refusals, %d lost; want 1, 3", n, lost)
	}
}

func TestChunkTrace(t *testing.T) {
	cfg := LoadConfig{BlockSize: 16, ChunkSec: 6, Seed: 7}
	a, err := chunkTrace(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := chunkTrace(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 10 || len(b) < 10 {
		t.Fatalf("chunks of %d and %d requests; want a steady load", len(a), len(b))
	}
	// Every session begins within the chunk and keeps all its turns: the
	// next chunk's load overlaps its last turns instead of ramping anew.
	begins, turns := map[string]float64{}, map[string]int{}
	later := 0
	for _, r := range a {
		if t0, ok := begins[r.SessionID]; !ok || r.Timestamp < t0 {
			begins[r.SessionID] = r.Timestamp
		}
		turns[r.SessionID]++
		if r.Timestamp >= 6000 {
			later++
		}
	}
	for id, t0 := range begins {
		if t0 >= 6000 {
			t.Fatalf("session %s begins at %v ms, beyond the chunk", id, t0)
		}
		if turns[id] < 2 {
			t.Fatalf("session %s has %d turns; sessions have 2-3", id, turns[id])
		}
	}
	if later == 0 {
		t.Fatal("no turn after the chunk's 6 s: the last sessions lost their later turns")
	}
	ids := map[int64]bool{}
	for _, r := range a {
		for _, id := range r.HashIDs {
			ids[id] = true
		}
	}
	for _, r := range b {
		for _, id := range r.HashIDs {
			if ids[id] {
				t.Fatalf("chunks 0 and 1 share hash id %d: their content would overlap", id)
			}
		}
	}
}

func TestMetric(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# HELP x\nkvdir_router_inflight{worker=\"a\"} 2\nkvdir_router_inflight{worker=\"b\"} 3\nkvdir_router_inflight_other 9\nvllm:num_requests_running{engine=\"0\"} 1\n")
	}))
	defer srv.Close()
	ctx := context.Background()
	if v, err := metric(ctx, srv.Client(), srv.URL, "kvdir_router_inflight"); err != nil || v != 5 {
		t.Fatalf("sum = %v, %v; want 5", v, err)
	}
	if v, err := metric(ctx, srv.Client(), srv.URL, "kvdir_router_inflight", `worker="b"`); err != nil || v != 3 {
		t.Fatalf("worker b = %v, %v; want 3", v, err)
	}
	if v, err := metric(ctx, srv.Client(), srv.URL, "vllm:num_requests_running"); err != nil || v != 1 {
		t.Fatalf("running = %v, %v; want 1", v, err)
	}
}

// TestBalancer checks that a router that fails before answering is skipped
// (the request goes to the other one), that a response broken after its
// headers reaches the client as a failure, and that both are recorded.
func TestBalancer(t *testing.T) {
	var breakNext atomic.Bool
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			return
		}
		w.Header().Set("X-Kvdir-Worker", "e1")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		if breakNext.Load() {
			panic(http.ErrAbortHandler) // the router dies mid-stream
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer good.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused from now on

	b, err := NewBalancer([]string{deadURL, good.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	post := func(front string) (string, error) {
		resp, err := http.Post(front+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3]}`))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	start := time.Now()
	body, err := post(b.Fronts()[0])
	if err != nil || !strings.Contains(body, "[DONE]") {
		t.Fatalf("via front 0 (dead router): %q, %v", body, err)
	}
	breakNext.Store(true)
	if _, err := post(b.Fronts()[1]); err == nil {
		t.Fatal("a response broken mid-stream reached the client as a success")
	}
	recs := b.Records(start)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	if r := recs[0]; !r.Rerouted || r.Router != 1 || r.Failed() || r.Worker != "e1" || len(r.Prompt) != 3 {
		t.Fatalf("first record: %+v", r)
	}
	if r := recs[1]; r.Rerouted || !r.Failed() || !strings.Contains(r.Err, "broke") {
		t.Fatalf("second record: %+v", r)
	}
	if err := testkit.Poll(context.Background(), 5*time.Second, "router health checks", func() (bool, string) {
		return !b.Healthy(0) && b.Healthy(1), "health checks"
	}); err != nil {
		t.Fatal(err)
	}
}

// TestFillUp fills a small tmpfs (root only: it mounts one) and checks
// that nothing is left.
func TestFillUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount: %v: %s", err, out)
	}
	defer func() { _ = exec.Command("umount", dir).Run() }()
	n, err := fillUp(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if n < 7<<20 {
		t.Fatalf("filled %d bytes of 8 MiB", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), make([]byte, 4096), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write after the fill: %v, want ENOSPC", err)
	}
}
