// Package clitest holds the checks every kvdir binary's tests make of its
// command line (internal/cli): --version, --help, a usage error, and the
// built binary's exit codes.
//
// A binary's test states its own cases in a Checks and runs them twice: in
// the test's process (InProcess on the binary's runMain) and on the built
// binary (Binary):
//
//	func TestCLI(t *testing.T) {
//		clitest.Checks{Name: "agent", Help: ..., Usage: ...}.Run(t, clitest.InProcess(runMain))
//	}
//
//	func TestProcessExitCodes(t *testing.T) {
//		clitest.Checks{Name: "agent", Help: ..., Precedence: ...}.Run(t, clitest.Binary(t, "agent"))
//	}
package clitest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/testkit"
)

// Result is what one run of a command gave.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Build builds cmd/<name> (or, for a name with a slash, that main package's
// folder from the module root) into a temporary directory of t and returns
// the binary's path. It skips t under -short (testkit.SkipIfShort): the unit
// tier runs no child processes.
func Build(t testing.TB, name string) string {
	t.Helper()
	testkit.SkipIfShort(t, "builds and runs the "+name+" binary as a child process")
	bins, err := testkit.Build(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	return bins[name]
}

// Exec runs bin with args and env (added to this process's environment
// without its KVDIR_ variables) and returns its exit code and output.
func Exec(t testing.TB, bin string, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVDIR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		t.Fatalf("run %s %q: %v", bin, args, err)
	}
	return r
}

// Version checks the result of --version: exit 0 and the version line.
func Version(t testing.TB, name string, r Result) {
	t.Helper()
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "kvdir "+name+" ") || !strings.Contains(r.Stdout, "(commit ") || !strings.Contains(r.Stdout, "go1.") {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want 0 and \"kvdir %s VERSION (commit C, goX ...)\"", r.Code, r.Stdout, r.Stderr, name)
	}
}

// Help checks the result of --help: exit 0, and every wanted text
// (environment variable names, say) in the output.
func Help(t testing.TB, r Result, want ...string) {
	t.Helper()
	if r.Code != 0 {
		t.Errorf("--help: exit %d, stderr %q; want 0", r.Code, r.Stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("--help does not name %s:\n%s", w, r.Stdout)
		}
	}
}

// UsageError checks a usage error: exit 2 and exactly the two lines
// "<name>: <error>" (the error containing want) and "Run '<command>
// --help' for usage." on stderr, command defaulting to name.
func UsageError(t testing.TB, name string, r Result, want string, command ...string) {
	t.Helper()
	cmd := name
	if len(command) > 0 {
		cmd = command[0]
	}
	lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
	if r.Code != 2 || len(lines) != 2 || !strings.HasPrefix(lines[0], name+": ") || !strings.Contains(lines[0], want) ||
		lines[1] != "Run '"+cmd+" --help' for usage." {
		t.Errorf("usage error: exit %d, stderr %q; want 2 and \"%s: ...%s...\" then \"Run '%s --help' for usage.\"", r.Code, r.Stderr, name, want, cmd)
	}
}

// Runner runs the command line under test with env ("KEY=value" entries,
// the only kvdir variables it sees) and args.
type Runner func(t *testing.T, env []string, args ...string) Result

// Main is the signature of a binary's runMain: the work of main with its
// arguments, environment and output given, returning the exit status.
type Main func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int

// InProcess is a Runner that calls main in the test's process.
func InProcess(main Main) Runner {
	return func(_ *testing.T, env []string, args ...string) Result {
		var stdout, stderr testkit.Buffer
		code := main(context.Background(), args, Getenv(env), &stdout, &stderr)
		return Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
	}
}

// Binary builds name (see Build; it skips t under -short) and returns a
// Runner of the binary (see Exec).
func Binary(t *testing.T, name string) Runner {
	t.Helper()
	bin := Build(t, name)
	return func(t *testing.T, env []string, args ...string) Result {
		t.Helper()
		return Exec(t, bin, env, args...)
	}
}

// Getenv looks keys up in env, a list of "KEY=value" entries.
func Getenv(env []string) func(string) string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

// Checks are one binary's cases of the checks every kvdir binary makes of
// its command line.
type Checks struct {
	// Name is the binary's name, as it reports itself.
	Name string
	// Help are the --help outputs to check.
	Help []HelpCase
	// Usage are usage errors beside the unknown flag --nope, which is
	// always checked.
	Usage []UsageCase
	// Precedence, when set, checks that a variable sets its flag and that
	// the flag beats it.
	Precedence *PrecedenceCase
	// Failures are runs that fail (exit 1) without a usage error.
	Failures []FailureCase
}

// HelpCase is one --help: Args (a subcommand; none: the binary's own help)
// then --help exit 0 and print every Want.
type HelpCase struct {
	Args []string
	Want []string
}

// UsageCase is one usage error: Args with Env exit 2 with an error
// containing Want and the pointer to Command's --help (see UsageError;
// empty Command: the binary's).
type UsageCase struct {
	Args    []string
	Env     []string
	Want    string
	Command string
}

// PrecedenceCase checks, with a value the binary refuses, that a variable
// sets its flag and the flag beats it: Args with Env is the usage error
// WantEnv; with Flag appended it is WantFlag, and stderr then has no
// NotWant (the variable's value; empty: not checked). Command is as in
// UsageCase.
type PrecedenceCase struct {
	Args     []string
	Env      []string
	WantEnv  string
	Flag     []string
	WantFlag string
	NotWant  string
	Command  string
}

// FailureCase is a run, Args with Env, that fails: exit 1 (cli.ExitError).
// What names it in the test's error.
type FailureCase struct {
	What string
	Args []string
	Env  []string
}

// Run makes the checks with run: --version, each Help, the unknown flag
// --nope, each Usage, Precedence and each Failure.
func (c Checks) Run(t *testing.T, run Runner) {
	t.Helper()
	Version(t, c.Name, run(t, nil, "--version"))
	for _, h := range c.Help {
		Help(t, run(t, nil, append(append([]string(nil), h.Args...), "--help")...), h.Want...)
	}
	UsageError(t, c.Name, run(t, nil, "--nope"), "unknown flag: --nope")
	for _, u := range c.Usage {
		UsageError(t, c.Name, run(t, u.Env, u.Args...), u.Want, c.command(u.Command)...)
	}
	if p := c.Precedence; p != nil {
		UsageError(t, c.Name, run(t, p.Env, p.Args...), p.WantEnv, c.command(p.Command)...)
		r := run(t, p.Env, append(append([]string(nil), p.Args...), p.Flag...)...)
		UsageError(t, c.Name, r, p.WantFlag, c.command(p.Command)...)
		if p.NotWant != "" && strings.Contains(r.Stderr, p.NotWant) {
			t.Errorf("the flag did not beat the variable: %s", r.Stderr)
		}
	}
	for _, f := range c.Failures {
		if r := run(t, f.Env, f.Args...); r.Code != cli.ExitError {
			t.Errorf("%s: exit %d, want %d; stderr %s", f.What, r.Code, cli.ExitError, r.Stderr)
		}
	}
}

func (c Checks) command(cmd string) []string {
	if cmd == "" {
		return nil
	}
	return []string{cmd}
}
