package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/workload"
)

func sample(rep, prompt, cached, ideal int, arrive, first, finish time.Duration) Sample {
	return Sample{Replica: rep, PromptTokens: prompt, CachedTokens: cached, IdealCached: ideal, OutputTokens: 10,
		Arrival: arrive, FirstToken: first, Finish: finish}
}

func TestSummarize(t *testing.T) {
	s := []Sample{
		sample(0, 1000, 500, 800, 0, 100*time.Millisecond, time.Second),
		sample(0, 1000, 300, 800, time.Second, 1300*time.Millisecond, 2*time.Second),
		sample(1, 2000, 0, 400, time.Second, 1500*time.Millisecond, 3*time.Second),
		{Replica: 1, PromptTokens: 99999, Rejected: true},
	}
	p, err := Summarize("kvdir", []string{"a", "b"}, s)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	switch {
	case p.Requests != 3 || p.Rejected != 1:
		t.Fatalf("requests %d rejected %d", p.Requests, p.Rejected)
	case p.PromptTokens != 4000 || p.HitTokens != 800 || !near(p.HitRate, 0.2) || !near(p.ReuseCaptured, 0.4):
		t.Fatalf("hits: %+v", p)
	case !near(p.TTFTP50Ms, 300) || !near(p.TTFTP90Ms, 460) || !near(p.TTFTCDFMs[0], 100) || !near(p.TTFTCDFMs[100], 500):
		t.Fatalf("ttft p50 %v p90 %v cdf %v", p.TTFTP50Ms, p.TTFTP90Ms, p.TTFTCDFMs)
	case !near(p.MaxReplicaShare, 2.0/3) || p.Replicas[1].Requests != 1 || !near(p.Replicas[0].HitRate, 0.4):
		t.Fatalf("replicas: %+v", p.Replicas)
	case !near(p.DurationSec, 3) || !near(p.ThroughputTokensPerSec, 4030.0/3):
		t.Fatalf("throughput %v over %v s", p.ThroughputTokensPerSec, p.DurationSec)
	}
	if _, err := Summarize("x", []string{"a"}, []Sample{{Replica: 3}}); err == nil {
		t.Fatal("sample on an unknown replica accepted")
	}
}

func testReport(t *testing.T) *Report {
	t.Helper()
	p, err := Summarize("kvdir", []string{"r0", "r1"}, []Sample{
		sample(0, 1000, 500, 800, 0, 100*time.Millisecond, time.Second),
		sample(1, 2000, 0, 400, time.Second, 1500*time.Millisecond, 3*time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Queue = &QueueSeries{IntervalSec: 1, Replicas: [][]int{{0, 2, 1}, {1, 0}}}
	p.Replicas[0].PeakQueue = 2
	p.Finish()
	q := p
	q.Name = "round-robin"
	r := &Report{Tool: "sim", Mode: "sim", Command: []string{"kvbench", "sim", "--trace=t.jsonl"}, Machine: benchjson.ThisMachine(),
		Started: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC), Trace: "t.jsonl", Replicas: 2,
		Profile: "llama3-70b", KVBlocks: 100, BlockSize: 16, Policies: []Policy{p, q},
		PooledHitTokens: 1000, PooledHitRate: p.HitRate * 2}
	r.RelateToPooled()
	return r
}

// TestForTracePooled: the report of a trace carries the bound of one LRU
// cache of the cluster's KV, which an unlimited cluster raises to the ideal.
func TestForTracePooled(t *testing.T) {
	recs := []workload.Record{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []int64{1, 2}},
		{Timestamp: 10, InputLength: 1024, OutputLength: 1, HashIDs: []int64{3, 4}},
		{Timestamp: 20, InputLength: 1024, OutputLength: 1, HashIDs: []int64{1, 2}},
	}
	ideal := workload.IdealHits(recs, 512, 16)
	big := ForTrace("sim", "t", recs, ideal, 512, 16, 2, "llama3-8b", 1000, 1)
	if big.PooledHitTokens != big.TraceStats.IdealHitTokens || big.PooledHitTokens != 1008 || big.PooledHitRate != 1008.0/3072 {
		t.Fatalf("unlimited: pooled %d (%v), ideal %d", big.PooledHitTokens, big.PooledHitRate, big.TraceStats.IdealHitTokens)
	}
	// 2 × 32 blocks of 16 tokens hold one prompt: the second evicts the first.
	small := ForTrace("sim", "t", recs, ideal, 512, 16, 2, "llama3-8b", 32, 1)
	if small.PooledHitTokens != 0 {
		t.Fatalf("one prompt of KV: pooled %d, want 0", small.PooledHitTokens)
	}
	small.Policies = []Policy{{Name: "x", HitRate: 0.2}}
	small.RelateToPooled()
	if small.Policies[0].ReuseVsPooled != 0 {
		t.Fatalf("no bound: reuse_vs_pooled %v", small.Policies[0].ReuseVsPooled)
	}
}

// TestSchema checks the JSON field names of the fixed report schema.
func TestSchema(t *testing.T) {
	r := testReport(t)
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trace", "replicas", "profile", "kv_blocks", "policies", "pooled_hit_rate", "pooled_hit_tokens",
		"cluster_kv_tokens", "kv_to_working_set", "trace_stats"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("report has no %q", k)
		}
	}
	pol := m["policies"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "requests", "hit_rate", "reuse_captured", "reuse_vs_pooled", "ttft_p50_ms", "ttft_p90_ms",
		"ttft_p99_ms", "e2e_p90_ms", "throughput_tokens_per_sec", "prefill_tokens_computed", "max_replica_share"} {
		if _, ok := pol[k]; !ok {
			t.Fatalf("policy has no %q", k)
		}
	}
	if pol["reuse_vs_pooled"].(float64) != 0.5 || m["pooled_hit_rate"].(float64) != r.PooledHitRate {
		t.Fatalf("reuse_vs_pooled %v, pooled_hit_rate %v", pol["reuse_vs_pooled"], m["pooled_hit_rate"])
	}
	if pol["max_peak_queue"].(float64) != 2 {
		t.Fatalf("max_peak_queue %v, want 2", pol["max_peak_queue"])
	}
	r.Policies[1].Name = "kvdir"
	if err := r.Validate(); err == nil {
		t.Fatal("duplicate policy accepted")
	}
}

// TestEnvelope writes a report and reads it back: a results envelope with
// each policy's headline figures, the report as its details.
func TestEnvelope(t *testing.T) {
	r := testReport(t)
	path := filepath.Join(t.TempDir(), "r.json")
	if err := WriteJSON(path, r); err != nil {
		t.Fatal(err)
	}
	res, err := benchjson.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	if res.Tool != "sim" || !slices.Equal(res.Command, r.Command) || !res.Started.Equal(r.Started) {
		t.Fatalf("envelope %s %q %v", res.Tool, res.Command, res.Started)
	}
	if f, ok := res.Figure("kvdir.hit_rate"); !ok || f.Measured != r.Policies[0].HitRate || f.Unit != "fraction" {
		t.Fatalf("kvdir.hit_rate %+v, present %v", f, ok)
	}
	if f, ok := res.Figure("round-robin.ttft_p90_ms"); !ok || f.Measured != r.Policies[1].TTFTP90Ms {
		t.Fatalf("round-robin.ttft_p90_ms %+v, present %v", f, ok)
	}
	back, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.Validate(); err != nil {
		t.Fatal(err)
	}
	if back.Tool != r.Tool || !slices.Equal(back.Command, r.Command) || back.Machine != r.Machine ||
		len(back.Policies) != 2 || !slices.Equal(back.Policies[0].TTFTCDFMs, r.Policies[0].TTFTCDFMs) {
		t.Fatalf("read back %+v", back)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"ttft_cdf_ms": [`)) || bytes.Count(b, []byte("\n")) > 400 {
		t.Fatalf("number arrays not kept on one line:\n%s", b)
	}
	if got := CommandLine([]string{"kvbench", "sim", "--trace=a b.jsonl", ""}); got != `kvbench sim "--trace=a b.jsonl" ""` {
		t.Fatalf("CommandLine: %s", got)
	}
}

func TestMarkdownAndCharts(t *testing.T) {
	r := testReport(t)
	var buf bytes.Buffer
	if err := Markdown(&buf, r); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "| kvdir | 16.7 % | 0.417 | 0.500 |") || !strings.Contains(out, "| round-robin |") ||
		!strings.Contains(out, "pooled LRU cache of that size would hit 33.3 %") {
		t.Fatalf("table:\n%s", out)
	}
	// A result without the bound renders as before it existed.
	r.PooledHitRate = 0
	buf.Reset()
	if err := Markdown(&buf, r); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); strings.Contains(out, "pooled") || !strings.Contains(out, "| kvdir | 16.7 % | 0.417 | 300 ms |") {
		t.Fatalf("table without the bound:\n%s", out)
	}
	files, err := Charts(r, t.TempDir()+"/x")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("files %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Fatalf("%s is not a PNG", f)
		}
	}
}
