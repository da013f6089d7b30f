package docgen

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// TestDocsMatchResults fails when a generated block in the repository's
// Markdown files differs from what bench/results gives (make docs-check
// runs the same check through kvbench).
func TestDocsMatchResults(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	drift, err := New(root).Update(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range drift {
		t.Errorf("%s differs from %s", b, ResultsDir)
	}
	if len(drift) > 0 {
		t.Log("regenerate with: go run ./bench/cmd/kvbench docs")
	}
}

// TestEveryTableRenders renders each table block from the committed
// results, so a results file that lost a figure a table quotes fails here
// even if no Markdown file carries that block.
func TestEveryTableRenders(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	g := New(root)
	for _, name := range Names() {
		s, err := g.Render(name)
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.HasPrefix(s, "|") || !strings.HasSuffix(s, "|\n") || strings.Contains(s, "<no value>") {
			t.Errorf("block %s:\n%s", name, s)
		}
	}
}

// repo makes a repository with the committed index results and one
// Markdown file.
func repo(t *testing.T, md string) (root, file string) {
	t.Helper()
	root = t.TempDir()
	src, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(src, ResultsDir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string]string{"go.mod": "module x\n", filepath.Join(ResultsDir, "index.json"): string(b),
		"docs/a.md": md} {
		path = filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, filepath.Join(root, "docs/a.md")
}

func TestDriftIsFoundAndRewritten(t *testing.T) {
	md := "# Figures\n\nBefore.\n\n<!-- BEGIN generated: index -->\n| figure | target | measured |\n| hand-copied | >= 5 M | 9.8 M |\n<!-- END generated: index -->\n\nAfter.\n"
	root, file := repo(t, md)
	g := New(root)
	drift, err := g.Update(true)
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) != 1 || drift[0].Name != "index" || drift[0].File != filepath.Join("docs", "a.md") || drift[0].Line != 5 {
		t.Fatalf("drift %v", drift)
	}
	if b, _ := os.ReadFile(file); string(b) != md {
		t.Fatal("a check wrote the file")
	}
	if _, err := g.Update(false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := g.Render("index")
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	if !strings.HasPrefix(got, "# Figures\n\nBefore.\n\n<!-- BEGIN generated: index -->\n"+want+"<!-- END generated: index -->\n\nAfter.\n") {
		t.Fatalf("rewritten:\n%s", got)
	}
	if !strings.Contains(want, "| block events applied per second, one goroutine | >= 5 M | 9.9 M |") {
		t.Fatalf("index block:\n%s", want)
	}
	if drift, err := New(root).Update(true); err != nil || len(drift) != 0 {
		t.Fatalf("after the rewrite: drift %v, err %v", drift, err)
	}
}

func TestMarkerErrors(t *testing.T) {
	cases := map[string]string{
		"<!-- BEGIN generated: nope -->\n<!-- END generated: nope -->\n":                        "no report",
		"<!-- BEGIN generated: index -->\n| x |\n":                                              "no END marker",
		"text\n<!-- END generated: index -->\n":                                                 "without its BEGIN",
		"<!-- BEGIN generated: index -->\n<!-- BEGIN generated: index-fields -->\n":             "begins inside",
		"<!-- BEGIN generated: index-goradix -->\n<!-- END generated: index-goradix -->\n":      "", // fine
		"<!-- BEGIN generated: directory -->\n<!-- END generated: directory -->\n":              "directory.json",
		"<!-- BEGIN generated: index -->\n<!-- END generated: index-fields -->\n<!-- END -->\n": "without its BEGIN",
	}
	for md, want := range cases {
		root, _ := repo(t, md)
		_, err := New(root).Update(true)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", md, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want %q", md, err, want)
		}
	}
}

func TestNumber(t *testing.T) {
	for _, c := range []struct {
		v      float64
		digits int
		want   string
	}{
		{2235965.3726767353, 0, "2,235,965"}, {3168.624695969905, 0, "3,169"}, {999.5, 0, "1,000"}, {19.154, 1, "19.2"},
		{0.002905909, 3, "0.003"}, {-1234.5, 1, "-1,234.5"}, {17594, 0, "17,594"}, {100, 0, "100"},
	} {
		if got := Number(c.v, c.digits); got != c.want {
			t.Errorf("Number(%v, %d) = %q, want %q", c.v, c.digits, got, c.want)
		}
	}
}

// TestCapacityBlock: a capacity result's block is the table its tool
// wrote beside the JSON.
func TestCapacityBlock(t *testing.T) {
	root, _ := repo(t, "x\n")
	res := benchjson.New("eval")
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	const table = "| member | kvdir |\n|---|---|\n| a | 1.2 |\n"
	for name, data := range map[string]string{"capacity-eval.json": string(b), "capacity-eval.md": table} {
		if err := os.WriteFile(filepath.Join(root, ResultsDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := New(root).Render("capacity-eval")
	if err != nil {
		t.Fatal(err)
	}
	if got != table {
		t.Fatalf("block %q, want %q", got, table)
	}
}
