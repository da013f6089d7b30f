package main

import (
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/cli/clitest"
)

func TestCLI(t *testing.T) {
	var cfg config
	p := newProgram(&cfg, func(string) string { return "" }, io.Discard, io.Discard)
	var vars []string
	p.Flags().VisitAll(func(f *pflag.Flag) { vars = append(vars, cli.EnvVar("ENGINESIM", f.Name)) })
	clitest.Checks{
		Name: "enginesim",
		Help: []clitest.HelpCase{{Want: append(vars, "Examples:", "KVDIR_ENGINESIM_LOG_LEVEL", "(default 32768)")}},
		Usage: []clitest.UsageCase{
			{Args: []string{"--kv-blocks", "0"}, Want: "must be positive"},
			{Args: []string{"--profile", "gpt-9"}, Want: "--profile"},
			{Args: []string{"--kv-events-form", "xml"}, Want: "--kv-events-form"},
			{Args: []string{"--kv-events-bind"}, Want: "--kv-events-bind needs --kv-events-endpoint"},
			{Env: []string{"KVDIR_ENGINESIM_TIME_SCALE=fast"}, Want: `KVDIR_ENGINESIM_TIME_SCALE="fast"`},
		},
		Failures: []clitest.FailureCase{{What: "listen failure", Args: []string{"--addr", "256.0.0.1:1"}}},
	}.Run(t, clitest.InProcess(runMain))

	// A variable sets its flag; the flag beats it.
	env := map[string]string{"KVDIR_ENGINESIM_KV_BLOCKS": "123", "KVDIR_ENGINESIM_SEED": "5"}
	cfg, err := parseConfig([]string{"--kv-blocks", "77"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.kvBlocks != 77 || cfg.seed != 5 {
		t.Errorf("cfg %+v, err %v", cfg, err)
	}
}

// TestProcessExitCodes runs the built binary.
func TestProcessExitCodes(t *testing.T) {
	clitest.Checks{
		Name: "enginesim",
		Help: []clitest.HelpCase{{Want: []string{"KVDIR_ENGINESIM_KV_BLOCKS", "KVDIR_ENGINESIM_KV_EVENTS_ENDPOINT"}}},
		Precedence: &clitest.PrecedenceCase{
			Env:     []string{"KVDIR_ENGINESIM_DEFAULT_MAX_TOKENS=-4"},
			WantEnv: "--default-max-tokens -4",
			Flag:    []string{"--default-max-tokens", "-9"}, WantFlag: "--default-max-tokens -9", NotWant: "-4",
		},
	}.Run(t, clitest.Binary(t, "enginesim"))
}
