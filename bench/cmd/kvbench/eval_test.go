package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/bench/capacity"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/workload"
)

// TestEval runs a two-member set, one generated and one from a file next
// to the set, then one member alone: the summary keeps both.
func TestEval(t *testing.T) {
	dir := t.TempDir()
	if err := run(t, append(append([]string{"gen"}, smallGen...), "--seed", "3", "-o", filepath.Join(dir, "t.jsonl"))...); err != nil {
		t.Fatal(err)
	}
	gen, _ := json.Marshal(smallGen)
	set := filepath.Join(dir, "set.json")
	if err := os.WriteFile(set, []byte(`{"members": [
		{"name": "gen-2x8b", "gen": `+string(gen)+`, "replicas": 2, "profile": "llama3-8b", "kv_ratio": 1, "slo": "300ms"},
		{"name": "file-2x8b", "trace": "t.jsonl", "replicas": 2, "profile": "llama3-8b", "kv_blocks": 3000, "slo": "300ms"}
	]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	args := []string{"eval", "--set", set, "--out-dir", out, "--policies", "kvdir,round-robin,prefix", "--precision", "0.3", "--no-charts"}
	if err := run(t, args...); err != nil {
		t.Fatal(err)
	}
	if err := run(t, append(args, "--members", "file-2x8b")...); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"capacity-eval-gen-2x8b.json", "capacity-eval-gen-2x8b.md", "capacity-eval-file-2x8b.json", "capacity-eval.md"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := benchjson.ReadFile(filepath.Join(out, "capacity-eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sum evalSummary
	if err := res.DecodeDetails(&sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Rows) != 2 || sum.Rows[0].Member != "gen-2x8b" || sum.Rows[1].KvdirRPS <= 0 || sum.MedianKvdirVsBest == nil || sum.MedianOver != 2 {
		t.Fatalf("summary %+v", sum)
	}
	if !strings.HasPrefix(sum.Rows[0].Trace, "kvbench gen sessions") || sum.Rows[1].BestBaseline != "prefix" || sum.Rows[0].SLOMs != 300 {
		t.Fatalf("rows %+v", sum.Rows)
	}
	lo, hi := *sum.Rows[0].KvdirVsBest, *sum.Rows[1].KvdirVsBest
	if want := (lo + hi) / 2; *sum.MedianKvdirVsBest != want {
		t.Fatalf("median %v, want %v", *sum.MedianKvdirVsBest, want)
	}
	if err := run(t, "eval", "--set", set, "--members", "nope"); err == nil || !strings.Contains(err.Error(), "not in") {
		t.Fatalf("unknown member: %v", err)
	}
	// --summarize rewrites the summary from the member files alone, to the
	// same rows, and carries the command that made them.
	before, err := os.ReadFile(filepath.Join(out, "capacity-eval.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(out, "capacity-eval.md")); err != nil {
		t.Fatal(err)
	}
	if err := run(t, append(args, "--summarize")...); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(filepath.Join(out, "capacity-eval.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatalf("summary rewritten by --summarize:\n%s\nwant\n%s", after, before)
	}
	if !strings.Contains(string(after), "What limits kvdir on each member") || strings.Contains(string(after), "--summarize") {
		t.Fatalf("summary:\n%s", after)
	}
	if err := run(t, append(args, "--summarize", "--members", "file-2x8b")...); err == nil || !strings.Contains(err.Error(), "simulates nothing") {
		t.Fatalf("--summarize with --members: %v", err)
	}
}

// TestLimitsOf checks each limit against a sweep result built by hand.
func TestLimitsOf(t *testing.T) {
	p90 := func(v float64) *float64 { return &v }
	res := &capacity.Result{Replicas: 4, PooledHitRate: 0.6, BestBaseline: "sglang", LowestP90AtBestBaseline: "sglang",
		Policies: []capacity.Policy{
			{Name: "kvdir", CapacityRPS: 4, HitRate: 0.5, TTFTP90AtBestBaselineMs: p90(1100),
				Points: []capacity.Point{{Multiplier: 2, HitRate: 0.52}, {Multiplier: 0.5, HitRate: 0.58}, {Multiplier: 4, HitRate: 0.5}}},
			{Name: capacity.RoundRobin, CapacityRPS: 2, HitRate: 0.2, TTFTP90AtBestBaselineMs: p90(5000),
				Points: []capacity.Point{{Multiplier: 1, HitRate: 0.2}}},
			{Name: "sglang", CapacityRPS: 3, HitRate: 0.55, MaxReplicaShare: 0.3, TTFTP90AtBestBaselineMs: p90(1000),
				Points: []capacity.Point{{Multiplier: 1, HitRate: 0.59}, {Multiplier: 3, HitRate: 0.55}}},
		}}
	l := limitsOf(res)
	near := func(got *float64, want float64) bool { return got != nil && math.Abs(*got-want) < 1e-9 }
	switch {
	case l.MaxHitRate != 0.59 || l.MaxHitPolicy != "sglang":
		t.Errorf("highest hit rate %v (%s), want 0.59 (sglang)", l.MaxHitRate, l.MaxHitPolicy)
	case l.KvdirLightMultiplier != 0.5 || l.KvdirLightHitRate != 0.58 || l.KvdirHitRate != 0.5:
		t.Errorf("kvdir's hit rates %+v", l)
	case !near(l.ReuseHeadroom, 0.45/0.4) || !near(l.BestBusiest, 1.2):
		t.Errorf("best baseline's headroom %v, busiest %v", *l.ReuseHeadroom, *l.BestBusiest)
	case !near(l.RRWorkVsKvdir, 0.8/0.5) || !near(l.RRWorkVsPooled, 0.8/0.4):
		t.Errorf("round-robin's prefill %v, %v", *l.RRWorkVsKvdir, *l.RRWorkVsPooled)
	case !near(l.KvdirP90VsLowest, 1.1) || l.LowestP90Policy != "sglang":
		t.Errorf("p90 over the lowest %v (%s)", *l.KvdirP90VsLowest, l.LowestP90Policy)
	}
	// Without a round-robin capacity or kvdir, those figures are absent.
	res.Policies[1].CapacityRPS = 0
	if l := limitsOf(res); l.RRWorkVsKvdir != nil || l.RRWorkVsPooled != nil {
		t.Errorf("round-robin without a capacity: %+v", l)
	}
	res.Policies = res.Policies[1:]
	if l := limitsOf(res); l.KvdirLightMultiplier != 0 || l.KvdirP90VsLowest != nil || l.ReuseHeadroom == nil {
		t.Errorf("without kvdir: %+v", l)
	}
}

func TestEvalSetErrors(t *testing.T) {
	for want, members := range map[string]string{
		"exactly one of trace and gen":  `{"name": "a", "replicas": 1, "profile": "llama3-8b"}`,
		"appears twice":                 `{"name": "a", "trace": "x", "replicas": 1, "profile": "p"}, {"name": "a", "trace": "y", "replicas": 1, "profile": "p"}`,
		"want lower-case":               `{"name": "A b", "trace": "x", "replicas": 1, "profile": "p"}`,
		"at most one of kv_ratio":       `{"name": "a", "trace": "x", "replicas": 1, "profile": "p", "kv_ratio": 1, "kv_blocks": 2}`,
		"must not set the output":       `{"name": "a", "gen": ["sessions", "-o", "f"], "replicas": 1, "profile": "p"}`,
		"want a positive duration":      `{"name": "a", "trace": "x", "replicas": 1, "profile": "p", "slo": "soon"}`,
		"want >= 1 and a profile":       `{"name": "a", "trace": "x", "replicas": 0, "profile": "p"}`,
		`unknown field "kv"`:            `{"name": "a", "trace": "x", "replicas": 1, "profile": "p", "kv": 1}`,
		"member 1: give exactly one of": `{"name": "a", "trace": "x", "replicas": 1, "profile": "p"}, {"name": "b", "replicas": 1, "profile": "p"}`,
	} {
		path := filepath.Join(t.TempDir(), "set.json")
		if err := os.WriteFile(path, []byte(`{"members": [`+members+`]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readEvalSet(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", members, err, want)
		}
	}
}

// TestBundledEvalSet checks the repository's set: it parses, each trace
// file exists and each gen argv generates a trace.
func TestBundledEvalSet(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "evalset.json")
	set, err := readEvalSet(path)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs(filepath.Join("..", "..", ".."))
	for _, m := range set.Members {
		if m.Trace != "" {
			if _, err := os.Stat(filepath.Join(root, m.Trace)); err != nil {
				t.Errorf("member %s: %v", m.Name, err)
			}
			continue
		}
		out := filepath.Join(t.TempDir(), "t.jsonl")
		if err := genTrace(context.Background(), m.Gen, out); err != nil {
			t.Errorf("member %s: %v", m.Name, err)
			continue
		}
		if recs, err := workload.ReadFile(out, workload.DefaultBlockSize); err != nil || len(recs) < 2 {
			t.Errorf("member %s: %d records, %v", m.Name, len(recs), err)
		}
	}
}
