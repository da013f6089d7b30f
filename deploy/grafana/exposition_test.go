package grafana

import (
	"bufio"
	"fmt"
	"strings"
)

// family is one metric family as seen on a /metrics page (or promised by a
// contract): its type, and the label names and values its samples carry.
type family struct {
	typ    string              // counter, gauge, histogram, summary, untyped
	labels map[string][]string // label name -> values seen (nil slice: any value)
	source string              // where it was seen
}

// parseExposition reads Prometheus text exposition format into families
// keyed by family name (a histogram's _bucket, _sum and _count samples
// belong to their family).
func parseExposition(source, text string) (map[string]*family, error) {
	fams := map[string]*family{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 {
				return nil, fmt.Errorf("%s: bad TYPE line %q", source, line)
			}
			fams[f[0]] = &family{typ: f[1], labels: map[string][]string{}, source: source}
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		f := fams[name]
		if f == nil {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suf); ok && fams[base] != nil {
					f = fams[base]
				}
			}
		}
		if f == nil {
			f = &family{typ: "untyped", labels: map[string][]string{}, source: source}
			fams[name] = f
		}
		for k, v := range labels {
			f.labels[k] = append(f.labels[k], v)
		}
	}
	return fams, sc.Err()
}

// parseSample splits `name{a="b",c="d"} 1 [ts]` into its name and labels.
func parseSample(line string) (string, map[string]string, error) {
	labels := map[string]string{}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return "", nil, fmt.Errorf("bad sample %q", line)
	}
	name := line[:i]
	if line[i] == ' ' {
		return name, labels, nil
	}
	rest := line[i+1:]
	for {
		rest = strings.TrimLeft(rest, ", ")
		if strings.HasPrefix(rest, "}") {
			return name, labels, nil
		}
		eq := strings.Index(rest, `="`)
		if eq < 0 {
			return "", nil, fmt.Errorf("bad labels in %q", line)
		}
		key := rest[:eq]
		rest = rest[eq+2:]
		var val strings.Builder
		j := 0
		for ; j < len(rest) && rest[j] != '"'; j++ {
			if rest[j] == '\\' && j+1 < len(rest) {
				j++
				switch rest[j] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(rest[j])
				}
				continue
			}
			val.WriteByte(rest[j])
		}
		if j >= len(rest) {
			return "", nil, fmt.Errorf("unterminated label value in %q", line)
		}
		labels[key] = val.String()
		rest = rest[j+1:]
	}
}
