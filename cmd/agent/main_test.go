package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/cli"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseFlagsEnv(t *testing.T) {
	_, o, err := parseFlags([]string{"--worker-id", "flag-wins"}, env(map[string]string{
		"KVDIR_AGENT_WORKER_ID":      "from-env",
		"KVDIR_AGENT_DIRECTORY":      "a:1,b:2",
		"KVDIR_AGENT_WORKER_ADDRESS": "http://e:8000/",
		"KVDIR_AGENT_BATCH_INTERVAL": "25ms",
		"KVDIR_AGENT_KV_EVENTS_BIND": "true",
	}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.WorkerID != "flag-wins" || strings.Join(o.directory, ",") != "a:1,b:2" || o.cfg.BatchInterval != 25*time.Millisecond || !o.cfg.Bind {
		t.Fatalf("options %+v", o)
	}
	if o.cfg.MetricsURL != "http://e:8000/metrics" {
		t.Fatalf("metrics url %q", o.cfg.MetricsURL)
	}
	_, o, err = parseFlags([]string{"--worker-id", "w", "--directory", "a:1", "--labels", "kvdir.io/inference-pool=vllm, zone=z1"}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if l := o.cfg.Labels; len(l) != 2 || l["kvdir.io/inference-pool"] != "vllm" || l["zone"] != "z1" {
		t.Fatalf("labels %v", l)
	}
	if _, _, err := parseFlags([]string{"--worker-id", "w", "--directory", "a:1", "--labels", "zone"}, env(nil), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) {
		t.Fatalf("a label without a value accepted, or not as a usage error: %v", err)
	}
	if _, _, err := parseFlags(nil, env(nil), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) {
		t.Fatalf("missing --directory accepted, or not as a usage error: %v", err)
	}
	if _, _, err := parseFlags(nil, env(map[string]string{"KVDIR_AGENT_DIRECTORY": "a", "KVDIR_AGENT_WORKER_ID": "w",
		"KVDIR_AGENT_BATCH_BLOCKS": "x"}), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) {
		t.Fatalf("bad env value accepted, or not as a usage error: %v", err)
	}
	if _, err := engineKind("nope"); err == nil {
		t.Fatal("bad engine kind accepted")
	}
}

// Without a reachable directory the agent keeps retrying; cancelling (as
// SIGTERM does) makes run return nil.
func TestRunStopsCleanly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := run(ctx, []string{"--directory", "127.0.0.1:1", "--worker-id", "w", "--http-addr", "127.0.0.1:0",
		"--kv-events-endpoint", "tcp://127.0.0.1:1", "--log-level", "error"}, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
}

// --kv-report-mode maps onto the agent's report mode; the default is
// vLLM's incremental reports, and another word is a usage error.
func TestReportModeFlag(t *testing.T) {
	base := map[string]string{"KVDIR_AGENT_DIRECTORY": "a:1", "KVDIR_AGENT_WORKER_ID": "w"}
	_, o, err := parseFlags(nil, env(base), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ReportMode != agent.ReportIncremental {
		t.Fatalf("default report mode %v", o.cfg.ReportMode)
	}
	_, o, err = parseFlags([]string{"--kv-report-mode", "full"}, env(base), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ReportMode != agent.ReportFull {
		t.Fatalf("--kv-report-mode full gave %v", o.cfg.ReportMode)
	}
	if _, _, err := parseFlags([]string{"--kv-report-mode", "sometimes"}, env(base), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) {
		t.Fatalf("a bad report mode was accepted, or not as a usage error: %v", err)
	}
}

// TestDirectorySecurityFlags reads the token from --token-file and refuses
// it beside --token, and a --tls-server-name without --tls-ca.
func TestDirectorySecurityFlags(t *testing.T) {
	f := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(f, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--directory", "a:1", "--worker-id", "w", "--token-file", f}
	_, o, err := parseFlags(base, env(nil), io.Discard, io.Discard)
	if err != nil || o.token != "s3cret" {
		t.Fatalf("--token-file: token %q, err %v", o.token, err)
	}
	for _, extra := range [][]string{{"--token", "x"}, {"--tls-server-name", "kvdir-dir1"}, {"--tls-ca", f}} {
		if _, _, err := parseFlags(append(append([]string{}, base...), extra...), env(nil), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) {
			t.Errorf("%q accepted, or not as a usage error: %v", extra, err)
		}
	}
}
