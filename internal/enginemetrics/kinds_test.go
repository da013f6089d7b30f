package enginemetrics

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseKinds(t *testing.T) {
	const ds, qw = "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-8B"
	for _, tc := range []struct {
		name, file string
		o          Options
		want       Load
	}{
		{"vllm all ranks", "vllm_dp2.txt", Options{},
			Load{Running: 9, Waiting: 3, KVUsage: 0.625, PrefixQueries: 5120, PrefixHits: 2304, Model: ds, Kind: KindVLLM}},
		{"vllm rank 0", "vllm_dp2.txt", Options{Rank: 0, ByRank: true},
			Load{Running: 7, Waiting: 3, KVUsage: 0.625, PrefixQueries: 4096, PrefixHits: 2048, Model: ds, Kind: KindVLLM}},
		{"vllm rank 1", "vllm_dp2.txt", Options{Rank: 1, ByRank: true},
			Load{Running: 2, Waiting: 0, KVUsage: 0.125, PrefixQueries: 1024, PrefixHits: 256, Model: ds, Kind: KindVLLM}},
		{"vllm forced", "vllm_dp2.txt", Options{Kind: KindVLLM, Force: true},
			Load{Running: 9, Waiting: 3, KVUsage: 0.625, PrefixQueries: 5120, PrefixHits: 2304, Model: ds, Kind: KindVLLM}},
		{"sglang all ranks", "sglang_dp2.txt", Options{},
			Load{Running: 6, Waiting: 4, KVUsage: 0.42, HitRate: 0.5, PrefixQueries: 9000, PrefixHits: 3000, Model: qw, Kind: KindSGLang}},
		{"sglang rank 1", "sglang_dp2.txt", Options{Rank: 1, ByRank: true},
			Load{Running: 1, Waiting: 0, KVUsage: 0.08, HitRate: 0.25, PrefixQueries: 9000, PrefixHits: 3000, Model: qw, Kind: KindSGLang}},
		{"sglang forced", "sglang_dp2.txt", Options{Kind: KindSGLang, Force: true},
			Load{Running: 6, Waiting: 4, KVUsage: 0.42, HitRate: 0.5, PrefixQueries: 9000, PrefixHits: 3000, Model: qw, Kind: KindSGLang}},
		{"trtllm", "trtllm_iteration_stats.json", Options{},
			Load{Running: 5, Waiting: 3, KVUsage: 0.6, HitRate: 0.75, PrefixQueries: 6400, PrefixHits: 4800, Kind: KindTRTLLM}},
		{"trtllm forced rank 0", "trtllm_iteration_stats.json", Options{Kind: KindTRTLLM, Force: true, ByRank: true},
			Load{Running: 5, Waiting: 3, KVUsage: 0.6, HitRate: 0.75, PrefixQueries: 6400, PrefixHits: 4800, Kind: KindTRTLLM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseWith(strings.NewReader(fixture(t, tc.file)), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseRankHelper(t *testing.T) {
	l, err := ParseRank(strings.NewReader(fixture(t, "vllm_dp2.txt")), 1)
	if err != nil || l.Running != 2 || l.KVUsage != 0.125 {
		t.Fatalf("ParseRank(1) = %+v, %v", l, err)
	}
	// An exposition without rank labels is rank 0.
	single := "vllm:num_requests_running{model_name=\"m\"} 4\n"
	if l, err := ParseRank(strings.NewReader(single), 0); err != nil || l.Running != 4 {
		t.Fatalf("unlabelled rank 0 = %+v, %v", l, err)
	}
	_, err = ParseRank(strings.NewReader(single), 1)
	if !errors.Is(err, ErrUnknownExposition) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("missing rank: %v", err)
	}
	if _, err := ParseRank(strings.NewReader(single), -1); err == nil {
		t.Fatal("negative rank accepted")
	}
	if _, err := ParseRank(strings.NewReader(fixture(t, "trtllm_iteration_stats.json")), 1); !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("TensorRT-LLM rank 1: %v", err)
	}
}

func TestParseForcedMismatch(t *testing.T) {
	// A forced kind reads only its own names.
	_, err := ParseWith(strings.NewReader(fixture(t, "sglang_dp2.txt")), Options{Kind: KindVLLM, Force: true})
	if !errors.Is(err, ErrUnknownExposition) || !strings.Contains(err.Error(), metricRunning) || strings.Contains(err.Error(), sglRunning) {
		t.Fatalf("SGLang read as vLLM: %v", err)
	}
	_, err = ParseWith(strings.NewReader(fixture(t, "vllm_dp2.txt")), Options{Kind: KindTRTLLM, Force: true})
	if !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("vLLM read as TensorRT-LLM: %v", err)
	}
	// Forcing vLLM on JSON reads it as (empty) text.
	if _, err := ParseWith(strings.NewReader(fixture(t, "trtllm_iteration_stats.json")), Options{Kind: KindVLLM, Force: true}); !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("JSON read as vLLM: %v", err)
	}
	if _, err := ParseWith(strings.NewReader("x"), Options{Kind: Kind(9), Force: true}); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

func TestParseUnknownNamesWhatWasLookedFor(t *testing.T) {
	_, err := Parse(strings.NewReader("# HELP go_goroutines x\ngo_goroutines 4\n"))
	if !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{metricRunning, sglRunning, sglTokenUsage, "TensorRT-LLM"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestParseSGLangDuplicateSchedulerSeries(t *testing.T) {
	// Two tensor-parallel ranks of one scheduler reporting the same queue
	// count once; ranks without dp_rank are one rank.
	text := `sglang:num_running_reqs{model_name="m",tp_rank="0"} 3
sglang:num_running_reqs{model_name="m",tp_rank="1"} 3
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2
sglang:token_usage{model_name="m",tp_rank="0"} 1.5
sglang:token_usage{model_name="m",tp_rank="1"} -1
sglang:cache_hit_rate{model_name="m"} NaN
`
	l, err := Parse(strings.NewReader(text))
	want := Load{Running: 3, Waiting: 2, KVUsage: 1, Model: "m", Kind: KindSGLang}
	if err != nil || l != want {
		t.Fatalf("got %+v, %v; want %+v", l, err, want)
	}
	// The hit rate alone is not a load.
	if _, err := Parse(strings.NewReader("sglang:cache_hit_rate 0.5\n")); !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("hit rate only: %v", err)
	}
}

func TestParseVLLMPreferredOverSGLang(t *testing.T) {
	text := "sglang:num_running_reqs 8\nvllm:num_requests_running 1\n"
	if l, err := Parse(strings.NewReader(text)); err != nil || l.Kind != KindVLLM || l.Running != 1 {
		t.Fatalf("mixed: %+v, %v", l, err)
	}
}

// An empty array is no iteration since the last read: an idle engine's
// zero load, flagged so that a reader sharing the engine can tell.
func TestParseTRTLLMNoNewStats(t *testing.T) {
	l, err := Parse(strings.NewReader(" \n[]"))
	if !errors.Is(err, ErrNoNewStats) || l != (Load{Kind: KindTRTLLM}) {
		t.Fatalf("empty array: %+v, %v; want the zero TensorRT-LLM load and ErrNoNewStats", l, err)
	}
}

func TestParseTRTLLMShapes(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Load
		bad        bool
	}{
		{"single object", `{"numActiveRequests": 2, "numQueuedRequests": 1}`, Load{Running: 2, Waiting: 1, Kind: KindTRTLLM}, false},
		{"free blocks only", `[{"numActiveRequests": 1, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 75}}]`,
			Load{Running: 1, KVUsage: 0.25, Kind: KindTRTLLM}, false},
		{"clamped", `[{"numActiveRequests": -3, "numQueuedRequests": 1e300, "kvCacheStats": {"maxNumBlocks": 10, "usedNumBlocks": 20, "cacheHitRate": 7}}]`,
			Load{Waiting: 1<<31 - 1, KVUsage: 1, HitRate: 1, Kind: KindTRTLLM}, false},
		{"no max blocks", `[{"kvCacheStats": {"usedNumBlocks": 20}}]`, Load{Kind: KindTRTLLM}, false},
		{"no load fields", `[{"iter": 3}]`, Load{}, true},
		{"not JSON", `[{"numActiveRequests": 1`, Load{}, true},
		{"wrong types", `[{"numActiveRequests": "five"}]`, Load{}, true},
		{"array of numbers", `[1, 2]`, Load{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Parse(strings.NewReader(tc.body))
			if tc.bad {
				if !errors.Is(err, ErrUnknownExposition) {
					t.Fatalf("got %+v, %v; want an unknown-exposition error", l, err)
				}
				return
			}
			if err != nil || l != tc.want {
				t.Fatalf("got %+v, %v; want %+v", l, err, tc.want)
			}
		})
	}
}

func TestParseTRTLLMTooLarge(t *testing.T) {
	body := "[" + strings.Repeat(" ", maxJSON) + "]"
	if _, err := Parse(strings.NewReader(body)); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("oversized JSON: %v", err)
	}
}

func TestParseKindFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		k    Kind
		auto bool
	}{{"", KindVLLM, true}, {"auto", KindVLLM, true}, {"vllm", KindVLLM, false}, {"SGLang", KindSGLang, false},
		{"trtllm", KindTRTLLM, false}, {"tensorrt-llm", KindTRTLLM, false}} {
		k, auto, err := ParseKind(tc.in)
		if err != nil || k != tc.k || auto != tc.auto {
			t.Errorf("ParseKind(%q) = %v, %v, %v", tc.in, k, auto, err)
		}
	}
	if _, _, err := ParseKind("tgi"); err == nil || !strings.Contains(err.Error(), KindNames) {
		t.Errorf("ParseKind(tgi) = %v", err)
	}
	for k, s := range map[Kind]string{KindVLLM: "vllm", KindSGLang: "sglang", KindTRTLLM: "trtllm", Kind(7): "kind(7)"} {
		if k.String() != s {
			t.Errorf("%d.String() = %q", k, k.String())
		}
	}
}

func TestParseDetectsAfterBOMAndBlanks(t *testing.T) {
	if l, err := Parse(strings.NewReader("\xEF\xBB\xBF\n\t [{\"numActiveRequests\": 4}]")); err != nil || l.Kind != KindTRTLLM || l.Running != 4 {
		t.Fatalf("JSON after a BOM: %+v, %v", l, err)
	}
	if l, err := Parse(strings.NewReader("\xEF\xBB\xBFsglang:num_queue_reqs 2\n")); err != nil || l.Kind != KindSGLang || l.Waiting != 2 {
		t.Fatalf("text after a BOM: %+v, %v", l, err)
	}
	if _, err := Parse(strings.NewReader("")); !errors.Is(err, ErrUnknownExposition) {
		t.Fatalf("empty body: %v", err)
	}
}
