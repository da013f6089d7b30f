package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// runInProcess runs the command as main does, in this process.
func runInProcess(args []string, environ map[string]string) clitest.Result {
	var stdout, stderr bytes.Buffer
	code := runMain(context.Background(), args, env(environ), &stdout, &stderr)
	return clitest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "router", runInProcess([]string{"--version"}, nil))
	p, _ := newProgram(env(nil), io.Discard, io.Discard)
	var vars []string
	p.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("ROUTER", f.Name)) })
	clitest.Help(t, runInProcess([]string{"--help"}, nil), append(vars, "Examples:", "KVDIR_ROUTER_LOG_FORMAT", "(default 127.0.0.1:8080)")...)
	clitest.UsageError(t, "router", runInProcess([]string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "router", runInProcess(nil, nil), "give --directory")
	static := []string{"--workers", "a=http://127.0.0.1:1", "--addr", "127.0.0.1:0"}
	clitest.UsageError(t, "router", runInProcess(append(static, "--policy", "fastest"), nil), "--policy")
	clitest.UsageError(t, "router", runInProcess(append(static, "--tokenizer", "remote"), nil), "--tokenize-url")
	clitest.UsageError(t, "router", runInProcess([]string{"--workers", "a=ftp://x"}, nil), "scheme")
	clitest.UsageError(t, "router", runInProcess(static, map[string]string{"KVDIR_ROUTER_MATCH_TIMEOUT": "soon"}), `KVDIR_ROUTER_MATCH_TIMEOUT="soon"`)

	// A variable sets its flag; the flag beats it.
	_, o, err := parseFlags([]string{"--policy", "prefix"}, env(map[string]string{"KVDIR_ROUTER_POLICY": "round-robin",
		"KVDIR_ROUTER_WORKERS": "a=http://h:1", "KVDIR_ROUTER_MATCH_TIMEOUT": "7ms"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.policy != "prefix" || o.workers != "a=http://h:1" || o.cfg.MatchTimeout != 7*time.Millisecond {
		t.Errorf("options %+v", o)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	bin := clitest.Build(t, "router")
	clitest.Version(t, "router", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "--help"), "KVDIR_ROUTER_DIRECTORY", "KVDIR_ROUTER_POLICY", "KVDIR_ROUTER_LOG_LEVEL")
	clitest.UsageError(t, "router", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	base := []string{"KVDIR_ROUTER_WORKERS=a=http://127.0.0.1:1", "KVDIR_ROUTER_ADDR=127.0.0.1:0", "KVDIR_ROUTER_POLICY=fastest"}
	clitest.UsageError(t, "router", clitest.Exec(t, bin, base), `"fastest"`)
	r := clitest.Exec(t, bin, base, "--policy", "slowest")
	clitest.UsageError(t, "router", r, `"slowest"`)
	if strings.Contains(r.Stderr, "fastest") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
}
