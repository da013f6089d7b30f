package replay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// HAProxy is the policy name of the HAProxy baseline: Debian's HAProxy with
// balance hdr(X-Session-Id), hash-type consistent, hash-balance-factor 150
// in front of the same engines.
const HAProxy = "haproxy"

// Compare runs one trace under several policies on one fleet of engines:
// before each policy the engines' prefix caches are cleared (and the
// directory with them), then the policy's routers (or HAProxy) are started,
// the trace replayed through them, and the routers stopped.
type Compare struct {
	Fleet      *fleet.Fleet // directory and engines; its own routers are not used
	Routers    int          // routers per policy (requests spread over them)
	RouterArgs []string     // extra router flags
	HAProxyBin string       // default "haproxy"
	Base       Config       // the replay settings; URLs and Engines are filled in
	Log        *slog.Logger

	routerLogs string // the last policy's routers' log tails
}

// RouterLogs returns the tails of the logs of the routers the last Run
// started ("" after HAProxy), for a failing test to show.
func (c *Compare) RouterLogs() string { return c.routerLogs }

// Run replays the trace under policy and summarises it.
func (c *Compare) Run(ctx context.Context, policy string) (report.Policy, *Result, error) {
	if err := c.reset(ctx); err != nil {
		return report.Policy{}, nil, err
	}
	cfg := c.Base
	cfg.Engines = nil
	var ids []string
	for _, e := range c.Fleet.Engines {
		cfg.Engines = append(cfg.Engines, Engine{ID: e.WorkerID, URL: e.URL})
		ids = append(ids, e.WorkerID)
	}
	urls, stop, err := c.start(ctx, policy)
	if err != nil {
		return report.Policy{}, nil, err
	}
	cfg.URLs = urls
	c.Log.Info("replaying", "policy", policy, "requests", len(cfg.Records), "front_ends", len(urls))
	res, err := Run(ctx, cfg)
	if err == nil && policy != HAProxy {
		res.Fallbacks, res.LookupP50Ms, res.LookupP99Ms = routerStats(urls)
	}
	stop()
	if err != nil {
		return report.Policy{}, nil, err
	}
	p, err := summarize(policy, ids, res)
	if err != nil {
		return report.Policy{}, nil, err
	}
	if res.Errors > 0 {
		c.Log.Warn("requests failed", "policy", policy, "errors", res.Errors, "first", res.FirstErr)
	}
	return p, res, nil
}

// summarize turns a run's samples into the policy's report entry: the
// requests some replica served or refused, the prefill they computed, the
// engines' queues, the wall time.
func summarize(name string, ids []string, res *Result) (report.Policy, error) {
	var ok []report.Sample
	for _, s := range res.Samples {
		if s.Replica >= 0 || s.Rejected {
			ok = append(ok, s)
		}
	}
	p, err := report.Summarize(name, ids, ok)
	if err != nil {
		return report.Policy{}, fmt.Errorf("summarise %s: %w", name, err)
	}
	for _, s := range ok {
		if !s.Rejected {
			p.PrefillTokensComputed += int64(s.PromptTokens - s.CachedTokens)
		}
	}
	p.Queue = res.Queue
	for i := range p.Replicas {
		if i < len(res.PeakQueue) {
			p.Replicas[i].PeakQueue = res.PeakQueue[i]
		}
	}
	p.WallSec = res.WallSec
	p.Finish()
	return p, nil
}

// reset clears every engine's prefix cache and waits until the directory
// holds no block of any of them.
func (c *Compare) reset(ctx context.Context) error {
	for _, e := range c.Fleet.Engines {
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Post(e.URL+"/reset_prefix_cache", "application/json", nil)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("reset the prefix cache of %s: %v (status %v)", e.WorkerID, err, resp)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if c.Fleet.Directory == nil {
		return nil
	}
	dc, err := dirclient.New(dirclient.Config{Addrs: strings.Split(c.Fleet.DirectoryAddrs(), ",")})
	if err != nil {
		return err
	}
	defer dc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lw, err := dc.ListWorkers(ctx, c.Base.Model, false)
		if err == nil {
			var blocks uint64
			for _, w := range lw.GetWorkers() {
				blocks += w.GetBlocks()
			}
			if blocks == 0 && len(lw.GetWorkers()) >= len(c.Fleet.Engines) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the directory still holds blocks 30 s after the caches were reset (last error %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// start starts the front ends of policy and returns their URLs and a stop
// function.
func (c *Compare) start(ctx context.Context, policy string) ([]string, func(), error) {
	n := max(c.Routers, 1)
	ports, err := testkit.LoopbackPorts(n)
	if err != nil {
		return nil, nil, err
	}
	if policy == HAProxy {
		p, url, err := c.startHAProxy(ports[0])
		if err != nil {
			return nil, nil, err
		}
		if err := waitReady(ctx, url, c.Base.Model); err != nil {
			_ = p.Terminate(5 * time.Second)
			return nil, nil, fmt.Errorf("haproxy: %w\n%s", err, p.Tail(20))
		}
		c.routerLogs = ""
		return []string{url}, func() { _ = p.Terminate(5 * time.Second) }, nil
	}
	var procs []*testkit.Proc
	var urls []string
	stop := func() {
		var logs strings.Builder
		for _, p := range procs {
			_ = p.Terminate(10 * time.Second)
			fmt.Fprintf(&logs, "---- %s\n%s\n", p.Name, p.Tail(20))
		}
		c.routerLogs = logs.String()
	}
	for i := range n {
		url := fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		args := append([]string{"--addr", strings.TrimPrefix(url, "http://"), "--policy", policy, "--log-level", "warn",
			"--directory", c.Fleet.DirectoryAddrs(), "--seed", fmt.Sprint(i + 1)}, c.RouterArgs...)
		p, err := fleet.StartProc(fmt.Sprintf("router-%s-%d", policy, i), c.Fleet.Bin("router"), args...)
		if err != nil {
			stop()
			return nil, nil, err
		}
		procs = append(procs, p)
		urls = append(urls, url)
		r := &fleet.Router{URL: url, Proc: p}
		if err := c.Fleet.WaitRouterWorkers(ctx, r, len(c.Fleet.Engines), 60*time.Second); err != nil {
			stop()
			return nil, nil, fmt.Errorf("router for %s: %w\n%s", policy, err, p.Tail(20))
		}
	}
	return urls, stop, nil
}

// startHAProxy runs HAProxy in front of the fleet's engines; it names the
// server that answered in X-Kvdir-Worker, as the router does.
func (c *Compare) startHAProxy(port int) (*testkit.Proc, string, error) {
	name := c.HAProxyBin
	if name == "" {
		name = "haproxy"
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		return nil, "", fmt.Errorf("HAProxy not found (%w): apt-get install haproxy", err)
	}
	var servers strings.Builder
	for _, e := range c.Fleet.Engines {
		fmt.Fprintf(&servers, "  server %s %s\n", e.WorkerID, strings.TrimPrefix(e.URL, "http://"))
	}
	cfg := HAProxyConfig(port, servers.String())
	dir, err := os.MkdirTemp("", "kvbench-haproxy-")
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, "", err
	}
	p, err := fleet.StartProc("haproxy", bin, "-db", "-f", path)
	return p, fmt.Sprintf("http://127.0.0.1:%d", port), err
}

// HAProxyConfig is the baseline's configuration: HAProxy's bounded-load
// consistent hashing on the session header, the response naming the server.
func HAProxyConfig(port int, servers string) string {
	return fmt.Sprintf(`global
  maxconn 8192
defaults
  mode http
  timeout connect 2s
  timeout client 600s
  timeout server 600s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:%d
  default_backend be
backend be
  balance hdr(X-Session-Id)
  hash-type consistent
  hash-balance-factor 150
  http-response set-header X-Kvdir-Worker %%s
%s`, port, servers)
}

// routerStats reads the routers' metrics: requests placed without the
// directory, by reason (kvdir_router_fallbacks_total), and the directory
// look-up latency's p50 and p99 from the summed histogram buckets (the
// upper bound of the bucket the quantile falls in).
func routerStats(urls []string) (fallbacks map[string]int, p50, p99 float64) {
	fallbacks = map[string]int{}
	buckets := map[float64]float64{}
	for _, u := range urls {
		resp, err := http.Get(u + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			j := strings.LastIndexByte(line, ' ')
			if j < 0 {
				continue
			}
			v, err := strconv.ParseFloat(line[j+1:], 64)
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(line, "kvdir_router_fallbacks_total{"):
				fallbacks[labelOf(line, "reason")] += int(v)
			case strings.HasPrefix(line, "kvdir_router_directory_lookup_seconds_bucket{"):
				if le, err := strconv.ParseFloat(labelOf(line, "le"), 64); err == nil {
					buckets[le] += v
				}
			}
		}
	}
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	slices.Sort(les)
	if len(les) == 0 || buckets[les[len(les)-1]] == 0 {
		return fallbacks, 0, 0
	}
	total := buckets[les[len(les)-1]]
	q := func(f float64) float64 {
		for _, le := range les {
			if buckets[le] >= f*total {
				return le * 1000
			}
		}
		return math.Inf(1)
	}
	return fallbacks, q(0.5), q(0.99)
}

// labelOf returns a label's value in a Prometheus text line.
func labelOf(line, name string) string {
	i := strings.Index(line, name+`="`)
	if i < 0 {
		return ""
	}
	v := line[i+len(name)+2:]
	return v[:max(strings.IndexByte(v, '"'), 0)]
}

// waitReady waits until url answers /v1/models with model.
func waitReady(ctx context.Context, url, model string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
