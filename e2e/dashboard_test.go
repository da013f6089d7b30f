package e2e

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

	"github.com/kvdir/kvdir/deploy/grafana"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// TestDashboardMetricsExist starts the real binaries (a directory node, an
// engine simulator, its agent and, when cmd/router exists, a router), drives
// requests through them, including a late-joining agent whose replay from
// the engine cannot fill the gap (so the fault counters get series), scrapes
// every /metrics page, and checks that each metric, label matcher and
// grouping label the dashboard's queries use exists.
func TestDashboardMetricsExist(t *testing.T) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	d, err := grafana.Load(filepath.Join(root, "deploy", "grafana", grafana.DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	fams := runDashboardSystem(t)
	for _, p := range d.AllPanels() {
		for _, tg := range p.Targets {
			q, err := grafana.Scan(tg.Expr)
			if err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.Expr, err)
				continue
			}
			if err := grafana.CheckQuery(q, fams); err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.Expr, err)
			}
		}
	}
}

var dashClient = &http.Client{Timeout: 10 * time.Second}

func httpGet(url string) (int, string, error) {
	resp, err := dashClient.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func httpPost(url, body string) (int, string, error) {
	resp, err := dashClient.Post(url, "application/json", strings.NewReader(body))
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

// dashboardChat is a request whose prompt differs from the first token on, so that
// each one stores a new chain of blocks (a chain whose first blocks the
// engine cached before the agent listened would be skipped by the agent as
// having an unknown parent).
func dashboardChat(n int) string {
	return fmt.Sprintf(`{"model":"llama3-8b","max_tokens":4,"messages":[{"role":"system","content":"Conversation %d. You are a terse assistant for the kvdir dashboard test; answer in one line."},{"role":"user","content":"What does a prefix cache save, and why does placement matter for it?"}]}`, n)
}

// runSystem starts the processes, drives them and returns the union of
// every scraped metric family and the router contract.
func runDashboardSystem(t *testing.T) map[string]*grafana.Family {
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
		code, body, err := httpGet("http://" + engineHTTP + "/health")
		return code == 200, fmt.Sprint(code, body, err)
	})
	// Two requests before the agent exists: its first event will not be
	// sequence 0.
	for i := range 2 {
		if code, body, err := httpPost("http://"+engineHTTP+"/v1/chat/completions", dashboardChat(i)); code != 200 {
			t.Fatalf("engine request: %d %s %v", code, body, err)
		}
	}
	testkit.StartProc(t, "agent", bins["agent"], "--directory", dir.API, "--worker-id", "w1",
		"--worker-address", "http://"+engineHTTP, "--model", "llama3-8b", "--engine-kind", "enginesim",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", events),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replay),
		"--http-addr", agentHTTP, "--heartbeat-interval", "200ms")
	testkit.Eventually(t, 20*time.Second, "agent registered", func() (bool, string) {
		_, page, err := httpGet("http://" + agentHTTP + "/metrics")
		return sampleValue(page, `kvdir_agent_registrations_total{worker="w1"}`) >= 1, fmt.Sprint(err)
	})
	target := "http://" + engineHTTP
	if withRouter {
		testkit.StartProc(t, "router", bins["router"], "--addr", routerHTTP, "--directory", dir.API, "--policy", "kvdir")
		testkit.Eventually(t, 20*time.Second, "router knows the worker", func() (bool, string) {
			_, page, err := httpGet("http://" + routerHTTP + "/metrics")
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
		if code, body, err := httpPost(target+"/v1/chat/completions", dashboardChat(n)); code != 200 {
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
			_, page, err := httpGet(u)
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
	all := map[string]*grafana.Family{}
	for source, page := range pages {
		fams, err := grafana.ParseExposition(source, page)
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range fams {
			if prev, ok := all[name]; ok && prev.Type != f.Type {
				t.Errorf("%s is a %s on %s and a %s on %s", name, prev.Type, prev.Source, f.Type, source)
			}
			all[name] = f
		}
	}
	// The router's families: what it exports must agree with the contract
	// (type and label names); the contract supplies those only faults create.
	for name, c := range grafana.RouterContract {
		c.Source = "router contract"
		got, ok := all[name]
		if !ok {
			if withRouter {
				t.Logf("%s: not exported by the running router (no series yet); using the contract", name)
			}
			all[name] = c
			continue
		}
		if got.Type != c.Type {
			t.Errorf("%s: the router exports a %s, the contract says %s", name, got.Type, c.Type)
		}
		var gotLabels, wantLabels []string
		for l := range got.Labels {
			if l != "le" {
				gotLabels = append(gotLabels, l)
			}
		}
		for l := range c.Labels {
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
