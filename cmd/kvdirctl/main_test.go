package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/tokenize"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// ctl runs kvdirctl in-process and returns its stdout, stderr and exit
// status.
func ctl(t *testing.T, getenv func(string) string, args ...string) (string, string, int) {
	t.Helper()
	return ctlCtx(t, context.Background(), getenv, args...)
}

func ctlCtx(t *testing.T, ctx context.Context, getenv func(string) string, args ...string) (string, string, int) {
	t.Helper()
	if getenv == nil {
		getenv = env(nil)
	}
	var out, errb testkit.Buffer
	code := run(ctx, args, getenv, &out, &errb)
	return out.String(), errb.String(), code
}

// Bad arguments end with exit status 2, a message naming the mistake, and
// a pointer to --help; no call is made.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"who-holds"}, nil, "who-holds needs 1 argument(s): SESSION"},
		{[]string{"workers", "extra"}, nil, "workers takes no arguments"},
		{[]string{"workers", "get"}, nil, "get needs 1 argument(s): WORKER"},
		{[]string{"status", "--bogus"}, nil, "unknown flag: --bogus"},
		{[]string{"-o", "xml", "status"}, nil, `unknown output format "xml"`},
		{[]string{"--directory", "", "status"}, nil, "--directory is empty"},
		{[]string{"--directory", "http://a:1", "status"}, nil, "without a scheme"},
		{[]string{"--directory", "nodeport", "status"}, nil, "missing port"},
		{[]string{"--token", "a", "--token-file", "f", "status"}, nil, "--token and --token-file are both set"},
		{[]string{"--tls-cert", "c", "status"}, nil, "--tls-cert and --tls-key go together"},
		{[]string{"status"}, map[string]string{"KVDIR_CTL_TIMEOUT": "soon"}, `KVDIR_CTL_TIMEOUT="soon"`},
		{[]string{"match", "--model", "m"}, nil, "give exactly one of --prompt, --chat, --messages or --tokens (got 0)"},
		{[]string{"match", "--chat", "a", "--tokens", "1"}, nil, "(got 2)"},
		{[]string{"match", "--system", "s", "--prompt", "p"}, nil, "--system goes with --chat"},
		{[]string{"match", "--tokens", "1,x"}, nil, `token 1 ("x") is not a non-negative 32-bit integer`},
		{[]string{"explain", "--chat", "hi"}, nil, "--model is required"},
		{[]string{"explain", "--model", "m", "--chat", "hi", "--router", "127.0.0.1:8080"}, nil, "give the router's base URL"},
		{[]string{"who-holds", "s", "--profile", "no-such-profile"}, nil, "--profile"},
		{[]string{"members", "add", "n4"}, nil, "--raft-address is required"},
		{[]string{"leader", "transfer", "a", "b"}, nil, "at most one member id"},
		{[]string{"status", "--watch", "--interval", "0s"}, nil, "--interval must be positive"},
	} {
		// Every case fails before any call, so an address nothing listens on is fine.
		args := append([]string{"--directory", "127.0.0.1:1"}, c.args...)
		if c.args[0] == "--directory" {
			args = c.args
		}
		if c.env["KVDIR_CTL_TIMEOUT"] == "" {
			args = append([]string{"--timeout", "300ms"}, args...)
		}
		out, errOut, code := ctl(t, env(c.env), args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "--help' for usage") || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
}

// The environment sets global flags; the command line wins.
func TestEnvironment(t *testing.T) {
	a := &app{getenv: env(map[string]string{
		"KVDIR_CTL_DIRECTORY": "10.0.0.1:7001,10.0.0.2:7001",
		"KVDIR_CTL_TIMEOUT":   "750ms",
		"KVDIR_CTL_OUTPUT":    "yaml",
		"KVDIR_CTL_ROUTER":    "http://router:8080",
		"KVDIR_CTL_PREFIX":    "ignored: local flags without markEnv have no variable",
	}), out: io.Discard, errOut: io.Discard, now: time.Now}
	root := a.rootCommand()
	var ran bool
	var router string
	explain, _, err := root.Find([]string{"explain"})
	if err != nil {
		t.Fatal(err)
	}
	explain.RunE = func(cmd *cobra.Command, _ []string) error {
		ran = true
		router, _ = cmd.Flags().GetString("router")
		return nil
	}
	root.SetArgs([]string{"explain", "-o", "json"})
	if err := root.Execute(); err != nil || !ran {
		t.Fatalf("execute: %v (ran %v)", err, ran)
	}
	if strings.Join(a.directory, ",") != "10.0.0.1:7001,10.0.0.2:7001" || a.timeout != 750*time.Millisecond {
		t.Fatalf("directory %v timeout %v", a.directory, a.timeout)
	}
	if a.format != "json" {
		t.Fatalf("format %q: the -o flag must win over KVDIR_CTL_OUTPUT", a.format)
	}
	if router != "http://router:8080" {
		t.Fatalf("router %q", router)
	}

	sessions, _, _ := root.Find([]string{"sessions"})
	sessions.RunE = func(cmd *cobra.Command, _ []string) error {
		if p, _ := cmd.Flags().GetString("prefix"); p != "" {
			t.Errorf("--prefix %q taken from the environment", p)
		}
		return nil
	}
	root.SetArgs([]string{"sessions"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
}

func TestPromptInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokenize.Message{
		{Role: "system", Content: tokenize.TextContent("Be brief.")},
		{Role: "user", Content: tokenize.TextContent("What does a prefix cache save?")},
	}
	want, err := tmpl.RenderChat(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	// --chat/--system, a messages array and a whole request body render alike.
	for name, in := range map[string]promptInput{
		"chat":    {chat: "What does a prefix cache save?", system: "Be brief."},
		"array":   {messagesFile: write("a.json", `[{"role":"system","content":"Be brief."},{"role":"user","content":"What does a prefix cache save?"}]`)},
		"request": {messagesFile: write("r.json", `{"model":"m1","cache_salt":"s","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"What does a prefix cache save?"}]}]}`)},
		"stdin":   {messagesFile: "-", stdin: strings.NewReader(`[{"role":"system","content":"Be brief."},{"role":"user","content":"What does a prefix cache save?"}]`)},
	} {
		p, err := in.parse()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ids, err := p.tokenIDs()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Errorf("%s: %d ids, want the ChatML rendering (%d ids)", name, len(ids), len(want))
		}
		if name == "request" && (p.model != "m1" || p.cacheSalt != "s") {
			t.Errorf("request file: model %q salt %q", p.model, p.cacheSalt)
		}
	}
	// Without the generation prompt, the rendering stops after the messages.
	p, err := (&promptInput{chat: "What does a prefix cache save?", system: "Be brief.", noGenPrompt: true}).parse()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := p.tokenIDs()
	if len(ids) >= len(want) || fmt.Sprint(ids) != fmt.Sprint(want[:len(ids)]) {
		t.Errorf("no generation prompt: %d ids, want a proper prefix of %d", len(ids), len(want))
	}
	// Completion text is cl100k without a template; token ids pass through.
	p, _ = (&promptInput{text: "Once upon a time"}).parse()
	ids, _ = p.tokenIDs()
	if fmt.Sprint(ids) != fmt.Sprint(tmpl.RenderCompletion("Once upon a time")) {
		t.Errorf("completion ids %v", ids)
	}
	p, _ = (&promptInput{tokens: "[1, 2,3 4]"}).parse()
	if ids, _ = p.tokenIDs(); fmt.Sprint(ids) != "[1 2 3 4]" {
		t.Errorf("token ids %v", ids)
	}
	p, err = (&promptInput{messagesFile: write("p.json", `{"model":"m","prompt":[[5,6,7]]}`)}).parse()
	if err != nil || !p.isTokens || fmt.Sprint(p.tokens) != "[5 6 7]" {
		t.Errorf("prompt ids in a file: %+v %v", p, err)
	}
	// Bad files are usage errors that say what is expected.
	for name, body := range map[string]string{
		"empty.json":   "",
		"garbage.json": "{not json",
		"none.json":    `{"model":"m"}`,
		"image.json":   `[{"role":"user","content":[{"type":"image_url"}]}]`,
		"role.json":    `{"messages":[],"prompt":{"a":1}}`,
	} {
		_, err := (&promptInput{messagesFile: write(name, body)}).parse()
		if !cli.IsUsage(err) {
			t.Errorf("%s: %v, want a usage error", name, err)
		}
	}
	if _, err := (&promptInput{messagesFile: filepath.Join(dir, "missing.json")}).parse(); err == nil || !strings.Contains(err.Error(), "--messages") {
		t.Errorf("missing file: %v", err)
	}
}

// explain posts the request to the router's explain endpoint, with the
// session header, and shows the router's answer as a table or passes it
// through as JSON.
func TestExplainAgainstRouter(t *testing.T) {
	answer := `{"model":"llama3-8b","session_id":"chat-1","policy":"kvdir","prompt_tokens":55,"block_size":16,"chain_blocks":3,
"fallback":"","pick":"w-a","predicted_cached_tokens":48,"decision_us":87.5,"workers":[
{"worker":"w-a","address":"http://a:8000","matched_blocks":3,"matched_tokens":48,"running":2,"waiting":0,"kv_usage":0.25,"in_flight":1,
 "queued_prefill_tokens":0,"retain":1,"cached_tokens":48,"queue_ms":0,"interference_ms":0.4,"wait_ms":0.4,"prefill_ms":2.1,"cold_prefill_ms":5.2,"total_ms":2.5},
{"worker":"w-b","address":"http://b:8000","matched_blocks":0,"matched_tokens":0,"running":0,"waiting":1,"kv_usage":0.5,"in_flight":0,
 "queued_prefill_tokens":300,"retain":1,"cached_tokens":0,"queue_ms":7.5,"interference_ms":0,"wait_ms":7.5,"prefill_ms":5.2,"cold_prefill_ms":5.2,"total_ms":12.7}]}`
	var (
		mu      sync.Mutex
		bodies  []map[string]any
		headers []http.Header
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/kvdir/explain" {
			http.Error(w, `{"error":{"message":"no such route","type":"NotFoundError","code":404}}`, http.StatusNotFound)
			return
		}
		var b map[string]any
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			t.Errorf("body: %v", err)
		}
		mu.Lock()
		bodies = append(bodies, b)
		headers = append(headers, r.Header.Clone())
		mu.Unlock()
		if b["model"] == "unknown" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":{"message":"model \"unknown\" is not served","type":"NotFoundError","code":404}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	defer srv.Close()

	out, errOut, code := ctl(t, nil, "explain", "--router", srv.URL+"/", "--model", "llama3-8b", "--system", "Be brief.",
		"--chat", "What does a prefix cache save?", "--session", "chat-1", "--cache-salt", "tenant-a")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mu.Lock()
	b, h := bodies[0], headers[0]
	mu.Unlock()
	msgs, _ := b["messages"].([]any)
	if b["model"] != "llama3-8b" || len(msgs) != 2 || b["cache_salt"] != "tenant-a" || b["prompt"] != nil {
		t.Errorf("request body %v", b)
	}
	if h.Get("X-Session-Id") != "chat-1" || h.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", h)
	}
	for _, want := range []string{
		"model llama3-8b, session chat-1, policy kvdir: 55 prompt tokens, 3 full blocks of 16",
		"WORKER   MATCHED   RUNNING   WAITING   KV-USAGE   IN-FLIGHT   QUEUED   EXP-CACHED   WAIT-MS   PREFILL-MS   COLD-MS   TTFT-MS   VS-PICK",
		"w-a      48        2         0         25.0%      1           0        48           0.4       2.1          5.2       2.5       -          pick",
		"w-b      0         0         1         50.0%      0           300      0            7.5       5.2          5.2       12.7      +10.2 ms\n",
		"pick: w-a, predicted cached tokens 48 (decided in 88 µs)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	// Token ids go as "prompt"; -o json passes the router's answer through.
	if h.Get("X-Kvdir-Explain-Token") != "" {
		t.Errorf("an explain token sent without one given: %v", h)
	}
	out, errOut, code = ctl(t, env(map[string]string{"KVDIR_CTL_EXPLAIN_TOKEN": "s3cret"}), "explain", "--router", srv.URL, "--model", "llama3-8b", "--tokens", "1,2,3",
		"--session-header", "X-Chat", "--session", "s9", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mu.Lock()
	b, h = bodies[1], headers[1]
	mu.Unlock()
	if fmt.Sprint(b["prompt"]) != "[1 2 3]" || b["messages"] != nil || h.Get("X-Chat") != "s9" || h.Get("X-Kvdir-Explain-Token") != "s3cret" {
		t.Errorf("token request: body %v, X-Chat %q", b, h.Get("X-Chat"))
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json output: %v\n%s", err, out)
	}
	if doc["pick"] != "w-a" || doc["decision_us"] != 87.5 || len(doc["workers"].([]any)) != 2 {
		t.Errorf("json output %v", doc)
	}

	// The router's error message reaches the operator.
	_, errOut, code = ctl(t, nil, "explain", "--router", srv.URL, "--model", "unknown", "--prompt", "hi")
	if code != exitError || !strings.Contains(errOut, `the router answered 404 Not Found: model "unknown" is not served`) {
		t.Errorf("router error: exit %d, %q", code, errOut)
	}
	// An unreachable router is named, with what to check.
	srv.Close()
	_, errOut, code = ctl(t, nil, "explain", "--router", srv.URL, "--model", "m", "--prompt", "hi", "--timeout", "2s")
	if code != exitError || !strings.Contains(errOut, "the router at "+srv.URL+" did not answer") || !strings.Contains(errOut, "KVDIR_CTL_ROUTER") {
		t.Errorf("unreachable router: exit %d, %q", code, errOut)
	}
}

func TestCompareDigests(t *testing.T) {
	n := func(id string, idx uint64, d string) ctlview.Node {
		return ctlview.Node{ID: id, AppliedIndex: idx, Digest: d}
	}
	if c := compareDigests([]ctlview.Node{n("n1", 9, "aa"), n("n2", 9, "aa"), {ID: "n3", State: "unreachable"}}); !c.Agree || !c.Comparable || c.Nodes != 2 {
		t.Errorf("agree: %+v", c)
	}
	c := compareDigests([]ctlview.Node{n("n1", 9, "aa"), n("n2", 9, "bb"), n("n3", 9, "aa")})
	if c.Agree || !c.Comparable || !strings.Contains(c.Detail, "DIFFER") || !strings.Contains(c.Detail, "bb on n2") {
		t.Errorf("differ: %+v", c)
	}
	c = compareDigests([]ctlview.Node{n("n1", 9, "aa"), n("n2", 10, "bb")})
	if c.Agree || c.Comparable || !strings.Contains(c.Detail, "n1 at 9, n2 at 10") {
		t.Errorf("not comparable: %+v", c)
	}
}

// describe says what failed and what to try for the directory's refusals.
func TestDescribeErrors(t *testing.T) {
	a := &app{directory: []string{"a:1"}, timeout: time.Second}
	wrap := func(code codes.Code, msg string) error {
		return fmt.Errorf("dirclient: drain worker at a:1: %w", status.Error(code, msg))
	}
	for _, c := range []struct {
		err  error
		want []string
	}{
		{wrap(codes.Unauthenticated, "missing or unknown bearer token"), []string{"drain worker at a:1: the directory requires a bearer token", "--token-file"}},
		{wrap(codes.PermissionDenied, "this token's role may not call X"), []string{"permission denied", "admin token"}},
		{wrap(codes.NotFound, `worker "w" is not known to the directory`), []string{`worker "w" is not known`, "kvdirctl workers --all"}},
		{wrap(codes.NotFound, `session "s" is not recorded`), []string{"kvdirctl sessions"}},
		{wrap(codes.Unavailable, "no leader"), []string{"the cluster has no leader", "kvdirctl status"}},
		{errors.New("plain"), []string{"plain"}},
	} {
		got := describe(c.err, a)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("describe(%v) = %q, lacks %q", c.err, got, w)
			}
		}
	}
	a.token = "x"
	if got := describe(wrap(codes.Unauthenticated, "missing or unknown bearer token"), a); !strings.Contains(got, "not one of the directory's tokens") {
		t.Errorf("wrong token: %q", got)
	}
}

func TestCompletionScript(t *testing.T) {
	out, errOut, code := ctl(t, nil, "completion", "bash")
	if code != 0 || !strings.Contains(out, "__start_kvdirctl") {
		t.Fatalf("completion bash: exit %d, stderr %q, %d bytes", code, errOut, len(out))
	}
	for _, sh := range []string{"zsh", "fish", "powershell"} {
		if out, _, code := ctl(t, nil, "completion", sh); code != 0 || len(out) == 0 {
			t.Errorf("completion %s: exit %d", sh, code)
		}
	}
}

func TestHelpListsCommands(t *testing.T) {
	out, _, code := ctl(t, nil, "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, c := range []string{"status", "workers", "sessions", "who-holds", "match", "explain", "drain", "expire", "members", "snapshot", "leader", "KVDIR_CTL_DIRECTORY"} {
		if !strings.Contains(out, c) {
			t.Errorf("--help lacks %q", c)
		}
	}
}
