package main

import (
	"testing"

	"github.com/kvdir/kvdir/internal/cli/clitest"
)

func TestCLI(t *testing.T) {
	clitest.Checks{
		Name: "kvbench",
		Help: []clitest.HelpCase{
			{Want: []string{"KVDIR_BENCH_LOG_LEVEL", "KVDIR_BENCH_LOG_FORMAT", "Exit status"}},
			{Args: []string{"sim"}, Want: []string{"KVDIR_BENCH_TRACE", "KVDIR_BENCH_REPLICAS", "KVDIR_BENCH_POLICIES", "KVDIR_BENCH_LOG_LEVEL"}},
			{Args: []string{"gen", "sessions"}, Want: []string{"KVDIR_BENCH_PRESET", "KVDIR_BENCH_SESSIONS", "system-heavy", "long-agent"}},
			{Args: []string{"gen", "rag"}, Want: []string{"KVDIR_BENCH_ZIPF_S", "in the order retrieved", "--follow-ups"}},
			{Args: []string{"gen", "rollouts"}, Want: []string{"KVDIR_BENCH_SIBLINGS", "--second-round"}},
			{Args: []string{"gen", "mix"}, Want: []string{"KVDIR_BENCH_CLASSIFY_FRACTION", "chat"}},
			{Args: []string{"sweep"}, Want: []string{"capacity at an SLO", "KVDIR_BENCH_SLO", "KVDIR_BENCH_KV_RATIO", "KVDIR_BENCH_PRECISION"}},
			{Args: []string{"eval"}, Want: []string{"evaluation set", "KVDIR_BENCH_MEMBERS", "KVDIR_BENCH_OUT_DIR"}},
		},
		Usage: []clitest.UsageCase{
			{Args: []string{"sim", "--nope"}, Want: "unknown flag: --nope", Command: "kvbench sim"},
			{Args: []string{"sim"}, Want: "--trace is required", Command: "kvbench sim"},
			{Args: []string{"sweep"}, Want: "--trace is required", Command: "kvbench sweep"},
			{Args: []string{"eval", "--parallel", "0"}, Want: "--parallel 0, want >= 1", Command: "kvbench eval"},
			{Args: []string{"gen", "sessions", "--preset", "nope"}, Want: "unknown preset", Command: "kvbench gen sessions"},
			{Args: []string{"sim", "--log-level", "loud"}, Want: "unknown log level", Command: "kvbench sim"},
		},
		Precedence: &clitest.PrecedenceCase{
			Args: []string{"sim"}, Env: []string{"KVDIR_BENCH_TRACE=/nonexistent/trace.jsonl", "KVDIR_BENCH_PARALLEL=0"},
			WantEnv: "--parallel 0, want >= 1",
			Flag:    []string{"--parallel", "-3"}, WantFlag: "--parallel -3, want >= 1", NotWant: "--parallel 0", Command: "kvbench sim",
		},
		// A failing run (the trace does not exist) exits 1.
		Failures: []clitest.FailureCase{{What: "missing trace", Args: []string{"sim"}, Env: []string{"KVDIR_BENCH_TRACE=/nonexistent/trace.jsonl"}}},
	}.Run(t, clitest.InProcess(runMain))
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	clitest.Checks{
		Name: "kvbench",
		Help: []clitest.HelpCase{{Args: []string{"sim"}, Want: []string{"KVDIR_BENCH_TRACE", "KVDIR_BENCH_LOG_FORMAT"}}},
		Precedence: &clitest.PrecedenceCase{
			Args: []string{"sim"}, Env: []string{"KVDIR_BENCH_TRACE=/nonexistent/trace.jsonl", "KVDIR_BENCH_PARALLEL=0"},
			WantEnv: "--parallel 0", Flag: []string{"--parallel", "-3"}, WantFlag: "--parallel -3", Command: "kvbench sim",
		},
	}.Run(t, clitest.Binary(t, "bench/cmd/kvbench"))
}
