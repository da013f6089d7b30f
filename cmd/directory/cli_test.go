package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// runInProcess runs the command as main does, in this process.
func runInProcess(_ *testing.T, env []string, args ...string) clitest.Result {
	var stdout, stderr bytes.Buffer
	code := run(args, env, &stdout, &stderr, nil)
	return clitest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

func TestCLI(t *testing.T) {
	var vars []string
	newSettings(nil, io.Discard, io.Discard).prog.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("DIRECTORY", f.Name)) })
	clitest.Checks{
		Name: "directory",
		Help: []clitest.HelpCase{{Want: append(vars, "Examples:", "KVDIR_DIRECTORY_CONFIG", "KVDIR_DIRECTORY_LOG_FORMAT", "(default 127.0.0.1:7000)")}},
		Usage: []clitest.UsageCase{
			{Want: "--node-id: a node id is required"},
			{Args: []string{"--node-id", "n1"}, Env: []string{"KVDIR_DIRECTORY_LEASE=10"}, Want: `KVDIR_DIRECTORY_LEASE="10": not a duration`},
			{Args: []string{"--node-id", "n1", "--tls-key", "k"}, Want: "--tls-key is set without --tls-cert"},
		},
	}.Run(t, runInProcess)

	// A variable sets its flag; the flag beats it. An unknown variable of
	// the prefix is reported.
	l, err := loadSettings([]string{"--election-timeout", "3s"}, []string{"KVDIR_DIRECTORY_NODE_ID=env", "KVDIR_DIRECTORY_ELECTION_TIMEOUT=2s",
		"KVDIR_DIRECTORY_HEARTBEAT_TIMEOUT=500ms", "KVDIR_DIRECTORY_NODEID=typo", "KVDIR_AGENT_WORKER_ID=not-ours"})
	if err != nil {
		t.Fatal(err)
	}
	if c := l.s.cfg; c.ID != "env" || c.ElectionTimeout != 3*time.Second || c.HeartbeatTimeout != 500*time.Millisecond {
		t.Errorf("config %+v", c)
	}
	if w := strings.Join(l.warnings, "\n"); !strings.Contains(w, "unknown environment variable KVDIR_DIRECTORY_NODEID") || strings.Contains(w, "KVDIR_AGENT") {
		t.Errorf("warnings %q", w)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	run := clitest.Binary(t, "directory")
	file := writeFile(t, t.TempDir(), "not-a-dir", "x", 0o600)
	clitest.Checks{
		Name: "directory",
		Help: []clitest.HelpCase{{Want: []string{"KVDIR_DIRECTORY_NODE_ID", "KVDIR_DIRECTORY_INITIAL_CLUSTER", "KVDIR_DIRECTORY_ADMIN_TOKEN_FILE"}}},
		Precedence: &clitest.PrecedenceCase{
			Env:     []string{"KVDIR_DIRECTORY_NODE_ID=n1", "KVDIR_DIRECTORY_LEASE=1ms"},
			WantEnv: "--lease: 1ms is too short",
			Flag:    []string{"--lease", "2ms"}, WantFlag: "--lease: 2ms is too short",
		},
		// A node that cannot start (its data directory is a file) exits 1.
		Failures: []clitest.FailureCase{{What: "start failure",
			Args: []string{"--node-id", "n1", "--bootstrap", "--data-dir", file, "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:0", "--http-addr", "off"}}},
	}.Run(t, run)
}

// A variable of the scheme before KVDIR_DIRECTORY_ is refused with its new
// name, so that a deployment not yet updated does not run without it.
func TestOldVariables(t *testing.T) {
	clitest.UsageError(t, "directory", runInProcess(t, []string{"KVDIR_NODE_ID=n1"}),
		"environment variable KVDIR_NODE_ID is no longer read: rename it KVDIR_DIRECTORY_NODE_ID")
	clitest.UsageError(t, "directory", runInProcess(t, []string{"KVDIR_INITIAL_CLUSTER=n1=127.0.0.1:7000"}, "--node-id", "n1"),
		"rename it KVDIR_DIRECTORY_INITIAL_CLUSTER")
	// With the new variable set too, or the flag given, the old one is ignored.
	if _, err := loadSettings([]string{"--node-id", "n1"}, []string{"KVDIR_NODE_ID=old", "KVDIR_DIRECTORY_LEASE=1m", "KVDIR_LEASE=2m"}); err != nil {
		t.Errorf("old variables beside the new ones: %v", err)
	}
}
