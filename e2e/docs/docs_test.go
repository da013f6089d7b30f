// Package docs checks the commands and captured output in the repository's
// guides against a real run, so that the documentation and the programs
// cannot drift apart. See internal/testkit/transcript for the format.
package docs

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/transcript"
)

// notRun lists every command the tests leave out, with the reason. A step
// is left out when its file matches and its command contains the text.
var notRun = []struct{ file, contains, reason string }{
	{"*", "make demo", "minutes of replay; the demo's own test covers it"},
	{"*", "make test", "runs the whole test suite, this test included"},
	{"*", "make bench", "the benchmarks take minutes; their results are in bench/results"},
	{"*", "make build", "compiles every package; the build itself is checked by every test"},
	{"*", "make help", "lists make targets; nothing to compare"},
	{"*", "make cluster-up", "Docker; the chaos tier (make test-chaos) runs the compose cluster"},
	{"*", "make dev", "run below as ./bin/kvbench dev, which is what make dev runs after make bin"},
	{"*", "go test ", "runs another tier's tests"},
	{"*", "go run ./cmd/enginesim", "the same commands as ./bin/enginesim, checked in the other guides"},
	{"*", "vllm serve", "needs a GPU and vLLM"},
	{"*", "kvdirctl completion", "writes a completion script into the shell; the unit tests check the scripts"},
	{"*", "--workers a=http://10.0.0.7", "addresses of engines that do not exist here"},
	{"*", "members add n4", "a template (HOST:PORT), not a command"},
	{"cmd/directory/README.md", "KVDIR_DIRECTORY_LOG_LEVEL=info ./bin/directory --config", "runs a node in the foreground until Ctrl-C"},
	{"cmd/directory/README.md", "--models code-7b", "a second directory group beside the guide's cluster; e2e/groups_test.go runs two groups as processes"},
	{"cmd/kvdirctl/README.md", "--directory-group code=", "needs a second directory group; cmd/kvdirctl/groups_test.go (in process) and e2e/groups_test.go run two"},
	{"docs/running.md", "make cluster-up", "Docker; the chaos tier (make test-chaos) runs the compose cluster"},
	{"*", "--watch", "runs until Ctrl-C"},
	{"docs/engine-side.md", "--worker-address http://10.0.0.7", "an engine at an address that does not exist here"},
	{"docs/engine-side.md", "sglang.launch_server", "needs a GPU and SGLang"},
	{"docs/engine-side.md", "trtllm-serve meta-llama", "needs a GPU and TensorRT-LLM"},
	{"docs/engine-side.md", "--directory dir-0:7001", "an agent beside a real engine, in a deployment's addresses"},
	{"docs/engine-side.md", "--kv-events-pull-url http://127.0.0.1:8000", "needs a TensorRT-LLM-shaped engine on the guide's port; the engine-shape e2e test runs one"},
	{"docs/engine-side.md", "enginesim --addr 127.0.0.1:8000 --data-parallel-size 2", "a second engine on the guide's port; e2e/dataparallel_test.go runs this setup"},
}

// uncheckedOutput lists steps that are run (and must succeed) but whose
// captured output is not compared, with the reason.
var uncheckedOutput = []struct{ file, contains, reason string }{}

// keysOnly lists steps whose capture is JSON abridged and wrapped by
// hand: the keys it shows must appear in the output, in the same order.
var keysOnly = []row{
	{"cmd/router/README.md", "v1/kvdir/explain", "abridged and wrapped by hand"},
}

var jsonKeyRE = regexp.MustCompile(`"([A-Za-z_]+)":`)

// keysInOrder reports whether the document's JSON keys are a subsequence
// of the output's, and the first one that is missing.
func keysInOrder(want, got string) (string, bool) {
	g := jsonKeyRE.FindAllStringSubmatch(got, -1)
	j := 0
	for _, w := range jsonKeyRE.FindAllStringSubmatch(want, -1) {
		for j < len(g) && g[j][1] != w[1] {
			j++
		}
		if j == len(g) {
			return w[1], false
		}
		j++
	}
	return "", true
}

// exact lists steps whose output is compared exactly (only the version
// string and column padding may differ): help, versions, usage and
// configuration errors.
var exact = []struct{ file, contains string }{
	{"cmd/directory/README.md", "--version"},
	{"cmd/directory/README.md", "--config"},
	{"cmd/directory/README.md", "--tls-key"},
	{"cmd/kvdirctl/README.md", "kvdirctl who-holds\n"},
	{"cmd/kvdirctl/README.md", "--chat hi --tokens"},
	{"cmd/kvdirctl/README.md", "127.0.0.1:7901"},
	{"cmd/kvdirctl/README.md", "127.0.0.1:8090"},
}

func lookup[T any](rows []T, file, cmd string, key func(T) (string, string)) (T, bool) {
	for _, r := range rows {
		f, c := key(r)
		if (f == "*" || f == file) && strings.Contains(cmd+"\n", c) {
			return r, true
		}
	}
	var zero T
	return zero, false
}

type row = struct{ file, contains, reason string }

func rowKey(r row) (string, string) { return r.file, r.contains }

var root string

func TestMain(m *testing.M) {
	var err error
	if root, err = testkit.ModuleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// buildBin is make bin: every binary the guides run, into ./bin.
func buildBin(t *testing.T) {
	t.Helper()
	start := time.Now()
	if _, err := testkit.Build(filepath.Join(root, "bin"), "directory", "agent", "router", "enginesim", "kvdirctl", "bench/cmd/kvbench"); err != nil {
		t.Fatalf("make bin: %v", err)
	}
	t.Logf("built ./bin in %v", time.Since(start).Round(time.Millisecond))
}

// guide runs the steps of some of a file's blocks in one shell.
type stats struct {
	compared, ran, skipped int
	used                   map[string]bool // keys of guide.before that met their step
}

type guide struct {
	st   *stats
	file string
	// blocks selects the blocks by heading; nil runs every block.
	headings []string
	// rewrite turns the document's command into the one run (e.g. the
	// router's URL); undo turns the output back (the temporary folder).
	rewrite func(string) string
	undo    func(string) string
	// bind, when set, names consistently what a run may choose
	// differently from the capture (see transcript.Binding).
	bind *transcript.Binding
	// extraRules are added to the live rules (for this guide only).
	extraRules []transcript.Rule
	// only, when set, runs just the steps whose command contains one of
	// these (the rest of the selected blocks are listed as not run).
	only []string
	// order, when set, runs the file's steps in this order (the order of
	// the capture, which the guide describes) instead of the document's;
	// a step in neither order nor notRun is an error.
	order []seq
	// before runs before a step whose command contains the key.
	before map[string]func(t *testing.T, sh *transcript.Shell)
}

// seq names a step by its command's first line (and which occurrence),
// with what to wait for before it.
type seq struct {
	first  string
	nth    int // 0 or 1: the first occurrence
	before func(t *testing.T)
}

func (g guide) runOrdered(t *testing.T, sh *transcript.Shell, blocks []*transcript.Block) {
	type ref struct {
		b  *transcript.Block
		st transcript.Step
	}
	var all []ref
	for _, b := range blocks {
		for _, st := range b.Steps() {
			all = append(all, ref{b, st})
		}
	}
	used := map[int]bool{}
	find := func(e seq) int {
		n := 0
		for i, r := range all {
			if strings.TrimSpace(firstLine(r.st.Cmd)) == e.first {
				n++
				if n == max(e.nth, 1) {
					return i
				}
			}
		}
		return -1
	}
	for _, e := range g.order {
		i := find(e)
		if i < 0 {
			t.Fatalf("%s: no step %q (occurrence %d): the guide changed; update the capture order in the test", g.file, e.first, max(e.nth, 1))
		}
		used[i] = true
		if e.before != nil {
			e.before(t)
		}
		g.step(t, sh, all[i].b, all[i].st)
	}
	for i, r := range all {
		if used[i] {
			continue
		}
		if _, ok := lookup(notRun, g.file, strings.TrimSpace(r.st.Cmd), rowKey); ok {
			g.step(t, sh, r.b, r.st) // logs the reason
			continue
		}
		t.Errorf("%s:%d: %s: neither in the capture order nor listed as not run", g.file, r.st.Line, firstLine(r.st.Cmd))
	}
}

// tmpRewrite maps the guides' /tmp folders into the test's own.
func tmpRewrite(dir string) (func(string) string, func(string) string) {
	re := regexp.MustCompile(`/tmp/(kvdir|kvc)\b`)
	back := regexp.MustCompile(regexp.QuoteMeta(dir) + `/(kvdir|kvc)\b`)
	return func(s string) string { return re.ReplaceAllString(s, dir+"/$1") },
		func(s string) string { return back.ReplaceAllString(s, "/tmp/$1") }
}

func (g guide) run(t *testing.T, sh *transcript.Shell) {
	src, err := os.ReadFile(filepath.Join(root, g.file))
	if err != nil {
		t.Fatal(err)
	}
	g.st = &stats{used: map[string]bool{}}
	defer func() {
		for k := range g.before {
			if !g.st.used[k] {
				t.Errorf("%s: no step's command contains %q, so what the test waits for before it never ran; the guide changed", g.file, k)
			}
		}
		t.Logf("%s: %d steps compared with their output, %d run without output to compare, %d not run (listed above)",
			g.file, g.st.compared, g.st.ran, g.st.skipped)
	}()
	blocks := transcript.Parse(g.file, src)
	if g.headings != nil {
		// In the order of g.headings: a guide may describe its setup last.
		var ordered []*transcript.Block
		for _, h := range g.headings {
			for _, b := range blocks {
				if b.Heading == h {
					ordered = append(ordered, b)
				}
			}
		}
		blocks = ordered
	}
	if g.order != nil {
		g.runOrdered(t, sh, blocks)
		return
	}
	for _, b := range blocks {
		if file, ok := fileBlock(b); ok {
			content := strings.Join(b.Lines[1:], "\n") + "\n"
			if err := os.WriteFile(g.rewrite(file), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, st := range b.Steps() {
			g.step(t, sh, b, st)
		}
	}
}

// fileBlock: a yaml block whose first line is "# /tmp/..." is a file's
// content; the guide's later commands read it.
func fileBlock(b *transcript.Block) (string, bool) {
	if b.Lang != "yaml" || len(b.Lines) == 0 || !strings.HasPrefix(b.Lines[0], "# /tmp/") {
		return "", false
	}
	return strings.TrimPrefix(b.Lines[0], "# "), true
}

func (g guide) step(t *testing.T, sh *transcript.Shell, b *transcript.Block, st transcript.Step) {
	where := fmt.Sprintf("%s:%d", g.file, st.Line)
	cmd := strings.TrimSpace(st.Cmd)
	if r, ok := lookup(notRun, g.file, cmd, rowKey); ok {
		t.Logf("%s: not run (%s): %s", where, r.reason, firstLine(cmd))
		g.st.skipped++
		return
	}
	if g.only != nil && !containsAny(cmd, g.only) {
		t.Logf("%s: not run (the state this capture shows is not rebuilt by the test yet): %s", where, firstLine(cmd))
		g.st.skipped++
		return
	}
	// "make bin" was done by the test, once.
	cmd = regexp.MustCompile(`(?m)^make bin.*$`).ReplaceAllString(cmd, ":")
	for k, f := range g.before {
		if strings.Contains(cmd, k) {
			g.st.used[k] = true
			f(t, sh)
		}
	}
	run := g.rewrite(cmd)
	out, rc, err := sh.Run(run, 60*time.Second)
	if err != nil {
		t.Fatalf("%s: %s: %v", where, firstLine(cmd), err)
	}
	out = g.undo(out)
	if rc != st.WantExit {
		t.Errorf("%s: %s\nexit status %d, the document shows %d; output:\n%s", where, cmd, rc, st.WantExit, out)
		return
	}
	if !st.HasOutput {
		g.st.ran++
		return
	}
	if r, ok := lookup(uncheckedOutput, g.file, cmd, rowKey); ok {
		t.Logf("%s: output not compared (%s)", where, r.reason)
		g.st.ran++
		return
	}
	g.st.compared++
	if _, ok := lookup(keysOnly, g.file, cmd, rowKey); ok {
		if k, ok := keysInOrder(strings.Join(st.Want, "\n"), out); !ok {
			t.Errorf("%s: %s\nthe document's JSON key %q is not in the output, or not in the document's order; output:\n%s", where, cmd, k, out)
		}
		return
	}
	rules := append(append([]transcript.Rule{}, g.extraRules...), transcript.Live...)
	if _, ok := lookup(exact, g.file, cmd, func(r struct{ file, contains string }) (string, string) { return r.file, r.contains }); ok {
		rules = transcript.Exact
	}
	got := strings.Split(out, "\n")
	if strings.TrimSpace(out) == "" && len(st.Want) > 0 {
		// The output shown is a log the command's background process
		// writes (2> FILE &): wait until the log has it.
		log := logFile(run)
		if r, ok := lookup(logOf, g.file, cmd, rowKey); ok {
			log = g.rewrite(r.reason)
		}
		if log != "" {
			got = waitLog(t, log, st.Want, rules, g.undo)
		}
	}
	wantRules, gotRules := rules, rules
	if g.bind != nil && !slices.Equal(ruleNames(rules), ruleNames(transcript.Exact)) {
		wantRules = append([]transcript.Rule{g.bind.Doc}, rules...)
		gotRules = append([]transcript.Rule{g.bind.Run}, rules...)
		rules = gotRules
	}
	want := transcript.Normalise(st.Want, wantRules)
	gotN := transcript.Normalise(got, gotRules)
	if !transcript.Match(want, gotN) {
		t.Errorf("%s: %s\noutput differs from the document (normalised by: %s; - document, + run):\n%s\n(%d vs %d lines) raw output:\n%q",
			where, cmd, transcript.RuleNames(rules), transcript.Diff(want, gotN), len(want), len(gotN), got)
	}
}

// logOf names the log whose lines a step's captured output shows when the
// command does not write it itself (the reason column holds the path).
var logOf = []row{
	{"cmd/directory/README.md", "kill -TERM %3", "/tmp/kvdir/n3.log"},
}

var logRE = regexp.MustCompile(`2> (\S+) &\s*$`)

func ruleNames(rs []transcript.Rule) []string {
	var n []string
	for _, r := range rs {
		n = append(n, r.Name)
	}
	return n
}

// logFile is the log of the last process the step starts in the
// background (... 2> FILE &).
func logFile(cmd string) string {
	log := ""
	for _, l := range strings.Split(strings.TrimSpace(cmd), "\n") {
		if m := logRE.FindStringSubmatch(l); m != nil {
			log = m[1]
		}
	}
	return log
}

// waitLog waits until the log holds the document's lines in order (or
// the deadline passes) and returns those lines, or the whole log. Other
// lines may come between them: a log interleaves what its goroutines
// write, and a capture shows the lines it is about.
func waitLog(t *testing.T, file string, want []string, rules []transcript.Rule, undo func(string) string) []string {
	w := transcript.Normalise(want, rules)
	var lines, picked []string
	err := testkit.Poll(context.Background(), 20*time.Second, "the captured lines in "+file, func() (bool, string) {
		b, _ := os.ReadFile(file)
		lines = strings.Split(strings.TrimRight(undo(string(b)), "\n"), "\n")
		n := transcript.Normalise(lines, rules)
		picked = picked[:0]
		for i, k := 0, 0; i < len(n) && k < len(w); i++ {
			if transcript.Match(w[k:k+1], n[i:i+1]) {
				picked = append(picked, lines[i])
				k++
			}
		}
		return len(picked) == len(w), ""
	})
	if err != nil {
		return lines // the caller's comparison shows what is missing
	}
	return picked
}

func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s+"\n", x) {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// portsFree fails the test when a fixed port of the guides is taken.
func portsFree(t *testing.T, ports ...int) {
	t.Helper()
	for _, p := range ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d, which the guide uses, is taken on this machine: %v", p, err)
		}
		l.Close()
	}
}

var guidePorts = []int{7000, 7001, 7002, 7010, 7011, 7012, 7020, 7021, 7022, 8000, 8001, 8080, 5557, 5558, 5559, 5560, 9400, 9401}

// loadTolerance is added to the environment of everything the guides
// start. On a busy 2-core machine a router's directory look-up sometimes
// takes longer than its default 5 ms deadline, and the router then places
// by its fallback policy (X-Kvdir-Fallback), which no capture shows; a
// longer deadline keeps the run on the path the captures took.
var loadTolerance = []string{"KVDIR_ROUTER_MATCH_TIMEOUT=200ms"}

func newShell(t *testing.T, env ...string) *transcript.Shell {
	t.Helper()
	env = append(append([]string{"PATH=" + filepath.Join(root, "bin") + ":" + os.Getenv("PATH")}, loadTolerance...), env...)
	sh, err := transcript.NewShell(root, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	return sh
}

// waitCond waits, with testkit.Poll, until cond holds; on a timeout it
// fails t with what kvdirctl sees of the workers.
func waitCond(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if err := testkit.Poll(context.Background(), timeout, what, func() (bool, string) { return cond(), "" }); err != nil {
		t.Fatalf("%v\nkvdirctl workers --all:\n%s", err,
			kvdirctl("-d", "127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021", "workers", "--all"))
	}
}

func httpGet(url string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// checkDevOutput compares what kvbench dev printed with the output of
// make dev that docs/running.md shows.
func checkDevOutput(t *testing.T, got string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "docs/running.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The output is the first plain block after the make dev block.
	seen := false
	for _, b := range transcript.Parse("docs/running.md", src) {
		if b.Lang == "sh" && strings.TrimSpace(b.Text()) == "make dev" {
			seen = true
			continue
		}
		if seen && b.Lang == "" {
			want := transcript.Normalise(b.Lines, transcript.Live)
			gotN := transcript.Normalise(strings.Split(got, "\n"), transcript.Live)
			if !transcript.Match(want, gotN) {
				t.Errorf("docs/running.md:%d: make dev\noutput differs from the document (normalised by: %s; - document, + run):\n%s",
					b.Line, transcript.RuleNames(transcript.Live), transcript.Diff(want, gotN))
			}
			return
		}
	}
	t.Errorf("docs/running.md: no make dev block with its output")
}

func kvdirctl(args ...string) string {
	out, _ := exec.Command(filepath.Join(root, "bin", "kvdirctl"), args...).CombinedOutput()
	return string(out)
}

// leaderIs moves leadership to the member the capture shows leading.
func leaderIs(dir, id string) func(*testing.T, *transcript.Shell) {
	return func(t *testing.T, _ *transcript.Shell) {
		waitCond(t, id+" leading", 20*time.Second, func() bool {
			if regexp.MustCompile(`leader:\s+` + id + ` `).MatchString(kvdirctl("-d", dir, "status")) {
				return true
			}
			kvdirctl("-d", dir, "leader", "transfer", id)
			return false
		})
	}
}

// waitSession waits until the directory has recorded a session.
func waitSession(dir, session string) func(*testing.T, *transcript.Shell) {
	return func(t *testing.T, _ *transcript.Shell) {
		waitCond(t, "session "+session+" recorded", 20*time.Second, func() bool {
			out, err := exec.Command(filepath.Join(root, "bin", "kvdirctl"), "-d", dir, "sessions", "--prefix", session).CombinedOutput()
			return err == nil && strings.Contains(string(out), session+" ")
		})
	}
}

func TestGuides(t *testing.T) {
	if testing.Short() {
		t.Skip("starts directory clusters, engines, agents and routers as processes (e2e tier); not with -short")
	}
	start := time.Now()
	buildBin(t)
	tmp := t.TempDir()
	rw, undo := tmpRewrite(tmp)
	for _, d := range []string{"kvdir", "kvc"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fresh := func(t *testing.T) {
		for _, d := range []string{"kvdir", "kvc"} {
			os.RemoveAll(filepath.Join(tmp, d))
		}
		portsFree(t, guidePorts...)
		// On failure, the ends of the logs the guide's processes wrote.
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			for _, d := range []string{"kvdir", "kvc"} {
				logs, _ := filepath.Glob(filepath.Join(tmp, d, "*.log"))
				for _, l := range logs {
					b, _ := os.ReadFile(l)
					t.Logf("%s:\n%s", undo(l), tail(string(b), 6))
				}
			}
		})
	}

	t.Run("readme", func(t *testing.T) {
		guide{file: "README.md", rewrite: rw, undo: undo}.run(t, newShell(t))
	})
	t.Run("directory", func(t *testing.T) {
		fresh(t)
		guide{file: "cmd/directory/README.md", rewrite: rw, undo: undo,
			before: map[string]func(*testing.T, *transcript.Shell){
				// "Stopping the leader (n3 here)": the election's choice
				// in the capture, made so here.
				"kill -TERM %3": leaderIs("127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021", "n3"),
			}}.run(t, newShell(t))
	})
	t.Run("engine-side", func(t *testing.T) {
		fresh(t)
		guide{file: "docs/engine-side.md", rewrite: rw, undo: undo,
			before: map[string]func(*testing.T, *transcript.Shell){
				// The capture was taken a second or two later, after the
				// agent's first heartbeat, with n2 leading.
				"9400/metrics": func(t *testing.T, _ *transcript.Shell) {
					waitCond(t, "the agent's first heartbeat", 20*time.Second, func() bool {
						return strings.Contains(httpGet("http://127.0.0.1:9400/metrics"), `kvdir_agent_heartbeats_total{result="ok"`)
					})
				},
				"7012/metrics": leaderIs("127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021", "n2"),
				"kvbench agent list": func(t *testing.T, _ *transcript.Shell) {
					waitCond(t, "the engine's load in the directory", 20*time.Second, func() bool {
						return regexp.MustCompile(`prefix_hits: [1-9]`).MatchString(kvdirctl("-d", "127.0.0.1:7011", "workers", "get", "enginesim-0", "-o", "yaml"))
					})
				},
			}}.run(t, newShell(t))
	})
	t.Run("enginesim", func(t *testing.T) {
		fresh(t)
		guide{file: "cmd/enginesim/README.md", rewrite: rw, undo: undo}.run(t, newShell(t))
	})
	t.Run("running-by-hand", func(t *testing.T) {
		fresh(t)
		guide{file: "docs/running.md", rewrite: rw, undo: undo,
			headings: []string{"Build and test", "A directory cluster", "An engine simulator and its agent", "The router", "kvdirctl", "Stopping"},
			// A reader types the kvdirctl commands well after the router
			// has recorded the session (every 250 ms); the test waits for it.
			before: map[string]func(*testing.T, *transcript.Shell){
				"who-holds demo-1": waitSession("127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021", "demo-1"),
			},
		}.run(t, newShell(t))
	})
	t.Run("kvdirctl", func(t *testing.T) {
		fresh(t)
		kvdirctlGuide(t, rw, undo)
	})
	t.Run("dev-fleet", func(t *testing.T) {
		fresh(t)
		// make dev: ./bin/kvbench dev, until it prints the export line.
		dev := exec.Command(filepath.Join(root, "bin", "kvbench"), "dev")
		dev.Dir = root
		dev.Env = append(os.Environ(), loadTolerance...)
		var out strings.Builder
		dev.Stdout = &syncWriter{w: &out}
		if err := dev.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dev.Process.Signal(os.Interrupt); _ = dev.Wait() })
		var export string
		waitCond(t, "kvbench dev to print its export line", 90*time.Second, func() bool {
			m := regexp.MustCompile(`(?m)^  export (.*)$`).FindStringSubmatch(dev.Stdout.(*syncWriter).String())
			if m != nil {
				export = m[1]
			}
			return m != nil
		})
		checkDevOutput(t, dev.Stdout.(*syncWriter).String())
		env := strings.Fields(export)
		router := strings.TrimPrefix(env[0], "ROUTER=")
		// With both workers idle and empty, turn 1's worker is chosen at
		// random; every later turn must go where turn 1 went.
		tiebreak := func() *transcript.Binding {
			return transcript.NewBinding("worker", "sim-0 and sim-1, named in the order they first appear", `\bsim-[01]\b`)
		}
		guide{file: "docs/running.md", rewrite: rw, undo: undo, headings: []string{"A local fleet: `make dev`"},
			bind: tiebreak()}.run(t, newShell(t, env...))
		host := strings.TrimPrefix(router, "http://")
		guide{file: "cmd/router/README.md", headings: []string{"What a request looks like"},
			// running.md's session demo-1 already ran on this fleet; the
			// router guide's capture starts a fresh one.
			rewrite: func(s string) string {
				return strings.ReplaceAll(strings.ReplaceAll(s, "localhost:8080", host), "demo-1", "demo-r")
			},
			undo: func(s string) string { return strings.ReplaceAll(s, "demo-r", "demo-1") },
			bind: tiebreak(),
		}.run(t, newShell(t, env...))
	})
	t.Logf("guides took %v", time.Since(start).Round(time.Second))
}
