package router

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// fakeEngine is one engine's HTTP server: /metrics answers body (with
// contentType), completions echo the data-parallel rank header they got.
func fakeEngine(t *testing.T, contentType, body string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		_, _ = io.WriteString(w, body)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Seen-Rank", r.Header.Get("X-data-parallel-rank"))
		okJSON(0)(w, r)
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func engineFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "enginemetrics", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitLoad waits until w's scraped load is running/waiting/kv.
func waitLoad(t *testing.T, s *Server, id string, running, waiting int, kv float64) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "load of "+id, func() (bool, string) {
		w := s.pool.snapshot()[id]
		if w == nil {
			return false, "no worker"
		}
		l := w.load()
		ok := w.scrapeAt.Load() != 0 && l.Running == running && l.Waiting == waiting && l.KVUsage == kv
		return ok, fmt.Sprintf("%+v, scraped %v", l, w.scrapeAt.Load() != 0)
	})
}

// chatFor is chatBody asking for model.
func chatFor(model string) string {
	return strings.Replace(chatBody, `"model":"m"`, fmt.Sprintf("%q:%q", "model", model), 1)
}

func TestDataParallelRanksBehindOneServer(t *testing.T) {
	eng := fakeEngine(t, "text/plain; version=0.0.4", engineFixture(t, "vllm_dp2.txt"))
	workers := []StaticWorker{{ID: "dp0", Address: eng.URL, HasRank: true}, {ID: "dp1", Address: eng.URL, Rank: 1, HasRank: true}}
	s, url := testRouter(t, "round-robin", workers, nil)
	waitLoad(t, s, "dp0", 7, 3, 0.625)
	waitLoad(t, s, "dp1", 2, 0, 0.125)
	if m := s.pool.snapshot()["dp1"].model(); m != "deepseek-ai/DeepSeek-V3" {
		t.Fatalf("model learned from rank 1's series: %q", m)
	}

	seen := map[string]string{}
	for range 4 {
		// A client's own rank header does not choose the rank.
		resp, body := post(t, url+PathChat, chatFor("deepseek-ai/DeepSeek-V3"), "X-Data-Parallel-Rank", "5")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get(HeaderWorker)] = resp.Header.Get("X-Seen-Rank")
	}
	if want := map[string]string{"dp0": "0", "dp1": "1"}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("rank header by worker = %v, want %v", seen, want)
	}
}

func TestWorkerWithoutRankSendsNoRankHeader(t *testing.T) {
	eng := fakeEngine(t, "text/plain", engineFixture(t, "vllm_dp2.txt"))
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "all", Address: eng.URL}}, nil)
	waitLoad(t, s, "all", 9, 3, 0.625) // summed over both ranks, as before
	resp, _ := post(t, url+PathChat, chatFor("deepseek-ai/DeepSeek-V3"))
	if got := resp.Header.Get("X-Seen-Rank"); got != "" {
		t.Fatalf("rank header %q sent for a worker without a rank", got)
	}
}

func TestOtherEngineKindsAreNotDown(t *testing.T) {
	sgl := fakeEngine(t, "text/plain; version=0.0.4; charset=utf-8", engineFixture(t, "sglang_dp2.txt"))
	// trtllm-serve answers JSON; the router detects it from the content
	// even under a misleading content type.
	trt := fakeEngine(t, "text/plain", engineFixture(t, "trtllm_iteration_stats.json"))
	workers := []StaticWorker{{ID: "sgl", Address: sgl.URL}, {ID: "sgl-dp1", Address: sgl.URL, Rank: 1, HasRank: true},
		{ID: "trt", Address: trt.URL, Model: "Qwen/Qwen3-8B"}}
	s, url := testRouter(t, "round-robin", workers, nil)
	waitLoad(t, s, "sgl", 6, 4, 0.42)
	waitLoad(t, s, "sgl-dp1", 1, 0, 0.08)
	waitLoad(t, s, "trt", 5, 3, 0.6)
	if m := s.pool.snapshot()["sgl"].model(); m != "Qwen/Qwen3-8B" {
		t.Fatalf("SGLang model = %q", m)
	}
	time.Sleep(5 * 20 * time.Millisecond) // several scrape intervals
	now := time.Now()
	for _, id := range []string{"sgl", "sgl-dp1", "trt"} {
		w := s.pool.snapshot()[id]
		if !w.routable(now) || w.scrapeKO.Load() != 0 {
			t.Errorf("%s: routable %v, failed scrapes %d", id, w.routable(now), w.scrapeKO.Load())
		}
	}
	for range 3 {
		if resp, body := post(t, url+PathChat, chatFor("Qwen/Qwen3-8B")); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
}

func TestUnknownExpositionMarksDownWithReason(t *testing.T) {
	good := fakeEngine(t, "text/plain", engineFixture(t, "vllm_dp2.txt"))
	odd := fakeEngine(t, "text/plain", "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n")
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "good", Address: good.URL}, {ID: "odd", Address: odd.URL, Model: "m"}},
		func(c *Config) { c.Logger = testkit.Logger(t) })
	testkit.Eventually(t, 5*time.Second, "odd worker down", func() (bool, string) {
		w := s.pool.snapshot()["odd"]
		return !w.routable(time.Now()), fmt.Sprintf("failed scrapes %d", w.scrapeKO.Load())
	})
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `kvdir_router_engine_scrape_failures_total{reason="unknown-exposition",worker="odd"}`; !strings.Contains(string(b), want) {
		t.Fatalf("router metrics lack %s", want)
	}
	if strings.Contains(string(b), `scrape_failures_total{reason="unknown-exposition",worker="good"}`) {
		t.Fatal("the vLLM worker's scrapes failed")
	}
}

func TestForcedEngineKind(t *testing.T) {
	sgl := fakeEngine(t, "text/plain", engineFixture(t, "sglang_dp2.txt"))
	vl := fakeEngine(t, "text/plain", engineFixture(t, "vllm_dp2.txt"))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "sgl", Address: sgl.URL}, {ID: "vllm", Address: vl.URL, Model: "m"}},
		func(c *Config) { c.EngineKind, c.Logger = "sglang", testkit.Logger(t) })
	waitLoad(t, s, "sgl", 6, 4, 0.42)
	testkit.Eventually(t, 5*time.Second, "vLLM worker down under --engine-kind sglang", func() (bool, string) {
		w := s.pool.snapshot()["vllm"]
		return !w.routable(time.Now()), fmt.Sprintf("failed scrapes %d", w.scrapeKO.Load())
	})
}

func TestEngineKindAndRankValidation(t *testing.T) {
	base := Config{Policy: mustPolicy(t, "round-robin"), Renderer: mustRenderer(t)}
	c := base
	c.Static, c.EngineKind = []StaticWorker{{ID: "a", Address: "http://127.0.0.1:1"}}, "tgi"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "tgi") {
		t.Fatalf("unknown engine kind: %v", err)
	}
	c = base
	c.Static = []StaticWorker{{ID: "a", Address: "http://127.0.0.1:1", Rank: -1, HasRank: true}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "rank") {
		t.Fatalf("negative rank: %v", err)
	}
	c.Static[0].Rank, c.EngineKind = 3, "trtllm"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
