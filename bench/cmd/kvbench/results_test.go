package main

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit"
)

// TestIndexWritesEnvelope runs kvbench index at a tiny size and checks the
// file it writes, command line included.
func TestIndexWritesEnvelope(t *testing.T) {
	testkit.SkipIfShort(t, "runs the index benchmark, 10 s or more under -race")
	out := filepath.Join(t.TempDir(), "results", "index.json")
	args := []string{"index", "--scale", "0.001", "--matches", "200", "--churn-events", "10000", "--chain", "64",
		"--goradix-scale", "-1", "--out", out}
	if err := run(t, args...); err != nil {
		t.Fatal(err)
	}
	res, err := benchjson.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []string{"kvbench", "index", "--chain=64", "--churn-events=10000", "--goradix-scale=-1", "--matches=200", "--out=" + out, "--scale=0.001"}
	if !slices.Equal(res.Command, want) {
		t.Fatalf("command %q, want %q", res.Command, want)
	}
	if _, ok := res.Figure("goradix_comparison.goradix_match_p50_us"); ok {
		t.Fatal("go-radix comparison ran with --goradix-scale -1")
	}
}

// TestCommandRecordsEnvironment checks that a flag set from its
// environment variable is in the recorded command, which must reproduce
// the run.
func TestCommandRecordsEnvironment(t *testing.T) {
	testkit.SkipIfShort(t, "runs the index benchmark, 10 s or more under -race")
	out := filepath.Join(t.TempDir(), "index.json")
	env := map[string]string{"KVDIR_BENCH_SCALE": "0.001", "KVDIR_BENCH_CHAIN": "64"}
	var stderr strings.Builder
	code := runMain(context.Background(), []string{"index", "--matches", "200", "--churn-events", "10000", "--goradix-scale", "-1", "--out", out},
		func(k string) string { return env[k] }, io.Discard, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	res, err := benchjson.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kvbench", "index", "--chain=64", "--churn-events=10000", "--goradix-scale=-1", "--matches=200", "--out=" + out, "--scale=0.001"}
	if !slices.Equal(res.Command, want) {
		t.Fatalf("command %q, want %q", res.Command, want)
	}
}

// TestDocsCheck runs kvbench docs --check on the repository: every
// generated block matches bench/results.
func TestDocsCheck(t *testing.T) {
	if err := run(t, "docs", "--check", "--root", "."); err != nil {
		t.Fatal(err)
	}
}
