package grafana

import (
	"strings"
	"testing"
)

// TestCheckQuery checks the checker on a small /metrics page: the mistakes
// a dashboard query can make are each reported.
func TestCheckQuery(t *testing.T) {
	page := `# HELP kvdir_raft_commit_seconds x
# TYPE kvdir_raft_commit_seconds histogram
kvdir_raft_commit_seconds_bucket{command="PUBLISH",le="0.1"} 1
kvdir_raft_commit_seconds_bucket{command="PUBLISH",le="+Inf"} 1
kvdir_raft_commit_seconds_sum{command="PUBLISH"} 0.01
kvdir_raft_commit_seconds_count{command="PUBLISH"} 1
# TYPE kvdir_raft_term gauge
kvdir_raft_term 2
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m \"q\""} 32
`
	fams, err := ParseExposition("test", page)
	if err != nil {
		t.Fatal(err)
	}
	if v := fams["vllm:prefix_cache_hits_total"].Labels["model_name"]; len(v) != 1 || v[0] != `m "q"` {
		t.Fatalf("escaped label value parsed as %q", v)
	}
	cases := []struct{ expr, want string }{
		{`histogram_quantile(0.99, sum by (le, command) (rate(kvdir_raft_commit_seconds_bucket{command="PUBLISH"}[5m])))`, ""},
		{`sum by (pod) (rate(vllm:prefix_cache_hits_total[5m]))`, ""},
		{`max(kvdir_raft_term)`, ""},
		{`kvdir_raft_commit_seconds_count`, ""},
		{`kvdir_raft_terms`, "no metric kvdir_raft_terms"},
		{`rate(kvdir_raft_commit_seconds[5m])`, "is a histogram"},
		{`kvdir_raft_commit_seconds_bucket{command="publish"}`, `no such value (seen: ["PUBLISH"])`},
		{`kvdir_raft_commit_seconds_count{cmd="PUBLISH"}`, "has no label cmd"},
		{`sum by (comand) (kvdir_raft_commit_seconds_count)`, "grouping label comand"},
		{`sum by (le) (kvdir_raft_commit_seconds_count)`, "grouping label le"},
		{`kvdir_raft_term_bucket`, "no metric kvdir_raft_term_bucket"},
	}
	for _, c := range cases {
		q, err := Scan(c.expr)
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		err = CheckQuery(q, fams)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.expr, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want %q", c.expr, err, c.want)
		}
	}
}
