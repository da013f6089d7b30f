// Package docgen keeps the figure tables in the repository's Markdown files
// in step with the results files they quote (bench/results/*.json): every
// block between
//
//	<!-- BEGIN generated: NAME -->
//	<!-- END generated: NAME -->
//
// is rendered from the results, so a figure is measured once and copied by
// no one (kvbench docs rewrites the blocks, kvbench docs --check and this
// package's test fail when one has drifted).
//
// NAME is one of Names(): a table over a benchmark tool's results
// (blocks.go), or the stem of a sim or replay report in bench/results, whose
// block is that report's Markdown table, as kvbench report writes it.
package docgen

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/benchjson"
)

// ResultsDir is where the results files live, relative to the repository
// root.
const ResultsDir = "bench/results"

var (
	beginRE = regexp.MustCompile(`^<!-- BEGIN generated: ([A-Za-z0-9._-]+) -->$`)
	endRE   = regexp.MustCompile(`^<!-- END generated: ([A-Za-z0-9._-]+) -->$`)
)

// Block is one generated block of a Markdown file.
type Block struct {
	File string // relative to the root
	Line int    // of its BEGIN marker, from 1
	Name string
}

func (b Block) String() string { return fmt.Sprintf("%s:%d: block %s", b.File, b.Line, b.Name) }

// Generator renders blocks from one repository's results, each results
// file read once.
type Generator struct {
	root  string
	cache map[string]string
}

// New returns a generator for the repository at root.
func New(root string) *Generator { return &Generator{root: root, cache: map[string]string{}} }

// Render returns the content of block name (ending in a newline).
func (g *Generator) Render(name string) (string, error) {
	if s, ok := g.cache[name]; ok {
		return s, nil
	}
	var (
		s   string
		err error
	)
	if t, ok := tables[name]; ok {
		s, err = t.render(filepath.Join(g.root, ResultsDir))
	} else {
		s, err = g.renderReport(name)
	}
	if err != nil {
		return "", fmt.Errorf("block %s: %w", name, err)
	}
	g.cache[name] = s
	return s, nil
}

// renderReport renders the sim or replay report bench/results/NAME.json,
// or, for a capacity result (kvbench sweep or eval), the Markdown table
// the tool wrote beside it (NAME.md).
func (g *Generator) renderReport(name string) (string, error) {
	path := filepath.Join(g.root, ResultsDir, name+".json")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("not a known table (%s) and no report %s: %w", strings.Join(slices.Sorted(tableNames()), ", "),
			filepath.Join(ResultsDir, name+".json"), err)
	}
	if env, err := benchjson.ReadFile(path); err == nil && (env.Tool == "sweep" || env.Tool == "eval") {
		// A capacity result: its block is the table the tool wrote beside it.
		md, err := os.ReadFile(filepath.Join(g.root, ResultsDir, name+".md"))
		if err != nil {
			return "", fmt.Errorf("capacity result %s: %w", name, err)
		}
		return string(md), nil
	}
	r, err := report.ReadFile(path)
	if err != nil {
		return "", err
	}
	if err := r.Validate(); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	var b strings.Builder
	if err := report.Markdown(&b, r); err != nil {
		return "", fmt.Errorf("render %s: %w", path, err)
	}
	return b.String(), nil
}

// Names lists the table blocks a file may carry besides the reports'.
func Names() []string { return slices.Sorted(tableNames()) }

// Update rewrites every generated block of the Markdown files under the
// root and returns the blocks it changed. With dryRun it writes nothing:
// the blocks returned are those that have drifted from the results.
func (g *Generator) Update(dryRun bool) ([]Block, error) {
	files, err := markdownFiles(g.root)
	if err != nil {
		return nil, err
	}
	var changed []Block
	for _, rel := range files {
		path := filepath.Join(g.root, rel)
		old, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", rel, err)
		}
		if !bytes.Contains(old, []byte("<!-- BEGIN generated: ")) && !bytes.Contains(old, []byte("<!-- END generated: ")) {
			continue
		}
		out, blocks, err := g.rewrite(rel, string(old))
		if err != nil {
			return nil, err
		}
		changed = append(changed, blocks...)
		if dryRun || out == string(old) {
			continue
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", rel, err)
		}
	}
	return changed, nil
}

// rewrite returns text with its blocks rendered, and the blocks whose
// content changed.
func (g *Generator) rewrite(file, text string) (string, []Block, error) {
	lines := strings.SplitAfter(text, "\n")
	var (
		out     strings.Builder
		changed []Block
		open    *Block
		body    strings.Builder
	)
	for i, line := range lines {
		bare := strings.TrimRight(line, "\r\n")
		if m := beginRE.FindStringSubmatch(bare); m != nil {
			if open != nil {
				return "", nil, fmt.Errorf("%s:%d: block %s begins inside block %s", file, i+1, m[1], open.Name)
			}
			open = &Block{File: file, Line: i + 1, Name: m[1]}
			body.Reset()
			out.WriteString(line)
			continue
		}
		if m := endRE.FindStringSubmatch(bare); m != nil {
			if open == nil || m[1] != open.Name {
				return "", nil, fmt.Errorf("%s:%d: END of block %s without its BEGIN", file, i+1, m[1])
			}
			content, err := g.Render(open.Name)
			if err != nil {
				return "", nil, fmt.Errorf("%s:%d: %w", file, open.Line, err)
			}
			if body.String() != content {
				changed = append(changed, *open)
			}
			out.WriteString(content)
			out.WriteString(line)
			open = nil
			continue
		}
		if open != nil {
			body.WriteString(line)
			continue
		}
		out.WriteString(line)
	}
	if open != nil {
		return "", nil, fmt.Errorf("%s: no END marker", open)
	}
	return out.String(), changed, nil
}

// markdownFiles lists the .md files under root (relative paths, sorted),
// skipping hidden directories and the results themselves.
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || filepath.ToSlash(rel) == ResultsDir) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list Markdown files: %w", err)
	}
	slices.Sort(files)
	return files, nil
}

// FindRoot returns the repository root: the nearest directory above dir
// (itself included) with a go.mod.
func FindRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}
