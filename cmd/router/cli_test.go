package main

import (
	"io"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

func TestCLI(t *testing.T) {
	p, _ := newProgram(env(nil), io.Discard, io.Discard)
	var vars []string
	p.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("ROUTER", f.Name)) })
	static := []string{"--workers", "a=http://127.0.0.1:1", "--addr", "127.0.0.1:0"}
	clitest.Checks{
		Name: "router",
		Help: []clitest.HelpCase{{Want: append(vars, "Examples:", "KVDIR_ROUTER_LOG_FORMAT", "(default 127.0.0.1:8080)")}},
		Usage: []clitest.UsageCase{
			{Want: "give --directory"},
			{Args: append(static, "--policy", "fastest"), Want: "--policy"},
			{Args: append(static, "--tokenizer", "remote"), Want: "--tokenize-url"},
			{Args: []string{"--workers", "a=ftp://x"}, Want: "scheme"},
			{Args: append(static, "--worker-selector", "pool=a"), Want: "--worker-selector picks among the directory's registered workers"},
			{Args: []string{"--directory", "127.0.0.1:1", "--worker-selector", "pool"}, Want: "--worker-selector"},
			{Args: static, Env: []string{"KVDIR_ROUTER_MATCH_TIMEOUT=soon"}, Want: `KVDIR_ROUTER_MATCH_TIMEOUT="soon"`},
		},
	}.Run(t, clitest.InProcess(runMain))

	// A variable sets its flag; the flag beats it.
	_, o, err := parseFlags([]string{"--policy", "prefix"}, env(map[string]string{"KVDIR_ROUTER_POLICY": "round-robin",
		"KVDIR_ROUTER_WORKERS": "a=http://h:1", "KVDIR_ROUTER_MATCH_TIMEOUT": "7ms"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.policy != "prefix" || o.workers != "a=http://h:1" || o.cfg.MatchTimeout != 7*time.Millisecond {
		t.Errorf("options %+v", o)
	}
	_, o, err = parseFlags([]string{"--directory", "127.0.0.1:1"}, env(map[string]string{"KVDIR_ROUTER_WORKER_SELECTOR": "kvdir.io/inference-pool=vllm,zone=z1"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if sel := o.cfg.WorkerSelector; len(sel) != 2 || sel["kvdir.io/inference-pool"] != "vllm" || sel["zone"] != "z1" {
		t.Errorf("worker selector %v", sel)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	clitest.Checks{
		Name: "router",
		Help: []clitest.HelpCase{{Want: []string{"KVDIR_ROUTER_DIRECTORY", "KVDIR_ROUTER_POLICY", "KVDIR_ROUTER_LOG_LEVEL"}}},
		Precedence: &clitest.PrecedenceCase{
			Env:     []string{"KVDIR_ROUTER_WORKERS=a=http://127.0.0.1:1", "KVDIR_ROUTER_ADDR=127.0.0.1:0", "KVDIR_ROUTER_POLICY=fastest"},
			WantEnv: `"fastest"`,
			Flag:    []string{"--policy", "slowest"}, WantFlag: `"slowest"`, NotWant: "fastest",
		},
	}.Run(t, clitest.Binary(t, "router"))
}
