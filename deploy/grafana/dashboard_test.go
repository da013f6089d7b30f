package grafana

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

const dashboardFile = "kvdir-dashboard.json"

// routerContract is the router's metric families as its contract states
// them (issue 5; all prefixed kvdir_router_). The test checks the dashboard
// against it, and, when cmd/router exists, checks every family the running
// router exports against it too, so contract and router cannot drift apart
// unnoticed. Families that only appear after a fault (a fallback, a retry)
// are the ones the scrape may miss; the contract vouches for those.
var routerContract = map[string]*family{
	"kvdir_router_requests_total":                {typ: "counter", labels: anyValues("worker", "policy", "outcome")},
	"kvdir_router_decision_seconds":              {typ: "histogram", labels: anyValues()},
	"kvdir_router_directory_lookup_seconds":      {typ: "histogram", labels: anyValues()},
	"kvdir_router_fallbacks_total":               {typ: "counter", labels: anyValues("reason")},
	"kvdir_router_retries_total":                 {typ: "counter", labels: anyValues("reason")},
	"kvdir_router_predicted_cached_tokens_total": {typ: "counter", labels: anyValues("worker")},
	"kvdir_router_engine_cached_tokens_total":    {typ: "counter", labels: anyValues("worker")},
	"kvdir_router_prompt_tokens_total":           {typ: "counter", labels: anyValues("worker")},
	"kvdir_router_upstream_ttft_seconds":         {typ: "histogram", labels: anyValues("worker")},
	"kvdir_router_workers":                       {typ: "gauge", labels: anyValues()},
	"kvdir_router_inflight":                      {typ: "gauge", labels: anyValues("worker")},
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

// TestDashboardShape checks the dashboard's structure: it loads, every panel
// has an id, a title and a Prometheus data source, every query has a refId,
// and the topics issue 8 asks for have panels.
func TestDashboardShape(t *testing.T) {
	d, err := Load(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q: both are needed for provisioning", d.UID, d.Title)
	}
	hasDS := slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query any    `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	})
	if !hasDS {
		t.Error("no datasource template variable of type prometheus")
	}
	ids := map[int]bool{}
	var titles []string
	queries, panels := 0, 0
	for _, p := range d.AllPanels() {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		titles = append(titles, strings.ToLower(p.Title+" "+p.Description))
		if p.Type == "row" {
			continue
		}
		panels++
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source should be the ${datasource} variable", p.Title)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: grid position %+v", p.Title, p.GridPos)
		}
		refs := map[string]bool{}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: query %q with refId %q (empty, or refId repeated)", p.Title, tg.Expr, tg.RefID)
			}
			refs[tg.RefID] = true
			queries++
		}
	}
	all := strings.Join(titles, "\n")
	for _, topic := range []string{"hit rate", "ttft", "routing decisions", "fallback", "raft", "index", "event lag"} {
		if !strings.Contains(all, topic) {
			t.Errorf("no panel about %q", topic)
		}
	}
	t.Logf("%d panels, %d queries", panels, queries)
}

// TestDashboardMetricsExist starts the real binaries (a directory node, an
// engine simulator, its agent and, when cmd/router exists, a router), drives
// requests through them, including a late-joining agent whose replay from
// the engine cannot fill the gap (so the fault counters get series), scrapes
// every /metrics page, and checks that each metric, label matcher and
// grouping label the dashboard's queries use exists.
func TestDashboardMetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	d, err := Load(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	fams := runSystem(t)
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			q, err := Scan(tg.Expr)
			if err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.Expr, err)
				continue
			}
			if err := checkQuery(q, fams); err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.Expr, err)
			}
		}
	}
}

// lookup finds the family a metric name in a query refers to: itself, or a
// histogram's or summary's _bucket, _sum or _count series.
func lookup(fams map[string]*family, name string) (*family, bool) {
	if f, ok := fams[name]; ok && f.typ != "histogram" {
		return f, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok && (f.typ == "histogram" || (f.typ == "summary" && suf != "_bucket")) {
			return f, suf == "_bucket"
		}
	}
	return nil, false
}

func checkQuery(q Query, fams map[string]*family) error {
	var errs []string
	groupable := map[string]bool{}
	for _, l := range targetLabels {
		groupable[l] = true
	}
	for _, s := range q.Selectors {
		f, isBucket := lookup(fams, s.Metric)
		if f == nil {
			if ff, ok := fams[s.Metric]; ok && ff.typ == "histogram" {
				errs = append(errs, fmt.Sprintf("%s is a histogram: query its _bucket, _sum or _count", s.Metric))
			} else {
				errs = append(errs, fmt.Sprintf("no metric %s on any /metrics page or in the router contract", s.Metric))
			}
			continue
		}
		labelNames := map[string]bool{}
		for l := range f.labels {
			if l == "le" && f.typ == "histogram" {
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
				errs = append(errs, fmt.Sprintf("%s has no label %s (%s)", s.Metric, m.Label, f.source))
				continue
			}
			if vals := f.labels[m.Label]; m.Op == "=" && vals != nil && !slices.Contains(vals, m.Value) {
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

var client = &http.Client{Timeout: 10 * time.Second}

func get(url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func post(url, body string) (int, string, error) {
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sampleValue returns the value of the first sample line of name (exact,
// no labels) on a /metrics page.
func sampleValue(page, name string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// chat is a request whose prompt differs from the first token on, so that
// each one stores a new chain of blocks (a chain whose first blocks the
// engine cached before the agent listened would be skipped by the agent as
// having an unknown parent).
func chat(n int) string {
	return fmt.Sprintf(`{"model":"llama3-8b","max_tokens":4,"messages":[{"role":"system","content":"Conversation %d. You are a terse assistant for the kvdir dashboard test; answer in one line."},{"role":"user","content":"What does a prefix cache save, and why does placement matter for it?"}]}`, n)
}

// runSystem starts the processes, drives them and returns the union of
// every scraped metric family and the router contract.
func runSystem(t *testing.T) map[string]*family {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat(filepath.Join(root, "cmd", "router"))
	withRouter := statErr == nil
	names := []string{"directory", "enginesim", "agent"}
	if withRouter {
		names = append(names, "router")
	} else {
		t.Log("cmd/router does not exist yet: router metrics are checked against the contract only")
	}
	bins := testkit.Binaries(t, names...)
	cluster, err := fleet.StartDirectory(bins["directory"], t.TempDir(), 1, "--lease", "5s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- directory output:\n%s", cluster.Nodes[0].Log())
		}
		cluster.Stop()
	})
	if _, err := cluster.WaitLeader(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	dir := cluster.Nodes[0]
	ports, err := testkit.LoopbackPorts(5)
	if err != nil {
		t.Fatal(err)
	}
	engineHTTP := fmt.Sprintf("127.0.0.1:%d", ports[0])
	events, replay := ports[1], ports[2]
	agentHTTP := fmt.Sprintf("127.0.0.1:%d", ports[3])
	routerHTTP := fmt.Sprintf("127.0.0.1:%d", ports[4])
	// A replay buffer of one batch: the late agent's replay from 0 cannot
	// be complete, so it resynchronises (kvdir_agent_resyncs_total).
	testkit.StartProc(t, "enginesim", bins["enginesim"], "--addr", engineHTTP, "--time-scale", "0", "--model", "llama3-8b",
		"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", events),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", replay), "--replay-buffer-steps", "1")
	testkit.Eventually(t, 20*time.Second, "enginesim /health", func() (bool, string) {
		code, body, err := get("http://" + engineHTTP + "/health")
		return code == 200, fmt.Sprint(code, body, err)
	})
	// Two requests before the agent exists: its first event will not be
	// sequence 0.
	for i := range 2 {
		if code, body, err := post("http://"+engineHTTP+"/v1/chat/completions", chat(i)); code != 200 {
			t.Fatalf("engine request: %d %s %v", code, body, err)
		}
	}
	testkit.StartProc(t, "agent", bins["agent"], "--directory", dir.API, "--worker-id", "w1",
		"--worker-address", "http://"+engineHTTP, "--model", "llama3-8b", "--engine-kind", "enginesim",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", events),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replay),
		"--http-addr", agentHTTP, "--heartbeat-interval", "200ms")
	testkit.Eventually(t, 20*time.Second, "agent registered", func() (bool, string) {
		_, page, err := get("http://" + agentHTTP + "/metrics")
		return sampleValue(page, `kvdir_agent_registrations_total{worker="w1"}`) >= 1, fmt.Sprint(err)
	})
	target := "http://" + engineHTTP
	if withRouter {
		testkit.StartProc(t, "router", bins["router"], "--addr", routerHTTP, "--directory", dir.API, "--policy", "kvdir")
		testkit.Eventually(t, 20*time.Second, "router knows the worker", func() (bool, string) {
			_, page, err := get("http://" + routerHTTP + "/metrics")
			return sampleValue(page, "kvdir_router_workers") >= 1, fmt.Sprint(err)
		})
		target = "http://" + routerHTTP
	}
	// Requests until every page shows what the dashboard needs: the agent
	// replayed and resynchronised, blocks reached the directory, requests
	// went through the router. (ZMQ drops what is sent before the agent's
	// subscription arrives, so one request may not be enough.)
	pages := map[string]string{}
	n := 2
	testkit.Eventually(t, 30*time.Second, "metrics from a request through the system", func() (bool, string) {
		if code, body, err := post(target+"/v1/chat/completions", chat(n)); code != 200 {
			return false, fmt.Sprint("request: ", code, body, err)
		}
		n++
		urls := map[string]string{
			"directory": "http://" + dir.HTTP + "/metrics",
			"enginesim": "http://" + engineHTTP + "/metrics",
			"agent":     "http://" + agentHTTP + "/metrics",
		}
		if withRouter {
			urls["router"] = "http://" + routerHTTP + "/metrics"
		}
		for k, u := range urls {
			_, page, err := get(u)
			if err != nil {
				return false, err.Error()
			}
			pages[k] = page
		}
		switch {
		case !strings.Contains(pages["agent"], "kvdir_agent_resyncs_total{"):
			return false, "agent has not resynchronised yet"
		case sampleValue(pages["directory"], "kvdir_index_entries") == 0:
			return false, "directory index empty"
		case !strings.Contains(pages["directory"], "kvdir_publish_batches_total{"):
			return false, "no publish on the directory"
		case withRouter && !strings.Contains(pages["router"], "kvdir_router_upstream_ttft_seconds_bucket{"):
			return false, "router has no TTFT yet"
		}
		return true, ""
	})
	all := map[string]*family{}
	for source, page := range pages {
		fams, err := parseExposition(source, page)
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range fams {
			if prev, ok := all[name]; ok && prev.typ != f.typ {
				t.Errorf("%s is a %s on %s and a %s on %s", name, prev.typ, prev.source, f.typ, source)
			}
			all[name] = f
		}
	}
	// The router's families: what it exports must agree with the contract
	// (type and label names); the contract supplies those only faults create.
	for name, c := range routerContract {
		c.source = "router contract"
		got, ok := all[name]
		if !ok {
			if withRouter {
				t.Logf("%s: not exported by the running router (no series yet); using the contract", name)
			}
			all[name] = c
			continue
		}
		if got.typ != c.typ {
			t.Errorf("%s: the router exports a %s, the contract says %s", name, got.typ, c.typ)
		}
		var gotLabels, wantLabels []string
		for l := range got.labels {
			if l != "le" {
				gotLabels = append(gotLabels, l)
			}
		}
		for l := range c.labels {
			wantLabels = append(wantLabels, l)
		}
		slices.Sort(gotLabels)
		slices.Sort(wantLabels)
		if !slices.Equal(gotLabels, wantLabels) {
			t.Errorf("%s: the router's labels %v, the contract's %v", name, gotLabels, wantLabels)
		}
	}
	return all
}
