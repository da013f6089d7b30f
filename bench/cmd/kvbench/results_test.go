package main

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/bench/benchjson"
)

// TestIndexWritesEnvelope runs kvbench index at a tiny size and checks the
// file it writes, command line included.
func TestIndexWritesEnvelope(t *testing.T) {
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

// TestDocsCheck runs kvbench docs --check on the repository: every
// generated block matches bench/results.
func TestDocsCheck(t *testing.T) {
	if err := run(t, "docs", "--check", "--root", "."); err != nil {
		t.Fatal(err)
	}
}
