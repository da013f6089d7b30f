package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/enginemetrics"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func metricsFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "enginemetrics", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLoadOptions(t *testing.T) {
	for engine, want := range map[kvdirv1.EngineKind]enginemetrics.Options{
		kvdirv1.EngineKind_ENGINE_KIND_VLLM:        {},
		kvdirv1.EngineKind_ENGINE_KIND_ENGINESIM:   {},
		kvdirv1.EngineKind_ENGINE_KIND_UNSPECIFIED: {},
		kvdirv1.EngineKind_ENGINE_KIND_SGLANG:      {Kind: enginemetrics.KindSGLang, Force: true},
		kvdirv1.EngineKind_ENGINE_KIND_TRTLLM:      {Kind: enginemetrics.KindTRTLLM, Force: true},
	} {
		if got := LoadOptions(Config{Engine: engine}); got != want {
			t.Errorf("%v: %+v, want %+v", engine, got, want)
		}
	}
	o := LoadOptions(Config{Engine: kvdirv1.EngineKind_ENGINE_KIND_SGLANG, MetricsRank: 3, MetricsByRank: true})
	if o.Rank != 3 || !o.ByRank || o.Kind != enginemetrics.KindSGLang {
		t.Fatalf("ranked: %+v", o)
	}
	if err := (Config{WorkerID: "w", Endpoint: "tcp://h:1", MetricsRank: -1, MetricsByRank: true}).Validate(); err == nil {
		t.Fatal("negative metrics rank accepted")
	}
}

func TestScrapeLoadKindsAndRanks(t *testing.T) {
	bodies := map[string]string{
		"/vllm":    metricsFixture(t, "vllm_dp2.txt"),
		"/sglang":  metricsFixture(t, "sglang_dp2.txt"),
		"/trtllm":  metricsFixture(t, "trtllm_iteration_stats.json"),
		"/unknown": "go_goroutines 3\n",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, bodies[r.URL.Path])
	}))
	defer srv.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		path string
		o    enginemetrics.Options
		want *kvdirv1.Load
	}{
		{"/vllm", enginemetrics.Options{}, &kvdirv1.Load{Running: 9, Waiting: 3, KvUsage: 0.625, PrefixQueries: 5120, PrefixHits: 2304}},
		{"/vllm", enginemetrics.Options{Rank: 1, ByRank: true}, &kvdirv1.Load{Running: 2, KvUsage: 0.125, PrefixQueries: 1024, PrefixHits: 256}},
		{"/sglang", LoadOptions(Config{Engine: kvdirv1.EngineKind_ENGINE_KIND_SGLANG}),
			&kvdirv1.Load{Running: 6, Waiting: 4, KvUsage: 0.42, PrefixQueries: 9000, PrefixHits: 3000}},
		{"/trtllm", LoadOptions(Config{Engine: kvdirv1.EngineKind_ENGINE_KIND_TRTLLM}),
			&kvdirv1.Load{Running: 5, Waiting: 3, KvUsage: 0.6, PrefixQueries: 6400, PrefixHits: 4800}},
	} {
		l, _, err := scrapeLoad(ctx, srv.Client(), srv.URL+tc.path, tc.o)
		if err != nil {
			t.Fatalf("%s %+v: %v", tc.path, tc.o, err)
		}
		if l.String() != tc.want.String() {
			t.Errorf("%s %+v: got %v, want %v", tc.path, tc.o, l, tc.want)
		}
	}
	_, _, err := scrapeLoad(ctx, srv.Client(), srv.URL+"/unknown", enginemetrics.Options{})
	if !errors.Is(err, enginemetrics.ErrUnknownExposition) || !strings.Contains(err.Error(), "/unknown") {
		t.Fatalf("unknown exposition: %v", err)
	}
	if l := ParseLoad(strings.NewReader("go_goroutines 3\n")); l.String() != (&kvdirv1.Load{}).String() {
		t.Fatalf("ParseLoad of an unknown exposition = %v, want a zero load", l)
	}
}
