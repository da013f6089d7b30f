// Package clitable renders the output of kvdir's command-line tools: aligned
// tables for people (kubectl style: upper-case headers, columns separated by
// spaces) and JSON or YAML documents for scripts, from one value.
//
// A command builds a value with JSON tags (the document) and a Table (what a
// person reads), and calls Write with the format the user chose. YAML is the
// JSON document converted by sigs.k8s.io/yaml, so both formats have the same
// keys. Numbers that are not finite are null in both (Float); control
// characters are escaped in every format (Escape, SafeWriter, and \uXXXX in
// JSON and YAML strings), so that values from the directory cannot act on
// the operator's terminal.
package clitable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// Format is an output format.
type Format string

// The output formats.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Formats lists the formats ParseFormat accepts.
var Formats = []Format{Table, JSON, YAML}

// ErrUnknownFormat is returned by ParseFormat for a name it does not know.
var ErrUnknownFormat = errors.New("unknown output format")

// ParseFormat returns the format named s ("table", "json" or "yaml"; "" is
// table, "yml" is yaml).
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "table":
		return Table, nil
	case "json":
		return JSON, nil
	case "yaml", "yml":
		return YAML, nil
	}
	return "", fmt.Errorf("%w %q: use table, json or yaml", ErrUnknownFormat, s)
}

// Tab is a table: a header row and data rows of already formatted cells.
type Tab struct {
	Header []string
	Rows   [][]string
}

// NewTab returns a table with the given column headers.
func NewTab(header ...string) *Tab { return &Tab{Header: header} }

// Add appends a row; each cell is formatted with fmt.Sprint.
func (t *Tab) Add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = fmt.Sprint(c)
	}
	t.Rows = append(t.Rows, row)
}

// WriteTo writes the table with its columns aligned, three spaces apart,
// and no trailing spaces. Tabs, newlines and carriage returns inside cells
// are replaced by spaces so that they cannot break the alignment, and
// other control characters are escaped (Escape) so that they cannot act
// on the terminal.
func (t *Tab) WriteTo(w io.Writer) (int64, error) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 8, 3, ' ', 0)
	line := func(cells []string) {
		for i, c := range cells {
			if i > 0 {
				io.WriteString(tw, "\t")
			}
			io.WriteString(tw, clean(c))
		}
		io.WriteString(tw, "\n")
	}
	if len(t.Header) > 0 {
		line(t.Header)
	}
	for _, r := range t.Rows {
		line(r)
	}
	if err := tw.Flush(); err != nil {
		return 0, err
	}
	var out bytes.Buffer
	for _, l := range strings.SplitAfter(buf.String(), "\n") {
		if l == "" {
			continue
		}
		out.WriteString(strings.TrimRight(l, " \n"))
		out.WriteByte('\n')
	}
	n, err := w.Write(out.Bytes())
	return int64(n), err
}

func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
	return Escape(s, nil)
}

// Write renders doc in format f: JSON (indented) or YAML of doc, or, for
// Table, whatever table writes (it is not called for the other formats).
func Write(w io.Writer, f Format, doc any, table func(io.Writer) error) error {
	switch f {
	case JSON:
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		b = append(jsonSafe(b), '\n')
		_, err = w.Write(b)
		return err
	case YAML:
		j, err := json.Marshal(doc)
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		// The YAML reader refuses raw control characters: escaped first.
		j = jsonSafe(j)
		b, err := yaml.JSONToYAML(j)
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		if hasUnsafe(b) {
			// The emitter writes some (NEL, bidirectional overrides)
			// raw. JSON is YAML too: the escaped document, which YAML
			// parsers read as the same values.
			var ind bytes.Buffer
			if err := json.Indent(&ind, j, "", "  "); err != nil {
				return fmt.Errorf("encode yaml: %w", err)
			}
			b = append(ind.Bytes(), '\n')
		}
		_, err = w.Write(b)
		return err
	case Table, "":
		return table(w)
	}
	return fmt.Errorf("%w %q", ErrUnknownFormat, string(f))
}

// Age formats a duration as kubectl does for ages: the two largest units,
// e.g. "850ms", "42s", "3m12s", "5h3m", "2d4h". Negative durations (clock
// skew between machines) are shown as "0s".
func Age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m := int(d.Minutes())
		return fmt.Sprintf("%dm%ds", m, int(d.Seconds())-60*m)
	case d < 48*time.Hour:
		h := int(d.Hours())
		return fmt.Sprintf("%dh%dm", h, int(d.Minutes())-60*h)
	}
	days := int(d.Hours() / 24)
	return fmt.Sprintf("%dd%dh", days, int(d.Hours())-24*days)
}

// Percent formats part/whole as a percentage with one decimal ("-" when
// whole is 0 or the result is not finite).
func Percent(part, whole float64) string {
	if p := float64(part) / float64(whole); whole == 0 || math.IsNaN(p) || math.IsInf(p, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}

// Millis formats modelled milliseconds with one decimal.
func Millis(ms float64) string {
	if v := float64(ms); math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(ms))
}

// Bytes formats a byte count with binary units ("512 B", "12.0 KiB").
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
