package main

import (
	"bytes"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/testkit"
)

// writeFile writes content to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustLoad(t *testing.T, args, env []string) *loaded {
	t.Helper()
	l, err := loadSettings(args, env)
	if err != nil {
		t.Fatalf("loadSettings(%q, %q): %v", args, env, err)
	}
	return l
}

func TestDefaults(t *testing.T) {
	s := mustLoad(t, []string{"--node-id", "n1", "--bootstrap"}, nil).s
	checks := []struct {
		name      string
		got, want any
	}{
		{"raft-addr", s.cfg.RaftAddr, "127.0.0.1:7000"},
		{"api-addr", s.cfg.APIAddr, "127.0.0.1:7001"},
		{"http-addr", s.cfg.HTTPAddr, "127.0.0.1:7002"},
		{"data-dir", s.cfg.DataDir, filepath.Join("kvdir-data", "n1")},
		{"lease", s.cfg.Lease, 10 * time.Second},
		{"load-interval", s.cfg.LoadInterval, time.Second},
		{"session-ttl", s.cfg.SessionTTL, 24 * time.Hour},
		{"max-sessions", s.cfg.FSM.MaxSessions, 1_000_000},
		{"snapshot-threshold", s.cfg.SnapshotThreshold, uint64(8192)},
		{"trailing-logs", s.cfg.TrailingLogs, uint64(10240)},
		{"heartbeat-timeout", s.cfg.HeartbeatTimeout, time.Second},
		{"election-timeout", s.cfg.ElectionTimeout, time.Second},
		{"log-format (json)", s.prog.JSONLogs(), false},
		{"shutdown-timeout", s.shutdownTimeout, 30 * time.Second},
		{"pprof", s.cfg.Pprof, false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	cfg, err := s.nodeConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != "n1" || !cfg.Bootstrap || cfg.FSM.MaxSessions != 1_000_000 || cfg.FSM.Index.MaxWorkers != 65536 || cfg.TLS != nil {
		t.Errorf("node config: %+v", cfg)
	}
}

// TestPrecedence sets one option in several sources at once: a flag beats
// the environment, which beats the file, which beats the default.
func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "c.yaml", `
node-id: from-file
lease: 1m
load-interval: 2s
session-ttl: 3h
max-sessions: 7
join: [127.0.0.1:1, 127.0.0.1:2]
log-format: json
`, 0o600)
	env := []string{
		"KVDIR_DIRECTORY_CONFIG=" + file,
		"KVDIR_DIRECTORY_LEASE=2m",
		"KVDIR_DIRECTORY_LOAD_INTERVAL=3s",
		"KVDIR_DIRECTORY_MAX_SESSIONS=8",
		"PATH=/bin", // not ours: ignored
	}
	args := []string{"--lease", "3m", "--max-sessions=9"}
	s := mustLoad(t, args, env).s
	checks := []struct {
		name      string
		got, want any
	}{
		{"node-id (file)", s.cfg.ID, "from-file"},
		{"lease (flag over env and file)", s.cfg.Lease, 3 * time.Minute},
		{"load-interval (env over file)", s.cfg.LoadInterval, 3 * time.Second},
		{"session-ttl (file over default)", s.cfg.SessionTTL, 3 * time.Hour},
		{"max-sessions (flag)", s.cfg.FSM.MaxSessions, 9},
		{"join (file list)", strings.Join(s.cfg.Join, ","), "127.0.0.1:1,127.0.0.1:2"},
		{"log-format (file)", s.prog.JSONLogs(), true},
		{"election-timeout (default)", s.cfg.ElectionTimeout, time.Second},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// --config beats KVDIR_DIRECTORY_CONFIG.
	other := writeFile(t, dir, "other.yaml", "node-id: other\n", 0o600)
	s = mustLoad(t, []string{"--config", other}, env).s
	if s.cfg.ID != "other" || s.cfg.Lease != 2*time.Minute {
		t.Errorf("--config over KVDIR_DIRECTORY_CONFIG: node %q lease %v", s.cfg.ID, s.cfg.Lease)
	}

	// An empty environment variable counts as unset.
	s = mustLoad(t, []string{"--node-id", "n1"}, []string{"KVDIR_DIRECTORY_LEASE=", "KVDIR_DIRECTORY_HTTP_ADDR="}).s
	if s.cfg.Lease != 10*time.Second || s.cfg.HTTPAddr != "127.0.0.1:7002" {
		t.Errorf("empty env: lease %v http %q", s.cfg.Lease, s.cfg.HTTPAddr)
	}
}

func TestEnvironment(t *testing.T) {
	env := []string{
		"KVDIR_DIRECTORY_NODE_ID=n2",
		"KVDIR_DIRECTORY_RAFT_ADDR=127.0.0.1:7010",
		"KVDIR_DIRECTORY_INITIAL_CLUSTER=n1=127.0.0.1:7000, n2=127.0.0.1:7010",
		"KVDIR_DIRECTORY_HEARTBEAT_TIMEOUT=200ms",
		"KVDIR_DIRECTORY_ELECTION_TIMEOUT=400ms",
		"KVDIR_DIRECTORY_HTTP_ADDR=off",
		"KVDIR_DIRECTORY_LOG_LEVEL=debug",
		"KVDIR_DIRECTORY_SNAPSHOT_THRESHOLD=100",
		"KVDIR_DIRECTORY_BOOTSTRAP=false",
	}
	s := mustLoad(t, nil, env).s
	if s.cfg.ID != "n2" || s.cfg.RaftAddr != "127.0.0.1:7010" || s.cfg.HTTPAddr != "" ||
		s.cfg.HeartbeatTimeout != 200*time.Millisecond || s.cfg.ElectionTimeout != 400*time.Millisecond ||
		s.cfg.SnapshotThreshold != 100 || s.prog.LogLevel().String() != "DEBUG" {
		t.Errorf("settings from the environment: %+v", s)
	}
	if len(s.cfg.InitialCluster) != 2 || s.cfg.InitialCluster["n1"] != "127.0.0.1:7000" {
		t.Errorf("initial cluster: %v", s.cfg.InitialCluster)
	}
}

func TestConfigFileForms(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "c.yaml", `# a comment
node-id: n1
raft-addr: 127.0.0.1:7000
initial-cluster:
  n1: 127.0.0.1:7000
  n2: 127.0.0.1:7010
bootstrap: false
http-addr: ""
`, 0o600)
	s := mustLoad(t, []string{"--config", file}, nil).s
	if len(s.cfg.InitialCluster) != 2 || s.cfg.InitialCluster["n2"] != "127.0.0.1:7010" || s.cfg.HTTPAddr != "" {
		t.Errorf("mapping form: %v, http %q", s.cfg.InitialCluster, s.cfg.HTTPAddr)
	}
	file = writeFile(t, dir, "d.yaml", "node-id: n1\ninitial-cluster: [n1=127.0.0.1:7000, n2=127.0.0.1:7010]\n", 0o600)
	s = mustLoad(t, []string{"--config", file}, nil).s
	if len(s.cfg.InitialCluster) != 2 {
		t.Errorf("sequence form: %v", s.cfg.InitialCluster)
	}
	empty := writeFile(t, dir, "empty.yaml", "", 0o600)
	if s := mustLoad(t, []string{"--config", empty, "--node-id", "n1"}, nil).s; s.cfg.ID != "n1" {
		t.Errorf("empty file: %+v", s)
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := func(content string) string {
		return writeFile(t, dir, strings.ReplaceAll(t.Name(), "/", "_")+".yaml", content, 0o600)
	}
	cert := writeFile(t, dir, "cert.pem", "x", 0o600)
	tok := writeFile(t, dir, "tok", "secret\n", 0o600)
	emptyTok := writeFile(t, dir, "empty-tok", " \n", 0o600)
	base := []string{"--node-id", "n1"}
	cases := []struct {
		name string
		args []string
		env  []string
		file string // config file content, if any
		want string // in the error
	}{
		{name: "missing node id", args: []string{}, want: "--node-id: a node id is required: set --node-id or KVDIR_DIRECTORY_NODE_ID"},
		{name: "bad node id", args: []string{"--node-id", "a=b"}, want: "only letters"},
		{name: "unknown flag", args: []string{"--no-such-flag"}, want: "unknown flag: --no-such-flag"},
		{name: "positional", args: append(base, "extra"), want: `unexpected argument "extra"`},
		{name: "bad duration flag", args: append(base, "--lease", "10"), want: `invalid argument "10" for "--lease" flag: not a duration: "10"`},
		{name: "negative duration", args: append(base, "--lease=-1s"), want: "must be positive"},
		{name: "bad duration env", args: base, env: []string{"KVDIR_DIRECTORY_ELECTION_TIMEOUT=soon"}, want: `environment variable KVDIR_DIRECTORY_ELECTION_TIMEOUT="soon": not a duration`},
		{name: "bad duration file", args: base, file: "lease: ten\n", want: `key "lease": not a duration`},
		{name: "unknown key", args: base, file: "node-id: n1\nlaese: 1s\n", want: `(line 2): unknown key "laese"`},
		{name: "underscore key", args: base, file: "node_id: n1\n", want: `did you mean "node-id"?`},
		{name: "config key in file", args: base, file: "config: x.yaml\n", want: "it is a flag only"},
		{name: "duplicate key", args: base, file: "lease: 1s\nlease: 2s\n", want: "already set on line 1"},
		{name: "list for scalar", args: base, file: "lease: [1s, 2s]\n", want: "want a single value, not a list"},
		{name: "not a mapping", args: base, file: "- a\n- b\n", want: "want a mapping"},
		{name: "broken yaml", args: base, file: "lease: [1s\n", want: "config file"},
		{name: "missing config", args: append(base, "--config", filepath.Join(dir, "nope.yaml")), want: "read config file"},
		{name: "bad bool", args: base, env: []string{"KVDIR_DIRECTORY_BOOTSTRAP=yes please"}, want: `environment variable KVDIR_DIRECTORY_BOOTSTRAP="yes please": strconv.ParseBool`},
		{name: "bad int", args: append(base, "--max-sessions", "0"), want: "not a positive integer"},
		{name: "bootstrap and join", args: append(base, "--bootstrap", "--join", "127.0.0.1:7001"), want: "--bootstrap and --join: exclude each other: one starts a new cluster"},
		{name: "bootstrap and initial", args: append(base, "--bootstrap", "--initial-cluster", "n1=127.0.0.1:7000"), want: "--bootstrap and --initial-cluster: exclude each other"},
		{name: "initial and join", args: append(base, "--initial-cluster", "n1=127.0.0.1:7000", "--join", "127.0.0.1:7001"), want: "--initial-cluster and --join: exclude each other"},
		{name: "initial without self", args: append(base, "--initial-cluster", "n2=127.0.0.1:7010"), want: `--initial-cluster: does not list this node ("n1")`},
		{name: "initial wrong self address", args: append(base, "--initial-cluster", "n1=127.0.0.1:9999"), want: "--initial-cluster and --raft-advertise: the initial cluster lists n1 at 127.0.0.1:9999 but this node's Raft address is 127.0.0.1:7000: they must be the same"},
		{name: "initial duplicate id", args: append(base, "--initial-cluster", "n1=127.0.0.1:7000,n1=127.0.0.1:7010"), want: "listed twice"},
		{name: "initial duplicate address", args: append(base, "--initial-cluster", "n1=127.0.0.1:7000,n2=127.0.0.1:7000"), want: `--initial-cluster: members "n1" and "n2" have the same address 127.0.0.1:7000`},
		{name: "initial malformed", args: append(base, "--initial-cluster", "n1"), want: `item "n1": want key=value`},
		{name: "bad join address", args: append(base, "--join", "nohost"), want: `--join: address "nohost": want host:port`},
		{name: "raft port 0", args: append(base, "--raft-addr", "127.0.0.1:0"), want: "--raft-addr: address \"127.0.0.1:0\": port 0 is not allowed"},
		{name: "raft wildcard", args: append(base, "--raft-addr", "0.0.0.0:7000"), want: "--raft-addr and --raft-advertise: 0.0.0.0:7000 binds every interface"},
		{name: "bad port", args: append(base, "--api-addr", "127.0.0.1:http"), want: "--api-addr: address \"127.0.0.1:http\": port must be a number"},
		{name: "election below heartbeat", args: append(base, "--heartbeat-timeout", "2s", "--election-timeout", "1s"), want: "--election-timeout and --heartbeat-timeout: the election timeout 1s must be at least the heartbeat timeout 2s"},
		{name: "heartbeat too short", args: append(base, "--heartbeat-timeout", "1ms", "--election-timeout", "1ms"), want: "--heartbeat-timeout: 1ms is too short (at least 10ms)"},
		{name: "short lease", args: append(base, "--lease", "1ms"), want: "--lease: 1ms is too short (at least 100ms)"},
		{name: "tls key without cert", args: append(base, "--tls-key", "k.pem"), want: "--tls-key is set without --tls-cert"},
		{name: "tls cert without key", args: append(base, "--tls-cert", "c.pem"), want: "--tls-cert is set without --tls-key"},
		{name: "tls ca alone", args: append(base, "--tls-ca", cert), want: "--tls-ca is set without"},
		{name: "tls without ca", args: append(base, "--tls-cert", cert, "--tls-key", cert), want: "--tls-cert is set without --tls-ca: Raft runs over mutual TLS"},
		{name: "skip not a number", args: append(base, "--skip-undecodable-entry", "12,x"), want: `--skip-undecodable-entry: "x" is not a log index`},
		{name: "skip zero", args: append(base, "--skip-undecodable-entry", "0"), want: `--skip-undecodable-entry: "0" is not a log index`},
		{name: "one token only", args: append(base, "--admin-token-file", tok), want: "set the tokens of all three roles or of none; missing: agent, router"},
		{name: "token and file same level", args: append(base, "--admin-token", "a", "--admin-token-file", tok), want: "give one"},
		{name: "empty token file", args: append(base, "--admin-token-file", emptyTok), want: "is empty"},
		{name: "missing token file", args: append(base, "--admin-token-file", filepath.Join(dir, "nope")), want: "token file"},
		{name: "equal tokens", args: append(base, "--agent-token", "x", "--router-token", "x", "--admin-token", "y"), want: "must differ"},
		{name: "bad log level", args: append(base, "--log-level", "loud"), want: "unknown log level"},
		{name: "bad log format", args: append(base, "--log-format", "xml"), want: "unknown log format"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string(nil), c.args...)
			if c.file != "" {
				args = append(args, "--config", cfg(c.file))
			}
			_, err := loadSettings(args, c.env)
			if err == nil {
				t.Fatalf("no error; want one containing %q", c.want)
			}
			if !cli.IsUsage(err) {
				t.Errorf("error %v is not a usage error", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	agent := writeFile(t, dir, "agent", "agent-secret\n", 0o600)
	router := writeFile(t, dir, "router", "  router-secret  ", 0o600)
	admin := writeFile(t, dir, "admin", "admin-secret", 0o644)
	l := mustLoad(t, []string{"--node-id", "n1", "--agent-token-file", agent, "--router-token-file", router},
		[]string{"KVDIR_DIRECTORY_ADMIN_TOKEN_FILE=" + admin})
	s := l.s
	if s.tokens["agent"] != "agent-secret" || s.tokens["router"] != "router-secret" || s.tokens["admin"] != "admin-secret" {
		t.Errorf("tokens: %v", s.tokens)
	}
	if !strings.Contains(strings.Join(l.warnings, "\n"), "may be read by other users") {
		t.Errorf("no warning about a readable token file: %q", l.warnings)
	}
	// A token from a higher source beats a token file from a lower one,
	// and the other way round.
	s = mustLoad(t, []string{"--node-id", "n1", "--agent-token-file", agent, "--router-token", "r", "--admin-token", "a"},
		[]string{"KVDIR_DIRECTORY_AGENT_TOKEN=env-agent", "KVDIR_DIRECTORY_ROUTER_TOKEN_FILE=" + router}).s
	if s.tokens["agent"] != "agent-secret" || s.tokens["router"] != "r" {
		t.Errorf("token precedence: %v", s.tokens)
	}
	cfg, err := s.nodeConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tokens.Agent != "agent-secret" || cfg.Tokens.Router != "r" || cfg.Tokens.Admin != "a" {
		t.Errorf("node tokens: %+v", cfg.Tokens)
	}
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	cert := writeFile(t, dir, "cert.pem", string(certPEM), 0o600)
	key := writeFile(t, dir, "key.pem", string(keyPEM), 0o600)
	s := mustLoad(t, []string{"--node-id", "n1", "--tls-cert", cert, "--tls-key", key, "--tls-ca", cert}, nil).s
	cfg, err := s.nodeConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || len(cfg.TLS.Certificates) != 1 || cfg.ClientTLS == nil || cfg.ClientTLS.RootCAs == nil {
		t.Errorf("TLS not configured: %+v", cfg)
	}
	if cfg.RaftTLS == nil || cfg.RaftTLS.CA == nil {
		t.Errorf("TLS on but Raft not over mutual TLS: %+v", cfg.RaftTLS)
	}
	// A key that does not match, and a CA file without certificates.
	s = mustLoad(t, []string{"--node-id", "n1", "--tls-cert", cert, "--tls-key", cert, "--tls-ca", cert}, nil).s
	if _, err := s.nodeConfig(nil); err == nil || !cli.IsUsage(err) {
		t.Errorf("mismatched key: %v", err)
	}
	s = mustLoad(t, []string{"--node-id", "n1", "--tls-cert", cert, "--tls-key", key, "--tls-ca", key}, nil).s
	if _, err := s.nodeConfig(nil); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("CA without certificates: %v", err)
	}
}

// TestRaftTLSSettings: TLS runs Raft over mutual TLS unless --insecure-raft
// (warned about), and a certificate the other members would refuse stops
// the command with a usage error naming the flag and the reason.
func TestRaftTLSSettings(t *testing.T) {
	dir := t.TempDir()
	ca := testkit.MustCA(t, "cluster CA")
	caFile, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	files := func(name string, c *testkit.Cert) (string, string) {
		cert, key, err := c.Write(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	good, goodKey := files("n1", ca.MustIssue(t, []string{"127.0.0.1"}))
	args := func(cert, key string, more ...string) []string {
		return append([]string{"--node-id", "n1", "--tls-cert", cert, "--tls-key", key, "--tls-ca", caFile}, more...)
	}

	l := mustLoad(t, args(good, goodKey, "--insecure-raft"), nil)
	cfg, err := l.s.nodeConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RaftTLS != nil || cfg.TLS == nil {
		t.Errorf("--insecure-raft: RaftTLS %v, TLS %v; want Raft on plain TCP and the API on TLS", cfg.RaftTLS, cfg.TLS != nil)
	}
	if !slices.ContainsFunc(l.warnings, func(w string) bool { return strings.Contains(w, "--insecure-raft: Raft runs on plain TCP") }) {
		t.Errorf("--insecure-raft without a warning: %q", l.warnings)
	}

	for _, c := range []struct {
		name string
		cert *testkit.Cert
		more []string
		want string
	}{
		{"other host", ca.MustIssue(t, []string{"10.1.2.3"}), nil, "is not valid for 127.0.0.1, the host of this node's Raft address 127.0.0.1:7000"},
		{"server use only", ca.MustIssue(t, []string{"127.0.0.1"}, x509.ExtKeyUsageServerAuth), nil, "does not verify against the CA for clientAuth"},
		{"other CA", testkit.MustCA(t, "other CA").MustIssue(t, []string{"127.0.0.1"}), nil, "does not verify against the CA"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cert, key := files(strings.ReplaceAll(c.name, " ", "-"), c.cert)
			_, err := mustLoad(t, args(cert, key, c.more...), nil).s.nodeConfig(nil)
			if err == nil || !cli.IsUsage(err) || !strings.Contains(err.Error(), "--tls-cert: ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("nodeConfig: %v; want a usage error of --tls-cert containing %q", err, c.want)
			}
		})
	}
}

func TestRunUsageExits(t *testing.T) {
	cases := []struct {
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{[]string{"--help"}, exitOK, "three-node cluster on one machine", ""},
		{[]string{"-h"}, exitOK, "--initial-cluster", ""},
		{[]string{"--version"}, exitOK, "kvdir directory " + cli.Version(), ""},
		{[]string{}, exitUsage, "", "a node id is required"},
		{[]string{"--node-id", "n1", "--bootstrap", "--join", "127.0.0.1:1"}, exitUsage, "", "give one of them"},
		{[]string{"--node-id", "n1", "--tls-key", "k"}, exitUsage, "", "--tls-key is set without --tls-cert"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := run(c.args, nil, &stdout, &stderr, nil)
		if code != c.code || !strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("run %q: exit %d (want %d)\nstdout: %s\nstderr: %s", c.args, code, c.code, stdout.String(), stderr.String())
		}
	}
	// Every flag is in the help, with its environment variable.
	var help bytes.Buffer
	s := newSettings(nil, &help, io.Discard)
	if code := s.prog.Exit(s.prog.Parse([]string{"--help"})); code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	s.prog.Flags().VisitAll(func(f *pflag.Flag) {
		env := cli.EnvVar("DIRECTORY", f.Name)
		if !strings.Contains(help.String(), "--"+f.Name) || f.Name != "help" && f.Name != "version" && !strings.Contains(help.String(), env) {
			t.Errorf("help lacks --%s or %s", f.Name, env)
		}
	})
}

// TestRunStartFailure: a node that cannot start (its Raft port is taken)
// exits 1, not 2.
func TestRunStartFailure(t *testing.T) {
	lis := listenLoopback(t)
	defer lis.Close()
	var stdout, stderr bytes.Buffer
	code := run([]string{"--node-id", "n1", "--bootstrap", "--raft-addr", lis.Addr().String(),
		"--api-addr", "127.0.0.1:0", "--http-addr", "off", "--data-dir", t.TempDir()}, nil, &stdout, &stderr, nil)
	if code != exitError || !strings.Contains(stderr.String(), "could not start the node") {
		t.Errorf("exit %d, stderr: %s", code, stderr.String())
	}
}

func TestTestClockOffset(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want time.Duration
		bad  bool
	}{
		{nil, 0, false},
		{[]string{"KVDIR_TEST_DIRECTORY_CLOCK_OFFSET=+5m"}, 5 * time.Minute, false},
		{[]string{"OTHER=1", "KVDIR_TEST_DIRECTORY_CLOCK_OFFSET=-90s"}, -90 * time.Second, false},
		{[]string{"KVDIR_TEST_DIRECTORY_CLOCK_OFFSET="}, 0, false},
		{[]string{"KVDIR_TEST_DIRECTORY_CLOCK_OFFSET=soon"}, 0, true},
	} {
		got, err := testClockOffset(c.env)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("testClockOffset(%q) = %v, %v; want %v (error %v)", c.env, got, err, c.want, c.bad)
		}
	}
}
