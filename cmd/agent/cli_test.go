package main

import (
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// allEnvVars lists the environment variable of every flag but --help and
// --version.
func allEnvVars() []string {
	p, _ := newProgram(env(nil), io.Discard, io.Discard)
	var out []string
	p.Flags().VisitAll(func(f *pflag.Flag) { out = append(out, cli.EnvVar("AGENT", f.Name)) })
	return append(out, "KVDIR_AGENT_LOG_LEVEL", "KVDIR_AGENT_LOG_FORMAT")
}

func TestCLI(t *testing.T) {
	clitest.Checks{
		Name: "agent",
		Help: []clitest.HelpCase{{Want: append(allEnvVars(), "Examples:", "--kv-events-endpoint", "(default tcp://127.0.0.1:5557)")}},
		Usage: []clitest.UsageCase{
			{Want: "--directory and --worker-id are required"},
			{Args: []string{"--directory", "a:1", "--worker-id", "w", "--engine-kind", "tpu"}, Want: `unknown --engine-kind "tpu"`},
			{Args: []string{"--directory", "a:1", "--worker-id", "w", "--worker-address", "10.0.0.1:8000"}, Want: "worker address"},
			{Env: []string{"KVDIR_AGENT_BATCH_INTERVAL=soon"}, Want: `KVDIR_AGENT_BATCH_INTERVAL="soon"`},
			{Args: []string{"--log-format", "xml"}, Want: "unknown log format"},
		},
	}.Run(t, clitest.InProcess(runMain))

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
	clitest.Checks{
		Name: "agent",
		Help: []clitest.HelpCase{{Want: []string{"KVDIR_AGENT_DIRECTORY", "KVDIR_AGENT_WORKER_ID", "KVDIR_AGENT_LOG_FORMAT"}}},
		Precedence: &clitest.PrecedenceCase{
			Env:     []string{"KVDIR_AGENT_DIRECTORY=127.0.0.1:1", "KVDIR_AGENT_WORKER_ID=w", "KVDIR_AGENT_DATA_PARALLEL_SIZE=999"},
			WantEnv: "--data-parallel-size 999",
			Flag:    []string{"--data-parallel-size", "300"}, WantFlag: "--data-parallel-size 300", NotWant: "999",
		},
	}.Run(t, clitest.Binary(t, "agent"))
}
