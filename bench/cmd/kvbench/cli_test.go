package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// runInProcess runs kvbench as main does, in this process.
func runInProcess(args []string, env map[string]string) clitest.Result {
	var stdout, stderr bytes.Buffer
	code := runMain(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	return clitest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "kvbench", runInProcess([]string{"--version"}, nil))
	clitest.Help(t, runInProcess([]string{"--help"}, nil), "KVDIR_BENCH_LOG_LEVEL", "KVDIR_BENCH_LOG_FORMAT", "Exit status")
	clitest.Help(t, runInProcess([]string{"sim", "--help"}, nil), "KVDIR_BENCH_TRACE", "KVDIR_BENCH_REPLICAS", "KVDIR_BENCH_POLICIES", "KVDIR_BENCH_LOG_LEVEL")
	clitest.Help(t, runInProcess([]string{"gen", "sessions", "--help"}, nil), "KVDIR_BENCH_PRESET", "KVDIR_BENCH_SESSIONS")
	clitest.UsageError(t, "kvbench", runInProcess([]string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "kvbench", runInProcess([]string{"sim", "--nope"}, nil), "unknown flag: --nope", "kvbench sim")
	clitest.UsageError(t, "kvbench", runInProcess([]string{"sim"}, nil), "--trace is required", "kvbench sim")
	clitest.UsageError(t, "kvbench", runInProcess([]string{"gen", "sessions", "--preset", "nope"}, nil), "unknown preset", "kvbench gen sessions")
	clitest.UsageError(t, "kvbench", runInProcess([]string{"sim", "--log-level", "loud"}, nil), "unknown log level", "kvbench sim")

	// A variable sets its flag; the flag beats it.
	env := map[string]string{"KVDIR_BENCH_TRACE": "/nonexistent/trace.jsonl", "KVDIR_BENCH_PARALLEL": "0"}
	clitest.UsageError(t, "kvbench", runInProcess([]string{"sim"}, env), "--parallel 0, want >= 1", "kvbench sim")
	r := runInProcess([]string{"sim", "--parallel", "-3"}, env)
	clitest.UsageError(t, "kvbench", r, "--parallel -3, want >= 1", "kvbench sim")
	if strings.Contains(r.Stderr, "--parallel 0") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
	// A failing run (the trace does not exist) exits 1.
	if r := runInProcess([]string{"sim"}, map[string]string{"KVDIR_BENCH_TRACE": "/nonexistent/trace.jsonl"}); r.Code != 1 {
		t.Errorf("missing trace: exit %d, want 1; stderr %s", r.Code, r.Stderr)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	bin := clitest.Build(t, "bench/cmd/kvbench")
	clitest.Version(t, "kvbench", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "sim", "--help"), "KVDIR_BENCH_TRACE", "KVDIR_BENCH_LOG_FORMAT")
	clitest.UsageError(t, "kvbench", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	env := []string{"KVDIR_BENCH_TRACE=/nonexistent/trace.jsonl", "KVDIR_BENCH_PARALLEL=0"}
	clitest.UsageError(t, "kvbench", clitest.Exec(t, bin, env, "sim"), "--parallel 0", "kvbench sim")
	clitest.UsageError(t, "kvbench", clitest.Exec(t, bin, env, "sim", "--parallel", "-3"), "--parallel -3", "kvbench sim")
}
