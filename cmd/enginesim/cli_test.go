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
func runInProcess(args []string, env map[string]string) clitest.Result {
	var stdout, stderr bytes.Buffer
	code := runMain(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	return clitest.Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

func TestCLI(t *testing.T) {
	clitest.Version(t, "enginesim", runInProcess([]string{"--version"}, nil))
	var cfg config
	p := newProgram(&cfg, func(string) string { return "" }, io.Discard, io.Discard)
	var vars []string
	p.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("ENGINESIM", f.Name)) })
	clitest.Help(t, runInProcess([]string{"--help"}, nil), append(vars, "Examples:", "KVDIR_ENGINESIM_LOG_LEVEL", "(default 32768)")...)
	clitest.UsageError(t, "enginesim", runInProcess([]string{"--nope"}, nil), "unknown flag: --nope")
	clitest.UsageError(t, "enginesim", runInProcess([]string{"--kv-blocks", "0"}, nil), "must be positive")
	clitest.UsageError(t, "enginesim", runInProcess([]string{"--profile", "gpt-9"}, nil), "--profile")
	clitest.UsageError(t, "enginesim", runInProcess([]string{"--kv-events-form", "xml"}, nil), "--kv-events-form")
	clitest.UsageError(t, "enginesim", runInProcess(nil, map[string]string{"KVDIR_ENGINESIM_TIME_SCALE": "fast"}), `KVDIR_ENGINESIM_TIME_SCALE="fast"`)
	if r := runInProcess([]string{"--addr", "256.0.0.1:1"}, nil); r.Code != cli.ExitError {
		t.Errorf("listen failure: exit %d, want 1 (%s)", r.Code, r.Stderr)
	}

	// A variable sets its flag; the flag beats it.
	env := map[string]string{"KVDIR_ENGINESIM_KV_BLOCKS": "123", "KVDIR_ENGINESIM_SEED": "5"}
	cfg, err := parseConfig([]string{"--kv-blocks", "77"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.kvBlocks != 77 || cfg.seed != 5 {
		t.Errorf("cfg %+v, err %v", cfg, err)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	bin := clitest.Build(t, "enginesim")
	clitest.Version(t, "enginesim", clitest.Exec(t, bin, nil, "--version"))
	clitest.Help(t, clitest.Exec(t, bin, nil, "--help"), "KVDIR_ENGINESIM_KV_BLOCKS", "KVDIR_ENGINESIM_KV_EVENTS_ENDPOINT")
	clitest.UsageError(t, "enginesim", clitest.Exec(t, bin, nil, "--nope"), "unknown flag: --nope")
	base := []string{"KVDIR_ENGINESIM_DEFAULT_MAX_TOKENS=-4"}
	clitest.UsageError(t, "enginesim", clitest.Exec(t, bin, base), "--default-max-tokens -4")
	r := clitest.Exec(t, bin, base, "--default-max-tokens", "-9")
	clitest.UsageError(t, "enginesim", r, "--default-max-tokens -9")
	if strings.Contains(r.Stderr, "-4") {
		t.Errorf("the flag did not beat the variable: %s", r.Stderr)
	}
}
