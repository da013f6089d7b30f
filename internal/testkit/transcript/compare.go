package transcript

import (
	"fmt"
	"regexp"
	"strings"
)

// Rule is one named normalisation: it rewrites a line of output, the
// document's and the run's alike, so that what may differ between runs
// compares equal and everything else must match.
type Rule struct {
	Name string
	Doc  string // what it replaces, for the failure message
	fn   func(string) string
}

func (r Rule) Apply(s string) string { return r.fn(s) }

// NewRule is a rule replacing a regular expression's matches.
func NewRule(name, doc, pattern, repl string) Rule { return reRule(name, doc, pattern, repl) }

func reRule(name, doc, pattern, repl string) Rule {
	re := regexp.MustCompile(pattern)
	return Rule{Name: name, Doc: doc, fn: func(s string) string { return re.ReplaceAllString(s, repl) }}
}

// The rules. Exact comparison uses Version and Spaces only; live
// comparison uses Live, in that order.
var (
	Version = reRule("version", "the version, commit and Go release in a --version line",
		`kvdir (\S+) \S+ \(commit \S+, go\S+ \S+\)`, "kvdir $1 <version> (commit <commit>, <go> <os/arch>)")
	Times = reRule("time", "timestamps: RFC 3339, HTTP dates, clock times, Unix times in JSON",
		`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?|[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT|\b\d\d:\d\d:\d\d\b|"created":\d+`,
		"<time>")
	Addrs = reRule("addr", "host:port addresses (IPv4, localhost, [::], *) and temporary folders",
		`\b\d{1,3}(\.\d{1,3}){3}:\d+\b|\blocalhost:\d+\b|\[::\]:\d+|\*:\d+|/tmp/kvdir-dev-\d+`, "<addr>")
	IDs = reRule("id", "request ids the engine makes up",
		`chatcmpl-[a-z0-9]+-\d+`, "chatcmpl-<id>")
	Hashes    = Rule{Name: "hash", Doc: "hexadecimal digests and block hashes (12 or more hex digits, not the decimals of a number)", fn: hashes}
	Durations = reRule("duration", "durations with a unit: 5ms, 3m1s, 767 µs, +4.2 ms",
		`[-+]?\b(\d+(\.\d+)?(h|ms|µs|us|ns|m|s))+\b|[-+]?\b\d+(\.\d+)? (ms|µs|s)\b`, "<dur>")
	Numbers = Rule{Name: "number", Doc: "numbers not part of a name (enginesim-0, llama3-8b and n1 stay)", fn: numbers}
	Spaces  = reRule("spaces", "runs of spaces (table columns are as wide as their values) and trailing space",
		`[ \t]+`, " ")
	// Live is the normalisation of output from a running fleet.
	Live = []Rule{Version, Times, Addrs, IDs, Hashes, Durations, Numbers, Spaces}
	// Exact keeps everything but the build's version and column padding.
	Exact = []Rule{Version, Spaces}
)

var hexRE = regexp.MustCompile(`\b[0-9a-f]{12,}\b`)

// hashes replaces runs of 12 or more hex digits by <hex>, except after a
// decimal point: 0.007531268000123 is a number, whatever its length.
func hashes(s string) string {
	var b strings.Builder
	last := 0
	for _, m := range hexRE.FindAllStringIndex(s, -1) {
		if m[0] > 0 && s[m[0]-1] == '.' {
			continue
		}
		b.WriteString(s[last:m[0]])
		b.WriteString("<hex>")
		last = m[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

var numRE = regexp.MustCompile(`[-+]?\d+(\.\d+)?([eE][-+]?\d+)?%?`)

func isWord(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// numbers replaces numbers by <n>, except where they are part of a name: a
// number right after a letter, digit or underscore, after a dash that
// follows one (enginesim-0), or right before a letter (8b).
func numbers(s string) string {
	var b strings.Builder
	last := 0
	for _, m := range numRE.FindAllStringIndex(s, -1) {
		i, j := m[0], m[1]
		if s[i] == '-' || s[i] == '+' {
			if i > 0 && isWord(s[i-1]) {
				continue // a name like enginesim-0
			}
		} else if i > 0 && (isWord(s[i-1]) || s[i-1] == '-' && i > 1 && isWord(s[i-2])) {
			continue
		}
		if j < len(s) && (s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z') {
			continue
		}
		b.WriteString(s[last:i])
		b.WriteString("<n>")
		last = j
	}
	b.WriteString(s[last:])
	return b.String()
}

// Normalise applies the rules to every line, trims trailing space and
// carriage returns, and drops blank lines at both ends.
func Normalise(lines []string, rules []Rule) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		l = strings.TrimRight(l, "\r")
		for _, r := range rules {
			l = r.Apply(l)
		}
		out = append(out, strings.TrimRight(l, " "))
	}
	return trimBlankEnds(out)
}

// Match compares normalised output with the document's normalised lines.
// In the document, a line that is only "..." stands for any number of
// lines, and "..." inside a line for any text (an abridged capture).
func Match(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if strings.TrimSpace(want[0]) == "..." {
		for k := 0; k <= len(got); k++ {
			if Match(want[1:], got[k:]) {
				return true
			}
		}
		return false
	}
	if len(got) == 0 || !lineMatch(want[0], got[0]) {
		return false
	}
	return Match(want[1:], got[1:])
}

func lineMatch(want, got string) bool {
	if !strings.Contains(want, "...") {
		return want == got
	}
	parts := strings.Split(want, "...")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got)
}

// Diff is a line diff of the normalised document text (-) against the
// normalised output (+), with unchanged lines indented.
func Diff(want, got []string) string {
	n, m := len(want), len(got)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if lineMatch(want[i], got[j]) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var b strings.Builder
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && lineMatch(want[i], got[j]):
			fmt.Fprintf(&b, "  %q\n", got[j])
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			fmt.Fprintf(&b, "+ %q\n", got[j])
			j++
		default:
			fmt.Fprintf(&b, "- %q\n", want[i])
			i++
		}
	}
	return b.String()
}

// RuleNames lists rules as "name (what it replaces)", for messages.
func RuleNames(rules []Rule) string {
	var s []string
	for _, r := range rules {
		s = append(s, r.Name)
	}
	return strings.Join(s, ", ")
}

// Binding is a rule for names a run may choose differently from the
// capture but must use consistently, such as the worker a random
// tie-break picks: the first name matched in the document and the first
// matched in the run both become <name:a>, the second ones <name:b>, and
// so on, across every step it is used for. Doc and Run are the two sides'
// rules.
type Binding struct {
	Doc, Run Rule
}

// NewBinding returns the binding rule for a pattern.
func NewBinding(name, doc, pattern string) *Binding {
	re := regexp.MustCompile(pattern)
	side := func() Rule {
		seen := map[string]int{}
		return Rule{Name: name, Doc: doc, fn: func(s string) string {
			return re.ReplaceAllStringFunc(s, func(m string) string {
				if _, ok := seen[m]; !ok {
					seen[m] = len(seen) + 1
				}
				// Letters, not digits, which the number rule would replace.
				return fmt.Sprintf("<%s:%c>", name, 'a'+rune(seen[m]-1))
			})
		}}
	}
	return &Binding{Doc: side(), Run: side()}
}
