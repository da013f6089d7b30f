// Package grafana holds kvdir's Grafana dashboard (kvdir-dashboard.json) and
// what its test needs to prove the dashboard queries metrics that exist: a
// reader of Grafana dashboard JSON and a small PromQL scanner that lists the
// metric names, label matchers and grouping labels of an expression.
//
// The scanner is not a PromQL parser. It knows PromQL's lexical structure
// (strings, label matchers in braces, ranges in brackets, numbers and
// durations, Grafana's $variables) and its function and keyword names, which
// is enough to tell every metric name in an expression from everything
// else, and to reject an unknown function or unbalanced brackets.
package grafana

import (
	"fmt"
	"strings"
	"unicode"
)

// Matcher is one label matcher of a selector: job="x", le!="", a=~"b.*".
type Matcher struct {
	Label, Op, Value string
}

// Selector is a metric name in an expression with its label matchers.
type Selector struct {
	Metric   string
	Matchers []Matcher
}

// Query is what Scan finds in one PromQL expression.
type Query struct {
	Selectors []Selector
	// Grouping lists the labels of by (...), without (...), on (...),
	// ignoring (...) and group_left/right (...) clauses.
	Grouping []string
}

// functions are PromQL's functions and aggregation operators (Prometheus 3).
var functions = toSet(
	// aggregations
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio",
	// functions
	"abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
	"day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
	"histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
	"histogram_stdvar", "histogram_sum", "double_exponential_smoothing", "holt_winters", "hour", "idelta",
	"increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
	"predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sort_by_label",
	"sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year",
	"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
	"quantile_over_time", "stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time",
	"mad_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh",
	"tan", "tanh", "deg", "rad", "pi", "info",
)

// groupingKeywords are followed by a parenthesised list of label names.
var groupingKeywords = toSet("by", "without", "on", "ignoring", "group_left", "group_right")

// keywords are the other words that are not metric names.
var keywords = toSet("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end")

func toSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func isIdentStart(r byte) bool { return r == '_' || r == ':' || unicode.IsLetter(rune(r)) }
func isIdentChar(r byte) bool  { return isIdentStart(r) || (r >= '0' && r <= '9') }

// Scan lists the metric names (with their matchers) and grouping labels of
// a PromQL expression. It fails on an unknown function, an unterminated
// string or brackets that do not balance.
func Scan(expr string) (Query, error) {
	var q Query
	var stack []byte
	i, n := 0, len(expr)
	skipSpace := func(j int) int {
		for j < n && (expr[j] == ' ' || expr[j] == '\t' || expr[j] == '\n' || expr[j] == '\r') {
			j++
		}
		return j
	}
	for i < n {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			end, _, err := readString(expr, i)
			if err != nil {
				return q, err
			}
			i = end
		case c == '#': // comment to the end of the line
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '$': // Grafana variable: $name, ${name}, $__rate_interval
			i++
			if i < n && expr[i] == '{' {
				for i < n && expr[i] != '}' {
					i++
				}
				i++
			} else {
				for i < n && isIdentChar(expr[i]) {
					i++
				}
			}
		case c == '{':
			// Matchers with no metric name before them: {__name__="x"}.
			ms, end, err := readMatchers(expr, i)
			if err != nil {
				return q, err
			}
			sel := Selector{Matchers: ms}
			for _, m := range ms {
				if m.Label == "__name__" && m.Op == "=" {
					sel.Metric = m.Value
				}
			}
			if sel.Metric == "" {
				return q, fmt.Errorf("selector at offset %d has no metric name", i)
			}
			q.Selectors = append(q.Selectors, sel)
			i = end
		case c == '[':
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return q, fmt.Errorf("unclosed [ at offset %d", i)
			}
			i += end + 1
		case c == '(':
			stack = append(stack, ')')
			i++
		case c == ')':
			if len(stack) == 0 || stack[len(stack)-1] != ')' {
				return q, fmt.Errorf("unbalanced ) at offset %d", i)
			}
			stack = stack[:len(stack)-1]
			i++
		case c == ']' || c == '}':
			return q, fmt.Errorf("unbalanced %c at offset %d", c, i)
		case c >= '0' && c <= '9' || (c == '.' && i+1 < n && expr[i+1] >= '0' && expr[i+1] <= '9'):
			// number or duration: 0.99, 1e3, 0x1f, 5m, 1h30m
			for i < n && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < n && isIdentChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := skipSpace(i)
			switch {
			case groupingKeywords[word]:
				if next < n && expr[next] == '(' {
					end := strings.IndexByte(expr[next:], ')')
					if end < 0 {
						return q, fmt.Errorf("unclosed %s ( at offset %d", word, next)
					}
					for _, l := range strings.Split(expr[next+1:next+end], ",") {
						if l = strings.TrimSpace(l); l != "" {
							q.Grouping = append(q.Grouping, l)
						}
					}
					i = next + end + 1
				}
			case keywords[word]:
			case functions[word] && followedByGrouping(expr[next:]):
				// sum by (pod) (...), sum without (x) (...)
			case next < n && expr[next] == '(':
				if !functions[word] {
					return q, fmt.Errorf("unknown function %q", word)
				}
			default:
				sel := Selector{Metric: word}
				if next < n && expr[next] == '{' {
					ms, end, err := readMatchers(expr, next)
					if err != nil {
						return q, err
					}
					sel.Matchers = ms
					i = end
				}
				q.Selectors = append(q.Selectors, sel)
			}
		default: // operators, commas, @
			i++
		}
	}
	if len(stack) > 0 {
		return q, fmt.Errorf("%d unclosed (", len(stack))
	}
	return q, nil
}

// followedByGrouping reports whether rest starts with "by" or "without"
// as a word.
func followedByGrouping(rest string) bool {
	for _, k := range []string{"by", "without"} {
		if strings.HasPrefix(rest, k) && (len(rest) == len(k) || !isIdentChar(rest[len(k)])) {
			return true
		}
	}
	return false
}

// readString reads the quoted string starting at expr[i] and returns the
// offset after it and its contents (escapes kept as written, except \").
func readString(expr string, i int) (int, string, error) {
	quote := expr[i]
	var b strings.Builder
	for j := i + 1; j < len(expr); j++ {
		switch {
		case expr[j] == '\\' && quote != '`' && j+1 < len(expr):
			if expr[j+1] != quote {
				b.WriteByte('\\')
			}
			b.WriteByte(expr[j+1])
			j++
		case expr[j] == quote:
			return j + 1, b.String(), nil
		default:
			b.WriteByte(expr[j])
		}
	}
	return 0, "", fmt.Errorf("unterminated string at offset %d", i)
}

// readMatchers reads {a="b", c=~"d"} starting at expr[i] == '{'.
func readMatchers(expr string, i int) ([]Matcher, int, error) {
	var ms []Matcher
	j := i + 1
	for {
		for j < len(expr) && (expr[j] == ' ' || expr[j] == ',' || expr[j] == '\n' || expr[j] == '\t') {
			j++
		}
		if j >= len(expr) {
			return nil, 0, fmt.Errorf("unclosed { at offset %d", i)
		}
		if expr[j] == '}' {
			return ms, j + 1, nil
		}
		start := j
		for j < len(expr) && isIdentChar(expr[j]) {
			j++
		}
		label := expr[start:j]
		for j < len(expr) && expr[j] == ' ' {
			j++
		}
		opStart := j
		for j < len(expr) && strings.IndexByte("=!~", expr[j]) >= 0 {
			j++
		}
		op := expr[opStart:j]
		switch {
		case label == "":
			return nil, 0, fmt.Errorf("label matcher without a label name at offset %d", start)
		case op != "=" && op != "!=" && op != "=~" && op != "!~":
			return nil, 0, fmt.Errorf("label matcher %s: bad operator %q", label, op)
		}
		for j < len(expr) && expr[j] == ' ' {
			j++
		}
		if j >= len(expr) || strings.IndexByte("\"'`", expr[j]) < 0 {
			return nil, 0, fmt.Errorf("label matcher %s%s: value is not a string", label, op)
		}
		end, value, err := readString(expr, j)
		if err != nil {
			return nil, 0, err
		}
		ms = append(ms, Matcher{Label: label, Op: op, Value: value})
		j = end
	}
}
