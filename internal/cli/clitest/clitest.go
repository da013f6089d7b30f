// Package clitest holds the checks every kvdir binary's tests make of its
// command line (internal/cli): --version, --help, a usage error, and the
// built binary's exit codes.
package clitest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

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
