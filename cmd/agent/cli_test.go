package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

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

// allEnvVars lists the environment variable of every flag but --help and
// --version.
func allEnvVars() []string {
	p, _ := newProgram(env(nil), io.Discard, io.Discard)
	var out []string
	p.Flags().VisitAll(func(f *pflag.Flag) { out = append(out, cli.EnvVar("AGENT", f.Name)) })
	return append(out, "KVDIR_AGENT_LOG_LEVEL", "KVDIR_AGENT_LOG_FORMAT")
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "agent", runInProcess([]string{"--version"}, nil))
	clitest.Help(t, runInProcess([]string{"--help"}, nil), append(allEnvVars(), "Examples:", "--kv-events-endpoint", "(default tcp://127.0.0.1:5557)")...)
	clitest.UsageError(t, "agent", runInProcess([]string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "agent", runInProcess(nil, nil), "--directory and --worker-id are required")
	clitest.UsageError(t, "agent", runInProcess([]string{"--directory", "a:1", "--worker-id", "w", "--engine-kind", "tpu"}, nil), `unknown --engine-kind "tpu"`)
	clitest.UsageError(t, "agent", runInProcess([]string{"--directory", "a:1", "--worker-id", "w", "--worker-address", "10.0.0.1:8000"}, nil), "worker address")
	clitest.UsageError(t, "agent", runInProcess(nil, map[string]string{"KVDIR_AGENT_BATCH_INTERVAL": "soon"}), `KVDIR_AGENT_BATCH_INTERVAL="soon"`)
	clitest.UsageError(t, "agent", runInProcess([]string{"--log-format", "xml"}, nil), "unknown log format")

	// A variable sets its flag; the flag beats it.
	e := map[string]string{"KVDIR_AGENT_DIRECTORY": "a:1", "KVDIR_AGENT_WORKER_ID": "env", "KVDIR_AGENT_HTTP_ADDR": "127.0.0.1:1",
		"KVDIR_AGENT_LOG_LEVEL": "debug", "KVDIR_AGENT_ENGINE_KIND": "sglang"}
	p, o, err := parseFlags([]string{"--worker-id", "flag", "--engine-kind", "enginesim"}, env(e), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.WorkerID != "flag" || o.httpAddr != "127.0.0.1:1" || o.engineKind != "enginesim" || p.LogLevel().String() != "DEBUG" ||
		p.Source("worker-id") != cli.FromFlag || p.Source("http-addr") != cli.FromEnv {
		t.Errorf("options %+v", o)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	bin := clitest.Build(t, "agent")
	clitest.Version(t, "agent", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "--help"), "KVDIR_AGENT_DIRECTORY", "KVDIR_AGENT_WORKER_ID", "KVDIR_AGENT_LOG_FORMAT")
	clitest.UsageError(t, "agent", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	base := []string{"KVDIR_AGENT_DIRECTORY=127.0.0.1:1", "KVDIR_AGENT_WORKER_ID=w", "KVDIR_AGENT_DATA_PARALLEL_SIZE=999"}
	clitest.UsageError(t, "agent", clitest.Exec(t, bin, base), "--data-parallel-size 999")
	r := clitest.Exec(t, bin, base, "--data-parallel-size", "300")
	clitest.UsageError(t, "agent", r, "--data-parallel-size 300")
	if strings.Contains(r.Stderr, "999") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
}
