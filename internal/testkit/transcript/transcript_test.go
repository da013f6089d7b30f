package transcript

import (
	"strings"
	"testing"
	"time"
)

const doc = "# Guide\n\n## Part\n\n" +
	"```sh\nmake bin\n```\n\n" +
	"```sh\ncurl -s x\n```\n```\nready\n```\n\n" +
	"```\n$ kvdirctl who-holds\nkvdirctl: who-holds needs 1 argument(s): SESSION; got 0\n[exit 2]\n\n$ echo a \\\n  b\na b\n```\n\n" +
	"1. Item:\n\n   ```sh\n   chat x\n   ```\n"

func TestParseAndSteps(t *testing.T) {
	bs := Parse("g.md", []byte(doc))
	if len(bs) != 4 {
		t.Fatalf("got %d blocks, want 4 (the output block belongs to its command)", len(bs))
	}
	if s := bs[0].Steps(); len(s) != 1 || s[0].HasOutput || s[0].Cmd != "make bin" {
		t.Errorf("script step: %+v", s)
	}
	if s := bs[1].Steps(); len(s) != 1 || !s[0].HasOutput || strings.Join(s[0].Want, "|") != "ready" {
		t.Errorf("command with output block: %+v", s)
	}
	s := bs[2].Steps()
	if len(s) != 2 || s[0].WantExit != 2 || len(s[0].Want) != 1 || s[1].Cmd != "echo a \\\n  b" || s[1].Want[0] != "a b" {
		t.Errorf("transcript steps: %+v", s)
	}
	if bs[3].Heading != "Part" || bs[3].Text() != "chat x" {
		t.Errorf("indented block: %q under %q", bs[3].Text(), bs[3].Heading)
	}
}

func TestLiveNormalisation(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"enginesim-1   http://127.0.0.1:8001   llama3-8b   ACTIVE   1       9        0.0%       0         0         37.5%        1s",
			"enginesim-1 http://<addr> llama3-8b ACTIVE <n> <n> <n> <n> <n> <n> <dur>"},
		{"n3     127.0.0.1:7021   Leader     yes     3      750      750       0     0ms            674        0408cf26f22487ea",
			"n3 <addr> Leader yes <n> <n> <n> <n> <dur> <n> <hex>"},
		{"pick: enginesim-1, predicted cached tokens 96 (decided in 767 µs)", "pick: enginesim-1, predicted cached tokens <n> (decided in <dur>)"},
		{"Date: Tue, 01 Dec 2026 08:06:29 GMT", "Date: <time>"},
		{`ttft_sum{engine="0"} 0.007531268000123`, `ttft_sum{engine="<n>"} <n>`},
		{`"last_seen": "2026-12-01T08:24:32.146000493Z",`, `"last_seen": "<time>",`},
		{"kvdir directory v0.1.0 (commit 0123456789ab, go1.26.8 linux/amd64)", "kvdir directory <version> (commit <commit>, <go> <os/arch>)"},
	} {
		if got := Normalise([]string{c.in}, Live)[0]; got != c.want {
			t.Errorf("Normalise(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestMatchKeepsWhatMustNotDrift(t *testing.T) {
	doc := Normalise([]string{"ID   STATE    BLOCKS", "w-0  ACTIVE   3"}, Live)
	for name, got := range map[string][]string{
		"renamed column": {"ID   STATUS   BLOCKS", "w-0  ACTIVE   3"},
		"other state":    {"ID   STATE    BLOCKS", "w-0  DRAINING 3"},
		"other worker":   {"ID   STATE    BLOCKS", "w-1  ACTIVE   3"},
		"extra row":      {"ID   STATE    BLOCKS", "w-0  ACTIVE   3", "w-1  ACTIVE   0"},
	} {
		if Match(doc, Normalise(got, Live)) {
			t.Errorf("%s: matched the document", name)
		}
	}
	if !Match(doc, Normalise([]string{"ID   STATE    BLOCKS", "w-0  ACTIVE   12"}, Live)) {
		t.Errorf("another count did not match")
	}
	if !Match([]string{`{"id":"x",...,"n":1}`, "..."}, []string{`{"id":"x","a":2,"n":1}`, "more", "lines"}) {
		t.Errorf("ellipsis did not match")
	}
	if d := Diff([]string{"a", "b"}, []string{"a", "c"}); !strings.Contains(d, `- "b"`) || !strings.Contains(d, `+ "c"`) {
		t.Errorf("diff:\n%s", d)
	}
}

func TestShellKeepsStateAcrossSteps(t *testing.T) {
	sh, err := NewShell(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if out, rc, err := sh.Run("X=hello; f() { echo \"$X $1\"; }; sleep 30 &", 10*time.Second); err != nil || rc != 0 || out != "" {
		t.Fatalf("first step: %q %d %v", out, rc, err)
	}
	if out, rc, err := sh.Run("f world; echo oops >&2; false", 10*time.Second); err != nil || rc != 1 || out != "hello world\noops\n" {
		t.Fatalf("second step: %q %d %v", out, rc, err)
	}
	if out, _, _ := sh.Run("jobs -p | wc -l", 10*time.Second); strings.TrimSpace(out) != "1" {
		t.Fatalf("background job not kept: %q", out)
	}
}

func TestBindingNamesConsistently(t *testing.T) {
	b := NewBinding("worker", "w", `\bsim-[01]\b`)
	want := Normalise([]string{"turn 1 on sim-1", "turn 2 on sim-1"}, append([]Rule{b.Doc}, Live...))
	same := Normalise([]string{"turn 1 on sim-0", "turn 2 on sim-0"}, append([]Rule{b.Run}, Live...))
	if !Match(want, same) {
		t.Errorf("the other worker, used consistently, did not match: %q vs %q", want, same)
	}
	b = NewBinding("worker", "w", `\bsim-[01]\b`)
	want = Normalise([]string{"turn 1 on sim-1", "turn 2 on sim-1"}, append([]Rule{b.Doc}, Live...))
	moved := Normalise([]string{"turn 1 on sim-0", "turn 2 on sim-1"}, append([]Rule{b.Run}, Live...))
	if Match(want, moved) {
		t.Errorf("turn 2 on another worker matched: %q vs %q", want, moved)
	}
}
