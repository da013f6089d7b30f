package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/workload"
)

func run(t *testing.T, args ...string) error {
	t.Helper()
	root := newRoot(slog.New(slog.DiscardHandler))
	root.SetArgs(args)
	root.SetOut(io.Discard)
	return root.ExecuteContext(context.Background())
}

// TestGenThenSim generates a trace and simulates it under every policy,
// checking the files a run must write (JSON, Markdown, charts).
func TestGenThenSim(t *testing.T) {
	testkit.SkipIfShort(t, "generates a trace, simulates every policy and draws the charts, about 10 s under -race")
	dir := t.TempDir()
	trace := filepath.Join(dir, "sessions.jsonl")
	if err := run(t, "gen", "sessions", "--preset", "seed-example", "--sessions", "12", "-o", trace); err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadFile(trace, 512)
	if err != nil || len(recs) != 24 {
		t.Fatalf("generated %d records, err %v", len(recs), err)
	}
	out := filepath.Join(dir, "results", "sim-test.json")
	if err := run(t, "sim", "--trace", trace, "--replicas", "2", "--profile", "llama3-8b", "--kv-blocks", "3000",
		"--policies", "all", "--out", out); err != nil {
		t.Fatal(err)
	}
	rep, err := report.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != len(placement.Names()) || rep.KVBlocks != 3000 || rep.Replicas != 2 {
		t.Fatalf("report: %d policies, %d kv blocks, %d replicas", len(rep.Policies), rep.KVBlocks, rep.Replicas)
	}
	for _, suffix := range []string{".md", report.SuffixTTFTCDF, report.SuffixReplicaHits, report.SuffixQueueOverTim} {
		if _, err := os.Stat(strings.TrimSuffix(out, ".json") + suffix); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(t, "report", "--no-charts", out); err != nil {
		t.Fatal(err)
	}

	routed := filepath.Join(dir, "results", "sim-routers.json")
	if err := run(t, "sim", "--trace", trace, "--replicas", "2", "--profile", "llama3-8b", "--kv-blocks", "3000",
		"--policies", "kvdir", "--routers", "3", "--router-view-lag", "5ms", "--router-view-jitter", "5ms",
		"--shared-intents", "--intent-lag", "10ms", "--no-charts", "--out", routed); err != nil {
		t.Fatal(err)
	}
	rep, err = report.ReadFile(routed)
	if err != nil {
		t.Fatal(err)
	}
	if lags, ok := rep.Settings["router_view_lag_ms"].([]any); rep.Settings["routers"] != 3.0 || rep.Settings["shared_intents"] != true ||
		rep.Settings["intent_lag_ms"] != 10.0 || !ok || len(lags) != 3 {
		t.Fatalf("settings of a 3-router run: %v", rep.Settings)
	}
}

// TestGenFamilies runs every generator subcommand with small sizes and
// reads the traces back.
func TestGenFamilies(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args    []string
		records int
	}{
		{[]string{"rag", "--users", "30", "--follow-ups", "0"}, 30},
		{[]string{"rollouts", "--groups", "3", "--siblings", "4"}, 24},
		{[]string{"rollouts", "--groups", "3", "--siblings", "4", "--second-round=false"}, 12},
		{[]string{"mix", "--chat-sessions", "5", "--classify-fraction", "0"}, -1},
		{[]string{"sessions", "--preset", "system-heavy", "--sessions", "10"}, -1},
		{[]string{"sessions", "--preset", "long-agent", "--sessions", "2"}, -1},
	} {
		trace := filepath.Join(dir, "t.jsonl")
		if err := run(t, append(append([]string{"gen"}, c.args...), "-o", trace)...); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		recs, err := workload.ReadFile(trace, 512)
		if err != nil || len(recs) == 0 || (c.records >= 0 && len(recs) != c.records) {
			t.Fatalf("%v: %d records (want %d), err %v", c.args, len(recs), c.records, err)
		}
		if c.args[0] == "mix" {
			for _, r := range recs {
				if r.SessionID == "" {
					t.Fatalf("%v: a classification request at fraction 0", c.args)
				}
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n"+`{"oops"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.jsonl")
	if err := os.WriteFile(good, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "--trace is required"},
		{[]string{"replay", "--trace", good, "--rate-multiplier", "0"}, "--rate-multiplier 0"},
		{[]string{"sim", "--trace", trace}, "line 2"},
		{[]string{"sim", "--trace", trace, "--policies", "fastest"}, "unknown policy"},
		{[]string{"sim", "--trace", trace, "--profile", "gpt-9"}, "neither a built-in profile"},
		{[]string{"sim", "--trace", trace, "--routers", "0"}, "--routers 0"},
		{[]string{"sim", "--trace", trace, "--balance", "sticky"}, "--balance"},
		{[]string{"sim", "--trace", trace, "--intent-lag", "5ms"}, "needs --shared-intents"},
		{[]string{"sim", "--trace", trace, "--router-view-jitter", "-1ms"}, "must be >= 0"},
		{[]string{"gen", "sessions", "--preset", "nope"}, "unknown preset"},
		{[]string{"gen", "shared-prefix", "--rate", "0"}, "rate"},
		{[]string{"gen", "rag", "--docs-per-request", "500"}, "documents per request 500"},
		{[]string{"gen", "rollouts", "--siblings", "0"}, "siblings 0"},
		{[]string{"gen", "mix", "--classify-fraction", "1"}, "classify fraction 1"},
		{[]string{"dev", "--engines", "0"}, "at least 1"},
	}
	for _, c := range cases {
		err := run(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: err %v, want %q", c.args, err, c.want)
		}
	}
}
