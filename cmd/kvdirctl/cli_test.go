package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// runInProcess runs the command as main does, in this process.
func runInProcess(t *testing.T, args []string, environ map[string]string) clitest.Result {
	out, errOut, code := ctl(t, env(environ), args...)
	return clitest.Result{Code: code, Stdout: out, Stderr: errOut}
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "kvdirctl", runInProcess(t, []string{"--version"}, nil))
	a := &app{getenv: env(nil)}
	root := a.rootCommand()
	var vars []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("CTL", f.Name)) })
	clitest.Help(t, runInProcess(t, []string{"--help"}, nil), append(vars, "KVDIR_CTL_LOG_LEVEL", "Exit status")...)
	clitest.Help(t, runInProcess(t, []string{"explain", "--help"}, nil), "KVDIR_CTL_ROUTER", "KVDIR_CTL_SESSION_HEADER", "KVDIR_CTL_DIRECTORY")
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"status", "--nope"}, nil), "unknown flag: --nope", "kvdirctl status")
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"staus"}, nil), `unknown command "staus"`)
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"status", "--log-level", "loud"}, nil), "unknown log level", "kvdirctl status")

	// A variable sets its flag; the flag beats it.
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"status"}, map[string]string{"KVDIR_CTL_OUTPUT": "xml"}), `"xml"`, "kvdirctl status")
	r := runInProcess(t, []string{"status", "-o", "csv"}, map[string]string{"KVDIR_CTL_OUTPUT": "xml"})
	clitest.UsageError(t, "kvdirctl", r, `"csv"`, "kvdirctl status")
	if strings.Contains(r.Stderr, "xml") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	bin := clitest.Build(t, "kvdirctl")
	clitest.Version(t, "kvdirctl", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "--help"), "KVDIR_CTL_DIRECTORY", "KVDIR_CTL_TOKEN_FILE")
	clitest.UsageError(t, "kvdirctl", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	base := []string{"KVDIR_CTL_DIRECTORY=nodeport"}
	clitest.UsageError(t, "kvdirctl", clitest.Exec(t, bin, base, "status"), `--directory "nodeport": missing port`, "kvdirctl status")
	r := clitest.Exec(t, bin, base, "status", "--directory", "http://a:1")
	clitest.UsageError(t, "kvdirctl", r, "without a scheme", "kvdirctl status")
	if strings.Contains(r.Stderr, "nodeport") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
	// A directory that does not answer is a failure, not a usage error.
	if r := clitest.Exec(t, bin, nil, "--directory", "127.0.0.1:1", "--timeout", "300ms", "--dial-timeout", "200ms", "status"); r.Code != cli.ExitError {
		t.Errorf("unreachable directory: exit %d, want 1; stderr %s", r.Code, r.Stderr)
	}
}

// A KVDIRCTL_ variable (the scheme before KVDIR_CTL_) is refused with its
// new name.
func TestOldVariables(t *testing.T) {
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"status"}, map[string]string{"KVDIRCTL_DIRECTORY": "10.0.0.1:7001"}),
		"environment variable KVDIRCTL_DIRECTORY is no longer read: rename it KVDIR_CTL_DIRECTORY", "kvdirctl status")
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"explain", "--model", "m", "--chat", "hi"}, map[string]string{"KVDIRCTL_ROUTER": "http://r:8080"}),
		"rename it KVDIR_CTL_ROUTER", "kvdirctl explain")
}
