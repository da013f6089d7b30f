package main

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

// runInProcess runs the command as main does, in this process.
var runInProcess = clitest.InProcess(run)

func TestCLI(t *testing.T) {
	a := &app{getenv: env(nil)}
	root := a.rootCommand()
	var vars []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("CTL", f.Name)) })
	clitest.Checks{
		Name: "kvdirctl",
		Help: []clitest.HelpCase{
			{Want: append(vars, "KVDIR_CTL_LOG_LEVEL", "Exit status")},
			{Args: []string{"explain"}, Want: []string{"KVDIR_CTL_ROUTER", "KVDIR_CTL_SESSION_HEADER", "KVDIR_CTL_DIRECTORY"}},
		},
		Usage: []clitest.UsageCase{
			{Args: []string{"status", "--nope"}, Want: "unknown flag: --nope", Command: "kvdirctl status"},
			{Args: []string{"staus"}, Want: `unknown command "staus"`},
			{Args: []string{"status", "--log-level", "loud"}, Want: "unknown log level", Command: "kvdirctl status"},
		},
		Precedence: &clitest.PrecedenceCase{
			Args: []string{"status"}, Env: []string{"KVDIR_CTL_OUTPUT=xml"}, WantEnv: `"xml"`,
			Flag: []string{"-o", "csv"}, WantFlag: `"csv"`, NotWant: "xml", Command: "kvdirctl status",
		},
	}.Run(t, runInProcess)
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	clitest.Checks{
		Name: "kvdirctl",
		Help: []clitest.HelpCase{{Want: []string{"KVDIR_CTL_DIRECTORY", "KVDIR_CTL_TOKEN_FILE"}}},
		Precedence: &clitest.PrecedenceCase{
			Args: []string{"status"}, Env: []string{"KVDIR_CTL_DIRECTORY=nodeport"}, WantEnv: `--directory "nodeport": missing port`,
			Flag: []string{"--directory", "http://a:1"}, WantFlag: "without a scheme", NotWant: "nodeport", Command: "kvdirctl status",
		},
		// A directory that does not answer is a failure, not a usage error.
		Failures: []clitest.FailureCase{{What: "unreachable directory",
			Args: []string{"--directory", "127.0.0.1:1", "--timeout", "300ms", "--dial-timeout", "200ms", "status"}}},
	}.Run(t, clitest.Binary(t, "kvdirctl"))
}

// A KVDIRCTL_ variable (the scheme before KVDIR_CTL_) is refused with its
// new name.
func TestOldVariables(t *testing.T) {
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"KVDIRCTL_DIRECTORY=10.0.0.1:7001"}, "status"),
		"environment variable KVDIRCTL_DIRECTORY is no longer read: rename it KVDIR_CTL_DIRECTORY", "kvdirctl status")
	clitest.UsageError(t, "kvdirctl", runInProcess(t, []string{"KVDIRCTL_ROUTER=http://r:8080"}, "explain", "--model", "m", "--chat", "hi"),
		"rename it KVDIR_CTL_ROUTER", "kvdirctl explain")
}
