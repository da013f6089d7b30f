package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

type testProgram struct {
	p              *Program
	stdout, stderr bytes.Buffer
	name           string
	lease          time.Duration
	join           []string
	members        map[string]string
	n              int
	on             bool
}

func newTest(env map[string]string) *testProgram {
	t := &testProgram{lease: 10 * time.Second, n: 3}
	t.p = &Program{Name: "demo", Env: "DEMO", Summary: "demo does nothing.", Examples: "  demo --name x",
		ConfigFile: true, Getenv: func(k string) string { return env[k] }, Stdout: &t.stdout, Stderr: &t.stderr,
		Environ: func() []string {
			var out []string
			for k, v := range env {
				out = append(out, k+"="+v)
			}
			return out
		}}
	fs := t.p.Flags()
	t.p.Group("Things")
	fs.StringVar(&t.name, "name", "anon", "the `NAME`")
	fs.Var(PositiveDuration(&t.lease), "lease", "how long")
	fs.Var(StringList(&t.join), "join", "addresses")
	fs.Var(StringMap(&t.members), "members", "id=addr pairs")
	fs.Var(PositiveInt(&t.n), "count", "how many")
	fs.BoolVar(&t.on, "on", false, "switch")
	return t
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEnvVar(t *testing.T) {
	for _, c := range []struct{ env, flag, want string }{
		{"DIRECTORY", "node-id", "KVDIR_DIRECTORY_NODE_ID"},
		{"AGENT", "kv-events-endpoint", "KVDIR_AGENT_KV_EVENTS_ENDPOINT"},
		{"CTL", "directory", "KVDIR_CTL_DIRECTORY"},
		{"bench", "log-level", "KVDIR_BENCH_LOG_LEVEL"},
	} {
		if got := EnvVar(c.env, c.flag); got != c.want {
			t.Errorf("EnvVar(%q, %q) = %q, want %q", c.env, c.flag, got, c.want)
		}
	}
}

// TestPrecedence: a flag beats the environment, which beats the config
// file, which beats the default.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "name: from-file\nlease: 1m\ncount: 7\njoin: [a:1, b:2]\nmembers:\n  n1: h:1\n  n2: h:2\nlog-format: json\n")
	tp := newTest(map[string]string{"KVDIR_DEMO_CONFIG": file, "KVDIR_DEMO_LEASE": "2m", "KVDIR_DEMO_COUNT": "8", "KVDIR_DEMO_ON": ""})
	if err := tp.p.Parse([]string{"--count=9"}); err != nil {
		t.Fatal(err)
	}
	if tp.name != "from-file" || tp.lease != 2*time.Minute || tp.n != 9 || strings.Join(tp.join, ",") != "a:1,b:2" ||
		len(tp.members) != 2 || tp.members["n2"] != "h:2" || !tp.p.JSONLogs() || tp.on {
		t.Fatalf("values: %+v", tp)
	}
	for name, want := range map[string]Source{"name": FromFile, "lease": FromEnv, "count": FromFlag, "on": FromDefault, "config": FromEnv} {
		if got := tp.p.Source(name); got != want {
			t.Errorf("source of %s = %v, want %v", name, got, want)
		}
	}
	if got := tp.p.Describe("lease"); got != "environment variable KVDIR_DEMO_LEASE" {
		t.Errorf("describe: %q", got)
	}
	// --config beats KVDIR_DEMO_CONFIG.
	other := writeFile(t, "name: other\n")
	tp = newTest(map[string]string{"KVDIR_DEMO_CONFIG": file})
	if err := tp.p.Parse([]string{"--config", other}); err != nil || tp.name != "other" || tp.lease != 10*time.Second {
		t.Fatalf("--config over the variable: %v %+v", err, tp)
	}
}

func TestUnknownVariableWarning(t *testing.T) {
	tp := newTest(map[string]string{"KVDIR_DEMO_NAEM": "x", "KVDIR_OTHER_NAME": "y"})
	if err := tp.p.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(tp.p.Warnings(), "\n"); !strings.Contains(w, "KVDIR_DEMO_NAEM") || strings.Contains(w, "KVDIR_OTHER") {
		t.Errorf("warnings %q", w)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		file string
		want string
	}{
		{args: []string{"--nope"}, want: "unknown flag: --nope"},
		{args: []string{"extra"}, want: `unexpected argument "extra"`},
		{args: []string{"--lease", "10"}, want: `not a duration: "10"`},
		{args: []string{"--lease=-1s"}, want: "must be positive"},
		{args: []string{"--count", "0"}, want: "not a positive integer"},
		{args: []string{"--members", "a=1,a=2"}, want: "listed twice"},
		{args: []string{"--log-level", "loud"}, want: "unknown log level"},
		{args: []string{"--log-format", "xml"}, want: "unknown log format"},
		{env: map[string]string{"KVDIR_DEMO_LEASE": "soon"}, want: `environment variable KVDIR_DEMO_LEASE="soon": not a duration`},
		{env: map[string]string{"KVDIR_DEMO_ON": "yes please"}, want: "KVDIR_DEMO_ON"},
		{file: "lease: ten\n", want: `key "lease": not a duration`},
		{file: "name: a\nnaem: b\n", want: `(line 2): unknown key "naem"`},
		{file: "log_level: debug\n", want: `did you mean "log-level"?`},
		{file: "config: x.yaml\n", want: "it is a flag only"},
		{file: "version: true\n", want: "it is a flag only"},
		{file: "name: a\nname: b\n", want: "already set on line 1"},
		{file: "name: [a, b]\n", want: "want a single value, not a list"},
		{file: "join: {a: b}\n", want: "want a single value, not a mapping"},
		{file: "- a\n", want: "want a mapping"},
		{file: "name: [a\n", want: "config file"},
		{args: []string{"--config", "/nonexistent/c.yaml"}, want: "read config file"},
	}
	for _, c := range cases {
		tp := newTest(c.env)
		args := c.args
		if c.file != "" {
			args = append(args, "--config", writeFile(t, c.file))
		}
		err := tp.p.Parse(args)
		if !IsUsage(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) with env %v: %v, want a usage error with %q", args, c.env, err, c.want)
			continue
		}
		code := tp.p.Exit(err)
		lines := strings.Split(strings.TrimSuffix(tp.stderr.String(), "\n"), "\n")
		if code != ExitUsage || len(lines) != 2 || !strings.HasPrefix(lines[0], "demo: ") || lines[1] != "Run 'demo --help' for usage." {
			t.Errorf("Exit(%v) = %d, stderr %q", err, code, tp.stderr.String())
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	tp := newTest(nil)
	err := tp.p.Parse([]string{"--name", "x", "-h"})
	if !errors.Is(err, ErrHelp) || tp.p.Exit(err) != ExitOK {
		t.Fatalf("--help: %v", err)
	}
	help := tp.stdout.String()
	for _, want := range []string{"demo does nothing.", "Examples:\n  demo --name x", "Things:", "--name NAME  (KVDIR_DEMO_NAME)",
		"(default anon)", "--lease DURATION  (KVDIR_DEMO_LEASE)", "--config FILE  (KVDIR_DEMO_CONFIG)", "KVDIR_DEMO_LOG_LEVEL", "KVDIR_DEMO_LOG_FORMAT", "--version", "Environment:"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	tp = newTest(map[string]string{"KVDIR_DEMO_LEASE": "bad"})
	err = tp.p.Parse([]string{"--version"})
	if !errors.Is(err, ErrVersion) || tp.p.Exit(err) != ExitOK || !strings.HasPrefix(tp.stdout.String(), "kvdir demo "+Version()+" (commit ") {
		t.Fatalf("--version: %v %q", err, tp.stdout.String())
	}
	if tp.p.Exit(errors.New("boom")) != ExitError || !strings.Contains(tp.stderr.String(), "demo: boom") {
		t.Errorf("plain error: %q", tp.stderr.String())
	}
}

func TestLogger(t *testing.T) {
	tp := newTest(map[string]string{"KVDIR_DEMO_LOG_LEVEL": "warn", "KVDIR_DEMO_LOG_FORMAT": "json"})
	if err := tp.p.Parse(nil); err != nil {
		t.Fatal(err)
	}
	log := tp.p.Logger()
	log.Info("hidden")
	log.Warn("shown")
	if s := tp.stderr.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown"`) {
		t.Errorf("log output %q", s)
	}
}

func TestSignals(t *testing.T) {
	sigs := make(chan os.Signal, 3)
	s := WatchSignals(context.Background(), sigs)
	defer s.Stop()
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGINT // at once: the same stop
	select {
	case <-s.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("first signal did not cancel the context")
	}
	select {
	case <-s.Forced():
		t.Fatal("a repeated signal within a second forced the stop")
	case <-time.After(1200 * time.Millisecond):
	}
	sigs <- syscall.SIGINT
	select {
	case <-s.Forced():
	case <-time.After(5 * time.Second):
		t.Fatal("second signal did not force the stop")
	}
	if s.First() != syscall.SIGTERM || s.Second() != syscall.SIGINT {
		t.Errorf("signals %v %v", s.First(), s.Second())
	}
}

func TestCobra(t *testing.T) {
	var dir, prefix string
	var ran bool
	root := &cobra.Command{Use: "tool", Short: "a tool"}
	root.PersistentFlags().StringVar(&dir, "directory", "127.0.0.1:7001", "directory address")
	sub := &cobra.Command{Use: "list", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	sub.Flags().StringVar(&prefix, "prefix", "", "prefix")
	MarkEnv(sub.Flags(), "prefix")
	root.AddCommand(sub)
	var stdout, stderr bytes.Buffer
	env := map[string]string{"KVDIR_TOOL_DIRECTORY": "a:1", "KVDIR_TOOL_PREFIX": "p"}
	p := &Program{Name: "tool", Env: "TOOL", Getenv: func(k string) string { return env[k] }, Stdout: &stdout, Stderr: &stderr}
	_, err := p.ExecuteC(context.Background(), root, []string{"list", "--directory", "b:2"})
	if err != nil || !ran || dir != "b:2" || prefix != "p" {
		t.Fatalf("err %v ran %v dir %q prefix %q", err, ran, dir, prefix)
	}

	for _, c := range []struct {
		args []string
		code int
		out  string
		err  string
	}{
		{[]string{"--version"}, ExitOK, "kvdir tool " + Version(), ""},
		{[]string{"list", "--help"}, ExitOK, "KVDIR_TOOL_PREFIX", ""},
		{[]string{"list", "--nope"}, ExitUsage, "", "tool: unknown flag: --nope\nRun 'tool list --help' for usage.\n"},
		{[]string{"lsit"}, ExitUsage, "", "Run 'tool --help' for usage."},
		{[]string{"list", "--log-level", "loud"}, ExitUsage, "", "unknown log level"},
	} {
		stdout.Reset()
		stderr.Reset()
		root := &cobra.Command{Use: "tool"}
		root.PersistentFlags().StringVar(&dir, "directory", "x", "d")
		sub := &cobra.Command{Use: "list", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return nil }}
		sub.Flags().StringVar(&prefix, "prefix", "", "prefix")
		MarkEnv(sub.Flags(), "prefix")
		root.AddCommand(sub)
		p := &Program{Name: "tool", Env: "TOOL", Getenv: func(string) string { return "" }, Stdout: &stdout, Stderr: &stderr}
		_, err := p.ExecuteC(context.Background(), root, c.args)
		if code := p.Exit(err); code != c.code || !strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%q: exit %d (want %d)\nstdout %q\nstderr %q", c.args, code, c.code, stdout.String(), stderr.String())
		}
	}
}

func TestOldEnv(t *testing.T) {
	tp := newTest(map[string]string{"DEMO_NAME": "old", "DEMO_COUNT": "4", "KVDIR_DEMO_COUNT": "5"})
	tp.p.OldEnv = func(flag string) string { return "DEMO_" + strings.ToUpper(flag) }
	err := tp.p.Parse(nil)
	if !IsUsage(err) || !strings.Contains(err.Error(), "environment variable DEMO_NAME is no longer read: rename it KVDIR_DEMO_NAME") ||
		strings.Contains(err.Error(), "DEMO_COUNT") {
		t.Fatalf("Parse: %v", err)
	}
	tp = newTest(map[string]string{"DEMO_NAME": "old"})
	tp.p.OldEnv = func(flag string) string { return "DEMO_" + strings.ToUpper(flag) }
	if err := tp.p.Parse([]string{"--name", "x"}); err != nil {
		t.Errorf("old variable of a flag given on the command line: %v", err)
	}
}

// An old name that is another binary's variable today (the directory's
// KVDIR_AGENT_TOKEN, now the agent's --token) is not refused: an
// environment shared by both binaries may hold it.
func TestOldEnvOfAnotherBinary(t *testing.T) {
	tp := newTest(map[string]string{"KVDIR_AGENT_NAME": "the agent's"})
	tp.p.OldEnv = func(flag string) string { return "KVDIR_AGENT_" + strings.ToUpper(flag) }
	if err := tp.p.Parse(nil); err != nil {
		t.Fatalf("another binary's variable refused as an old name: %v", err)
	}
	tp = newTest(map[string]string{"KVDIR_NAME": "old"})
	tp.p.OldEnv = func(flag string) string { return "KVDIR_" + strings.ToUpper(flag) }
	if err := tp.p.Parse(nil); !IsUsage(err) {
		t.Fatalf("an old name outside every binary's scheme was not refused: %v", err)
	}
}

func TestPlaceholderAndDeferredLogger(t *testing.T) {
	tp := newTest(map[string]string{"KVDIR_DEMO_LOG_LEVEL": "error"})
	SetPlaceholder(tp.p.Flags(), "join", "HOST:PORT,...")
	log := tp.p.DeferredLogger().With("k", "v")
	if err := tp.p.Parse(nil); err != nil {
		t.Fatal(err)
	}
	log.Warn("hidden")
	log.Error("shown")
	if s := tp.stderr.String(); strings.Contains(s, "hidden") || !strings.Contains(s, "msg=shown k=v") {
		t.Errorf("deferred logger wrote %q", s)
	}
	tp.p.WriteHelp(&tp.stdout)
	if !strings.Contains(tp.stdout.String(), "--join HOST:PORT,...  (KVDIR_DEMO_JOIN)") {
		t.Errorf("placeholder missing:\n%s", tp.stdout.String())
	}
}

func TestMarkEnvAll(t *testing.T) {
	var a, b string
	root := &cobra.Command{Use: "tool"}
	sub := &cobra.Command{Use: "one", RunE: func(*cobra.Command, []string) error { return nil }}
	sub.Flags().StringVar(&a, "alpha", "", "a")
	subsub := &cobra.Command{Use: "two", RunE: func(*cobra.Command, []string) error { return nil }}
	subsub.Flags().StringVar(&b, "beta", "", "b")
	sub.AddCommand(subsub)
	root.AddCommand(sub)
	MarkEnvAll(root)
	env := map[string]string{"KVDIR_TOOL_ALPHA": "1", "KVDIR_TOOL_BETA": "2"}
	p := &Program{Name: "tool", Env: "TOOL", Getenv: func(k string) string { return env[k] }, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}
	if _, err := p.ExecuteC(context.Background(), root, []string{"one", "two"}); err != nil || b != "2" || a != "" {
		t.Fatalf("err %v a %q b %q", err, a, b)
	}
}
