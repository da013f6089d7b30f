package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/bench/capacity"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/workload"
)

// smallGen is a kvbench gen argv of a few dozen requests.
var smallGen = []string{"sessions", "--preset", "agent", "--sessions", "10", "--max-turns", "4", "--document-tokens", "1500",
	"--tool-tokens", "600", "--think-time", "5", "--session-rate", "1"}

// TestSweepCommand sweeps a generated trace with the KV sized by
// --kv-ratio and checks the files and what they record.
func TestSweepCommand(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	if err := run(t, append(append([]string{"gen"}, smallGen...), "-o", trace)...); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "c.json")
	if err := run(t, "sweep", "--trace", trace, "--replicas", "2", "--profile", "llama3-8b", "--kv-ratio", "1.5",
		"--policies", "kvdir,round-robin,prefix", "--slo", "300ms", "--precision", "0.3", "--out", out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{out, filepath.Join(dir, "c.md"), filepath.Join(dir, "c"+capacity.SuffixP90)} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	res, err := capacity.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadFile(trace, 512)
	if err != nil {
		t.Fatal(err)
	}
	hot := workload.Summarize(recs, 512).HotWorkingSetTokens
	if want := kvBlocksForRatio(1.5, hot, 2, 16); res.KVBlocks != want || res.KVToWorkingSet < 1.5 || res.KVToWorkingSet > 1.51 {
		t.Fatalf("kv blocks %d (%.3fx the working set), want %d", res.KVBlocks, res.KVToWorkingSet, want)
	}
	if res.SLOMs != 300 || len(res.Policies) != 3 || res.BestBaseline != "prefix" || !slices.Contains(res.Command, "--slo=300ms") {
		t.Fatalf("result: slo %v, %d policies, best %q, command %q", res.SLOMs, len(res.Policies), res.BestBaseline, res.Command)
	}
	env, err := benchjson.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Validate(); err != nil || env.Tool != "sweep" {
		t.Fatalf("envelope %q: %v", env.Tool, err)
	}
	if f, ok := env.Figure("kvdir.capacity_rps"); !ok || f.Measured != res.Policies[0].CapacityRPS {
		t.Fatalf("kvdir.capacity_rps %+v", f)
	}
}

func TestSweepUsage(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	if err := run(t, append(append([]string{"gen"}, smallGen...), "-o", trace)...); err != nil {
		t.Fatal(err)
	}
	profile := filepath.Join("..", "..", "..", "internal", "costmodel", "testdata", "profile_valid.json")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kv-blocks", "100", "--kv-ratio", "1"}, "give one"},
		{[]string{"--profile", profile, "--kv-blocks", "100"}, "no default SLO; set --slo"},
		{[]string{"--precision", "0"}, "--precision 0"},
		{[]string{"--min-multiplier", "2", "--max-multiplier", "1"}, "want 0 < min <= max"},
	} {
		err := run(t, append([]string{"sweep", "--trace", trace, "--replicas", "2", "--profile", "llama3-8b", "--policies", "kvdir"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
