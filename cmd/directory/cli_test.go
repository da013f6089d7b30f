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
func runInProcess(args, env []string) clitest.Result {
	var stdout, stderr bytes.Buffer
	code := run(args, env, &stdout, &stderr, nil)
	return clitest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "directory", runInProcess([]string{"--version"}, nil))
	var vars []string
	newSettings(nil, io.Discard, io.Discard).prog.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("DIRECTORY", f.Name)) })
	clitest.Help(t, runInProcess([]string{"--help"}, nil), append(vars, "Examples:", "KVDIR_DIRECTORY_CONFIG", "KVDIR_DIRECTORY_LOG_FORMAT", "(default 127.0.0.1:7000)")...)
	clitest.UsageError(t, "directory", runInProcess([]string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "directory", runInProcess(nil, nil), "--node-id: a node id is required")
	clitest.UsageError(t, "directory", runInProcess([]string{"--node-id", "n1"}, []string{"KVDIR_DIRECTORY_LEASE=10"}), `KVDIR_DIRECTORY_LEASE="10": not a duration`)
	clitest.UsageError(t, "directory", runInProcess([]string{"--node-id", "n1", "--tls-key", "k"}, nil), "--tls-key is set without --tls-cert")

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
	bin := clitest.Build(t, "directory")
	clitest.Version(t, "directory", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "--help"), "KVDIR_DIRECTORY_NODE_ID", "KVDIR_DIRECTORY_INITIAL_CLUSTER", "KVDIR_DIRECTORY_ADMIN_TOKEN_FILE")
	clitest.UsageError(t, "directory", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	env := []string{"KVDIR_DIRECTORY_NODE_ID=n1", "KVDIR_DIRECTORY_LEASE=1ms"}
	clitest.UsageError(t, "directory", clitest.Exec(t, bin, env), "--lease: 1ms is too short")
	r := clitest.Exec(t, bin, env, "--lease", "2ms")
	clitest.UsageError(t, "directory", r, "--lease: 2ms is too short")
	// A node that cannot start (its data directory is a file) exits 1.
	file := writeFile(t, t.TempDir(), "not-a-dir", "x", 0o600)
	if r := clitest.Exec(t, bin, nil, "--node-id", "n1", "--bootstrap", "--data-dir", file, "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:0", "--http-addr", "off"); r.Code != cli.ExitError {
		t.Errorf("start failure: exit %d, want 1; stderr %s", r.Code, r.Stderr)
	}
}

// A variable of the scheme before KVDIR_DIRECTORY_ is refused with its new
// name, so that a deployment not yet updated does not run without it.
func TestOldVariables(t *testing.T) {
	clitest.UsageError(t, "directory", runInProcess(nil, []string{"KVDIR_NODE_ID=n1"}),
		"environment variable KVDIR_NODE_ID is no longer read: rename it KVDIR_DIRECTORY_NODE_ID")
	clitest.UsageError(t, "directory", runInProcess([]string{"--node-id", "n1"}, []string{"KVDIR_INITIAL_CLUSTER=n1=127.0.0.1:7000"}),
		"rename it KVDIR_DIRECTORY_INITIAL_CLUSTER")
	// With the new variable set too, or the flag given, the old one is ignored.
	if _, err := loadSettings([]string{"--node-id", "n1"}, []string{"KVDIR_NODE_ID=old", "KVDIR_DIRECTORY_LEASE=1m", "KVDIR_LEASE=2m"}); err != nil {
		t.Errorf("old variables beside the new ones: %v", err)
	}
}
