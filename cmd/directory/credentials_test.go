package main

import (
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/node"
)

func TestAgentCredentialsFlag(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "creds", "# agents\nteam-a team-a-secret-0123456789 pod-a-*,pod-a-*/*\n\nteam-b team-b-secret-0123456789 *\n", 0o600)
	base := []string{"--node-id", "n1", "--bootstrap", "--router-token", "router-secret-0123456789", "--admin-token", "admin-secret-0123456789"}
	l := mustLoad(t, append(base, "--agent-credentials", file), nil)
	creds := l.s.cfg.AgentCredentials
	if len(creds) != 2 || creds[0].Name != "team-a" || !creds[0].Allows("pod-a-1/dp0") || creds[0].Allows("pod-b-1") {
		t.Fatalf("credentials %+v", creds)
	}
	// The environment variable names the file too.
	l = mustLoad(t, base, []string{"KVDIR_DIRECTORY_AGENT_CREDENTIALS=" + file})
	if len(l.s.cfg.AgentCredentials) != 2 {
		t.Fatalf("from the environment: %+v", l.s.cfg.AgentCredentials)
	}
	// Bounds: defaults, and 0 for none.
	if c := l.s.cfg; c.MaxWorkersPerCredential != node.DefaultMaxWorkersPerCredential ||
		c.MaxStreamsPerCredential != node.DefaultMaxStreamsPerCredential || c.WorkerBlockQuota != node.DefaultWorkerBlockQuota {
		t.Fatalf("default bounds: %d %d %d", c.MaxWorkersPerCredential, c.MaxStreamsPerCredential, c.WorkerBlockQuota)
	}
	l = mustLoad(t, append(base, "--agent-credentials", file, "--max-workers-per-credential", "0",
		"--max-streams-per-credential", "0", "--worker-block-quota", "0"), nil)
	if c := l.s.cfg; c.MaxWorkersPerCredential != node.Unlimited || c.MaxStreamsPerCredential != node.Unlimited || c.WorkerBlockQuota != node.Unlimited {
		t.Fatalf("0 bounds: %d %d %d", c.MaxWorkersPerCredential, c.MaxStreamsPerCredential, c.WorkerBlockQuota)
	}

	for _, tc := range []struct {
		name, content string
		args          []string
		want          string
	}{
		{"bad line", "team-a secret\n", base, "line 1: want NAME TOKEN PATTERN"},
		{"bad glob", "# x\nteam-a team-a-secret-0123456789 [\n", base, "line 2: credential \"team-a\": pattern \"[\""},
		{"router token", "team-a router-secret-0123456789 *\n", base, "has the router token"},
		{"empty", "# nothing\n", base, "holds no credential"},
		{"no router token", "team-a team-a-secret-0123456789 *\n", []string{"--node-id", "n1", "--bootstrap"}, "router and admin"},
		{"negative bound", "team-a team-a-secret-0123456789 *\n", append(base, "--worker-block-quota", "-2"), "--worker-block-quota: -2 is negative"},
	} {
		f := writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "-"), tc.content, 0o600)
		_, err := loadSettings(append(tc.args, "--agent-credentials", f), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A file others may read is warned about.
	open := writeFile(t, dir, "open", "team-a team-a-secret-0123456789 *\n", 0o644)
	l = mustLoad(t, append(base, "--agent-credentials", open), nil)
	if !strings.Contains(strings.Join(l.warnings, "\n"), "chmod 600") {
		t.Fatalf("warnings %q", l.warnings)
	}
}
