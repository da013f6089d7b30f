package grafana

// Checking a dashboard's queries against what the processes export: the
// families scraped from /metrics pages (ParseExposition), the router's
// contract for families only faults create, and CheckQuery. The live check
// that starts the processes is in e2e/.

import (
	"bufio"
	"fmt"
	"slices"
	"strings"
)

// DashboardFile is the dashboard's file name in this folder.
const DashboardFile = "kvdir-dashboard.json"

// RouterContract is the router's metric families as its contract states
// them (cmd/router/README.md, "Metrics"; all prefixed kvdir_router_). The
// live check tests the dashboard against it, and, when cmd/router exists,
// checks every family the running router exports against it too, so
// contract and router cannot drift apart unnoticed. Families that only appear after a fault (a fallback, a retry)
// are the ones the scrape may miss; the contract vouches for those.
var RouterContract = map[string]*Family{
	"kvdir_router_requests_total":                {Type: "counter", Labels: anyValues("worker", "policy", "outcome")},
	"kvdir_router_decision_seconds":              {Type: "histogram", Labels: anyValues()},
	"kvdir_router_directory_lookup_seconds":      {Type: "histogram", Labels: anyValues("group")},
	"kvdir_router_fallbacks_total":               {Type: "counter", Labels: anyValues("group", "reason")},
	"kvdir_router_retries_total":                 {Type: "counter", Labels: anyValues("reason")},
	"kvdir_router_predicted_cached_tokens_total": {Type: "counter", Labels: anyValues("worker")},
	"kvdir_router_engine_cached_tokens_total":    {Type: "counter", Labels: anyValues("worker")},
	"kvdir_router_prompt_tokens_total":           {Type: "counter", Labels: anyValues("worker")},
	"kvdir_router_upstream_ttft_seconds":         {Type: "histogram", Labels: anyValues("worker")},
	"kvdir_router_workers":                       {Type: "gauge", Labels: anyValues()},
	"kvdir_router_inflight":                      {Type: "gauge", Labels: anyValues("worker")},
}

func anyValues(names ...string) map[string][]string {
	m := map[string][]string{}
	for _, n := range names {
		m[n] = nil
	}
	return m
}

// targetLabels are labels Prometheus adds when it scrapes (Kubernetes
// service discovery relabelled to pod and namespace), valid in by (...)
// although no /metrics page shows them.
var targetLabels = []string{"pod", "namespace", "instance", "job", "container"}

// lookup finds the family a metric name in a query refers to: itself, or a
// histogram's or summary's _bucket, _sum or _count series.
func lookupFamily(fams map[string]*Family, name string) (*Family, bool) {
	if f, ok := fams[name]; ok && f.Type != "histogram" {
		return f, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok && (f.Type == "histogram" || (f.Type == "summary" && suf != "_bucket")) {
			return f, suf == "_bucket"
		}
	}
	return nil, false
}

// CheckQuery reports every metric, label matcher and grouping label of q
// that none of fams has.
func CheckQuery(q Query, fams map[string]*Family) error {
	var errs []string
	groupable := map[string]bool{}
	for _, l := range targetLabels {
		groupable[l] = true
	}
	for _, s := range q.Selectors {
		f, isBucket := lookupFamily(fams, s.Metric)
		if f == nil {
			if ff, ok := fams[s.Metric]; ok && ff.Type == "histogram" {
				errs = append(errs, fmt.Sprintf("%s is a histogram: query its _bucket, _sum or _count", s.Metric))
			} else {
				errs = append(errs, fmt.Sprintf("no metric %s on any /metrics page or in the router contract", s.Metric))
			}
			continue
		}
		labelNames := map[string]bool{}
		for l := range f.Labels {
			if l == "le" && f.Type == "histogram" {
				continue // only on _bucket series
			}
			labelNames[l] = true
			groupable[l] = true
		}
		if isBucket {
			labelNames["le"], groupable["le"] = true, true
		}
		for _, m := range s.Matchers {
			if m.Label == "__name__" || slices.Contains(targetLabels, m.Label) {
				continue
			}
			if !labelNames[m.Label] {
				errs = append(errs, fmt.Sprintf("%s has no label %s (%s)", s.Metric, m.Label, f.Source))
				continue
			}
			if vals := f.Labels[m.Label]; m.Op == "=" && vals != nil && !slices.Contains(vals, m.Value) {
				errs = append(errs, fmt.Sprintf("%s{%s=%q}: no such value (seen: %q)", s.Metric, m.Label, m.Value, unique(vals)))
			}
		}
	}
	for _, g := range q.Grouping {
		if !groupable[g] {
			errs = append(errs, fmt.Sprintf("grouping label %s is on none of the query's metrics", g))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func unique(vs []string) []string {
	out := slices.Clone(vs)
	slices.Sort(out)
	return slices.Compact(out)
}

// Family is one metric family as seen on a /metrics page (or promised by a
// contract): its type, and the label names and values its samples carry.
type Family struct {
	Type   string              // counter, gauge, histogram, summary, untyped
	Labels map[string][]string // label name -> values seen (nil slice: any value)
	Source string              // where it was seen
}

// ParseExposition reads Prometheus text exposition format into families
// keyed by family name (a histogram's _bucket, _sum and _count samples
// belong to their family).
func ParseExposition(source, text string) (map[string]*Family, error) {
	fams := map[string]*Family{}
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
			fams[f[0]] = &Family{Type: f[1], Labels: map[string][]string{}, Source: source}
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
			f = &Family{Type: "untyped", Labels: map[string][]string{}, Source: source}
			fams[name] = f
		}
		for k, v := range labels {
			f.Labels[k] = append(f.Labels[k], v)
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
