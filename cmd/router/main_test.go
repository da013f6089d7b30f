package main

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/cli"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseFlags(t *testing.T) {
	_, o, err := parseFlags([]string{"--directory", "a:1,b:2"}, env(map[string]string{"KVDIR_ROUTER_POLICY": "prefix", "KVDIR_ROUTER_DIRECTORY": "ignored:9"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.directory, ",") != "a:1,b:2" || o.policy != "prefix" {
		t.Fatalf("flags %+v: the command line must win over the environment, which fills the rest", o)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give --directory"},
		{[]string{"--directory", "a:1", "extra"}, `unexpected argument "extra"`},
		{[]string{"--nope"}, "unknown flag: --nope"},
		{[]string{"--directory", "a:1", "--mode", "sidecar"}, `--mode "sidecar": want proxy or epp`},
		{[]string{"--mode", "epp", "--workers", "a=http://h:1"}, "--mode epp needs --directory and no --workers"},
		{[]string{"--mode", "epp", "--directory", "a:1", "--workers", "a=http://h:1"}, "--mode epp needs --directory and no --workers"},
		{[]string{"--mode", "epp", "--directory", "a:1", "--epp-tls-cert", "c.pem"}, "both --epp-tls-cert and --epp-tls-key"},
		{[]string{"--directory", "a:1", "--directory-group", "g=b:1"}, "give --directory (one directory group) or --directory-group"},
		{[]string{"--directory-group", "g=a:1", "--directory-group", "g=b:1"}, "the name g is given twice"},
		{[]string{"--directory-group", "g="}, "g has an empty list"},
		{[]string{"--directory-group", "a:1"}, "want NAME=ITEM"},
		{[]string{"--directory-group", "g=a:1", "--directory-group", "h=b:1", "--workers", "a=http://h:1"}, "--workers takes one directory at most"},
	} {
		if _, _, err := parseFlags(c.args, env(nil), io.Discard, io.Discard); err == nil || !cli.IsUsage(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v, want a usage error with %q", c.args, err, c.want)
		}
	}
	if _, _, err := parseFlags([]string{"--help"}, env(nil), io.Discard, io.Discard); !errors.Is(err, cli.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// TestParseDirectoryGroups checks --directory-group: repeatable, in
// order, and from the environment with groups separated by ';'.
func TestParseDirectoryGroups(t *testing.T) {
	_, o, err := parseFlags([]string{"--directory-group", "chat=a:1,a:2", "--directory-group", "code=b:1"}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.groupsString(); got != "chat=a:1,a:2; code=b:1" {
		t.Fatalf("groups %q", got)
	}
	_, o, err = parseFlags(nil, env(map[string]string{"KVDIR_ROUTER_DIRECTORY_GROUP": "chat=a:1;code=b:1,b:2"}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.groupsString(); got != "chat=a:1; code=b:1,b:2" {
		t.Fatalf("groups from the environment %q", got)
	}
}

func TestParseWorkers(t *testing.T) {
	ws, err := parseWorkers("a=http://10.0.0.1:8000@llama3-8b, b=http://h:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "a" || ws[0].Address != "http://10.0.0.1:8000" || ws[0].Model != "llama3-8b" ||
		ws[1].Address != "http://h:1" || ws[1].Model != "" {
		t.Fatalf("got %+v", ws)
	}
	for _, bad := range []string{"", "a", "=http://x", "a=", "a=http://x,a=http://y"} {
		if _, err := parseWorkers(bad); err == nil {
			t.Errorf("parseWorkers(%q) accepted", bad)
		}
	}
}

// TestRunRejectsBadConfig checks that bad settings fail at start with a
// message naming the flag.
func TestRunRejectsBadConfig(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--workers", "a=http://127.0.0.1:1", "--policy", "fastest"}, "--policy"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--profile", "gpt-5"}, "--profile"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--tokenizer", "remote"}, "--tokenize-url"},
		{[]string{"--workers", "a=ftp://x", "--addr", "127.0.0.1:0"}, "scheme"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--addr", "256.0.0.1:80"}, "--addr"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--explain", "token"}, "--explain token needs the token"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--explain", "maybe"}, "want open, token or off"},
		{[]string{"--workers", "a=http://127.0.0.1:1", "--explain-token-file", "/nonexistent/kvdir-token"}, "--explain-token-file"},
	} {
		err := run(context.Background(), c.args, env(nil), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

// TestExplainTokenFile checks that the token is read from the file, white
// space trimmed, and that an empty file is refused.
func TestExplainTokenFile(t *testing.T) {
	dir := t.TempDir()
	good, empty := dir+"/token", dir+"/empty"
	if err := os.WriteFile(good, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, o, err := parseFlags([]string{"--workers", "a=http://127.0.0.1:1", "--explain", "token", "--explain-token-file", good}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configure(o)
	if err != nil || cfg.ExplainToken != "s3cret" {
		t.Fatalf("token %q, %v", cfg.ExplainToken, err)
	}
	_, o, err = parseFlags([]string{"--workers", "a=http://127.0.0.1:1", "--explain-token-file", empty}, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configure(o); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty token file: %v", err)
	}
}
