// Package transcript reads the command transcripts in markdown documents and
// checks them against a real run: it finds the fenced code blocks, splits
// the ones that show commands with their output into steps, runs the steps
// in one persistent bash session, and compares what the commands print with
// what the document shows, after a few named normalisation rules.
//
// Two forms of transcript are recognised:
//
//   - a block whose lines start with "$ " is a transcript: each "$ " line is
//     a command (continued while it ends with a backslash), the lines up to
//     the next "$ " line are its output, and a "[exit N]" line is the
//     expected exit status (0 when absent);
//   - a ```sh block followed directly (only blank lines between) by a plain
//     ``` block is a command and its output.
//
// A ```sh block without output is a script step: it must exit 0.
package transcript

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// Block is one fenced code block of a markdown file.
type Block struct {
	File    string   // the file's name, as given to Parse
	Line    int      // 1-based line of the opening fence
	Lang    string   // the fence's info string ("sh", "yaml", "")
	Lines   []string // the body
	Heading string   // the nearest heading above the block
	// Output is the plain block that directly follows a ```sh block, if any.
	Output *Block
}

// Where is "file:line (heading)", for messages.
func (b *Block) Where() string {
	return b.File + ":" + strconv.Itoa(b.Line) + " (" + b.Heading + ")"
}

// Text is the body joined with newlines.
func (b *Block) Text() string { return strings.Join(b.Lines, "\n") }

// Parse returns the fenced code blocks of a markdown document, in order,
// with every ```sh block paired with a plain block that directly follows
// it. Blocks nested in list items (indented fences) are included, with the
// indentation removed.
func Parse(file string, src []byte) []*Block {
	var (
		blocks  []*Block
		cur     *Block
		indent  string
		heading string
		lineNo  int
		// lastEnd is the line of the last closing fence; gap counts
		// non-blank lines since then.
		lastEnd  = -1
		nonBlank bool
	)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur != nil {
			if strings.HasPrefix(trimmed, "```") && strings.TrimSpace(trimmed) == "```" {
				blocks = append(blocks, cur)
				cur = nil
				lastEnd, nonBlank = lineNo, false
				continue
			}
			cur.Lines = append(cur.Lines, strings.TrimPrefix(line, indent))
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			indent = line[:len(line)-len(trimmed)]
			cur = &Block{File: file, Line: lineNo, Lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), Heading: heading}
			if len(blocks) > 0 && cur.Lang == "" && lastEnd >= 0 && !nonBlank {
				if prev := blocks[len(blocks)-1]; prev.Lang == "sh" && prev.Output == nil {
					prev.Output = cur
				}
			}
			continue
		}
		if strings.TrimSpace(line) != "" {
			nonBlank = true
		}
		if strings.HasPrefix(line, "#") {
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	// Output blocks are reachable from their command block; drop them from
	// the top-level list.
	var out []*Block
	paired := map[*Block]bool{}
	for _, b := range blocks {
		if b.Output != nil {
			paired[b.Output] = true
		}
	}
	for _, b := range blocks {
		if !paired[b] {
			out = append(out, b)
		}
	}
	return out
}

// Step is one command of a transcript with the output the document shows.
type Step struct {
	Line     int    // 1-based line in the file
	Cmd      string // the command, continuation lines joined with newlines
	Want     []string
	WantExit int
	// HasOutput is false for a script step (a ```sh block without output),
	// whose output is not compared.
	HasOutput bool
}

// IsTranscript reports whether the block shows "$ " commands.
func (b *Block) IsTranscript() bool {
	for _, l := range b.Lines {
		if strings.HasPrefix(l, "$ ") {
			return true
		}
		if strings.TrimSpace(l) != "" {
			return false
		}
	}
	return false
}

// Steps splits a block into steps: the "$ " commands of a transcript, or a
// ```sh block as one step (with its paired output, if any). Other blocks
// have no steps.
func (b *Block) Steps() []Step {
	if b.IsTranscript() {
		return b.transcriptSteps()
	}
	if b.Lang != "sh" {
		return nil
	}
	s := Step{Line: b.Line + 1, Cmd: b.Text()}
	if b.Output != nil {
		s.HasOutput = true
		s.Want = b.Output.Lines
	}
	return []Step{s}
}

func (b *Block) transcriptSteps() []Step {
	var steps []Step
	cont := false
	for i, l := range b.Lines {
		switch {
		case cont:
			st := &steps[len(steps)-1]
			st.Cmd += "\n" + l
			cont = strings.HasSuffix(l, "\\")
		case strings.HasPrefix(l, "$ "):
			steps = append(steps, Step{Line: b.Line + 1 + i, Cmd: strings.TrimPrefix(l, "$ "), HasOutput: true})
			cont = strings.HasSuffix(l, "\\")
		case len(steps) > 0:
			st := &steps[len(steps)-1]
			if n, ok := exitLine(l); ok {
				st.WantExit = n
				continue
			}
			st.Want = append(st.Want, l)
		}
	}
	for i := range steps {
		steps[i].Want = trimBlankEnds(steps[i].Want)
	}
	return steps
}

func exitLine(l string) (int, bool) {
	if !strings.HasPrefix(l, "[exit ") || !strings.HasSuffix(l, "]") {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(l, "[exit "), "]"))
	return n, err == nil
}

func trimBlankEnds(ls []string) []string {
	for len(ls) > 0 && strings.TrimSpace(ls[len(ls)-1]) == "" {
		ls = ls[:len(ls)-1]
	}
	for len(ls) > 0 && strings.TrimSpace(ls[0]) == "" {
		ls = ls[1:]
	}
	return ls
}
