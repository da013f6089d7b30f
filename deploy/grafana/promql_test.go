package grafana

import (
	"reflect"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	cases := []struct {
		expr     string
		metrics  []string
		grouping []string
	}{
		{`up`, []string{"up"}, nil},
		{`sum by (pod) (rate(vllm:prefix_cache_hits_total[$__rate_interval])) / sum by (pod) (rate(vllm:prefix_cache_queries_total[5m]))`,
			[]string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}, []string{"pod", "pod"}},
		{`histogram_quantile(0.99, sum by (le, command) (rate(kvdir_raft_commit_seconds_bucket{command="PUBLISH", job=~"dir.*"}[1m])))`,
			[]string{"kvdir_raft_commit_seconds_bucket"}, []string{"le", "command"}},
		{`sum(rate(a_total[5m])) without (instance) > bool 0 and on (job) b offset 1h`, []string{"a_total", "b"}, []string{"instance", "job"}},
		{`label_replace(x{a="by (", b='}'}, "dst", "$1", "src", "(.*)")`, []string{"x"}, nil},
		{`{__name__="weird:name"} * 1e3 + .5 - 0x1F`, []string{"weird:name"}, nil},
		{`max(changes(kvdir_raft_term[1h])) # elections`, []string{"kvdir_raft_term"}, nil},
		{"kvdir_raft_commit_index - kvdir_raft_applied_index", []string{"kvdir_raft_commit_index", "kvdir_raft_applied_index"}, nil},
		{`rate(x[${interval}]) @ end()`, []string{"x"}, nil},
	}
	for _, c := range cases {
		q, err := Scan(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		var got []string
		for _, s := range q.Selectors {
			got = append(got, s.Metric)
		}
		if !reflect.DeepEqual(got, c.metrics) || !reflect.DeepEqual(q.Grouping, c.grouping) {
			t.Errorf("%s: metrics %q grouping %q, want %q %q", c.expr, got, q.Grouping, c.metrics, c.grouping)
		}
	}
	q, _ := Scan(`x{command="PUBLISH", le!="", a=~"b\"c"}`)
	want := []Matcher{{"command", "=", "PUBLISH"}, {"le", "!=", ""}, {"a", "=~", `b"c`}}
	if !reflect.DeepEqual(q.Selectors[0].Matchers, want) {
		t.Errorf("matchers %+v, want %+v", q.Selectors[0].Matchers, want)
	}
}

func TestScanErrors(t *testing.T) {
	for expr, want := range map[string]string{
		`rat(x[5m])`:              `unknown function "rat"`,
		`sum(rate(x[5m])`:         "unclosed (",
		`sum(x))`:                 "unbalanced )",
		`x{a="b"`:                 "unclosed {",
		`x{a="b}`:                 "unterminated string",
		`x{a=b}`:                  "value is not a string",
		`x{a=="b"}`:               `bad operator "=="`,
		`rate(x[5m)`:              "unclosed [",
		`{job="a"}`:               "has no metric name",
		`sum by (pod (rate(x[1m]`: "unclosed by (",
	} {
		if _, err := Scan(expr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", expr, err, want)
		}
	}
}
