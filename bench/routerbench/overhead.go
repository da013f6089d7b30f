package routerbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/bench/replay"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// upstream is a minimal OpenAI-compatible server answering at once, the
// same for every path measured.
func startUpstream(model string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("upstream: %w", err)
	}
	answer := []byte(`{"id":"c","object":"chat.completion","model":"` + model + `","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":50,"completion_tokens":1,"total_tokens":51,"prompt_tokens_details":{"cached_tokens":0}}}`)
	metrics := []byte(fmt.Sprintf("vllm:num_requests_running{model_name=%q} 0\nvllm:num_requests_waiting{model_name=%q} 0\nvllm:kv_cache_usage_perc{model_name=%q} 0\n", model, model, model))
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(metrics) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// benchOverhead compares latency and throughput of small requests sent
// directly, through the router (session-hash over a static list, and kvdir
// with the directory) and through HAProxy.
func benchOverhead(ctx context.Context, log *slog.Logger, c Options, f *fleet.Fleet, res *Measures) error {
	const model = "bench-small"
	var ups []string
	for range 2 {
		u, stop, err := startUpstream(model)
		if err != nil {
			return err
		}
		defer stop()
		ups = append(ups, u)
	}
	// Register the upstreams as workers, so the kvdir router (directory
	// discovery) can place on them; keep their leases alive.
	dc, err := dirclient.New(dirclient.Config{Addrs: strings.Split(f.DirectoryAddrs(), ",")})
	if err != nil {
		return fmt.Errorf("directory client: %w", err)
	}
	defer dc.Close()
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	for i, u := range ups {
		id := fmt.Sprintf("small-%d", i)
		reg, err := dc.Register(ctx, &kvdirv1.WorkerSpec{Id: id, Address: u, Model: model, BlockSize: 16})
		if err != nil {
			return fmt.Errorf("register %s: %w", id, err)
		}
		go func() {
			for {
				select {
				case <-hbCtx.Done():
					return
				case <-time.After(time.Second):
					_, _ = dc.Heartbeat(hbCtx, id, reg.GetEpoch(), &kvdirv1.Load{})
				}
			}
		}()
	}
	kvdirURL := f.Routers[0].URL
	if err := f.WaitRouterWorkers(ctx, f.Routers[0], len(f.Engines)+2, 30*time.Second); err != nil {
		return fmt.Errorf("kvdir router discovering the upstreams: %w", err)
	}
	ports, err := testkit.LoopbackPorts(2)
	if err != nil {
		return fmt.Errorf("free ports: %w", err)
	}
	shURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	sh, err := fleet.StartProc("router-session-hash", f.Bin("router"), "--addr", strings.TrimPrefix(shURL, "http://"),
		"--policy", "session-hash", "--log-level", "warn",
		"--workers", fmt.Sprintf("small-0=%s@%s,small-1=%s@%s", ups[0], model, ups[1], model))
	if err != nil {
		return fmt.Errorf("session-hash router: %w", err)
	}
	defer sh.Terminate(5 * time.Second)
	haURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	ha, version, err := startHAProxy(c, f, ports[1], ups)
	if err != nil {
		return err
	}
	defer ha.Terminate(5 * time.Second)
	res.HAProxyVersion = version
	for _, u := range []string{shURL, haURL} {
		if err := waitOK(ctx, u, model); err != nil {
			return fmt.Errorf("%s: %w\n%s%s", u, err, sh.Tail(10), ha.Tail(10))
		}
	}

	rng := rand.New(rand.NewPCG(3, 4))
	bodies := make([][]byte, 64)
	for i := range bodies {
		bodies[i], _ = json.Marshal(chatReq{Model: model, MaxTokens: 1, Messages: []msg{{Role: "user", Content: text(rng, 48)}}})
	}
	paths := []struct {
		name, url string
	}{{"direct", ups[0]}, {"session-hash", shURL}, {"kvdir", kvdirURL}, {"haproxy", haURL}}
	lat := map[string][]float64{}
	var errs atomic.Int64
	// Warm up connections and caches.
	for _, p := range paths {
		for i := range 200 {
			if _, _, err := post(ctx, p.url+router.PathChat, fmt.Sprint(i%100), bodies[i%len(bodies)]); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	log.Info("timing sequential small requests", "per_path", c.LatencyRequests)
	const round = 100
	for done := 0; done < c.LatencyRequests; done += round {
		for _, p := range paths {
			for i := range round {
				t0 := time.Now()
				if _, _, err := post(ctx, p.url+router.PathChat, fmt.Sprint((done+i)%100), bodies[(done+i)%len(bodies)]); err != nil {
					errs.Add(1)
					continue
				}
				lat[p.name] = append(lat[p.name], float64(time.Since(t0).Nanoseconds())/1e3)
			}
		}
	}
	direct := pct(lat["direct"], 50)
	res.DirectP50 = direct
	res.ProxyOverheadP50 = pct(lat["session-hash"], 50) - direct
	res.KVDirProxyOverheadP50 = pct(lat["kvdir"], 50) - direct
	res.HAProxyOverheadP50 = pct(lat["haproxy"], 50) - direct
	res.OverheadRatio = res.ProxyOverheadP50 / res.HAProxyOverheadP50
	res.KVDirOverheadRatio = res.KVDirProxyOverheadP50 / res.HAProxyOverheadP50
	res.LatencyRequestsPerPath = len(lat["direct"])

	log.Info("throughput runs", "clients", c.RPSClients, "each", c.RPSDuration)
	rps := func(url string) float64 {
		var n atomic.Int64
		end := time.Now().Add(c.RPSDuration)
		var wg sync.WaitGroup
		for g := range c.RPSClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(end); i++ {
					if _, _, err := post(ctx, url+router.PathChat, fmt.Sprint((g*7919+i)%1000), bodies[(g+i)%len(bodies)]); err != nil {
						errs.Add(1)
						continue
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		return float64(n.Load()) / c.RPSDuration.Seconds()
	}
	res.DirectRequestsPerSec = rps(ups[0])
	res.RequestsPerSec = rps(kvdirURL)
	res.SessionHashRequestsPerS = rps(shURL)
	res.HAProxyRequestsPerSec = rps(haURL)
	res.RequestErrors = errs.Load()
	res.RPSClients = c.RPSClients
	res.OverheadMethod = fmt.Sprintf("two in-process upstreams that answer a fixed chat completion at once; ~60-token chat requests (max_tokens 1) "+
		"with an X-Session-Id among 100, sent one at a time over keep-alive connections, %d per path in interleaved rounds of %d "+
		"(direct to one upstream; router --policy session-hash over a static list of the two; router --policy kvdir discovering them from the "+
		"3-node directory, so every request is tokenized, hashed and matched there; HAProxy %s with balance hdr(X-Session-Id), hash-type consistent, "+
		"hash-balance-factor 150); overhead = p50 through the proxy - p50 direct; overhead_ratio_vs_haproxy compares the router's session-hash "+
		"path (the same balancing as HAProxy's), kvdir_overhead_ratio_vs_haproxy its kvdir path; requests_per_sec: %d closed-loop clients "+
		"for %v through the kvdir router, the load generator and upstreams sharing the machine's %d cores",
		c.LatencyRequests, round, version, c.RPSClients, c.RPSDuration, runtime.NumCPU())
	return nil
}

// startHAProxy runs Debian's HAProxy in front of ups with HAProxy's own
// bounded-load session hashing.
func startHAProxy(c Options, f *fleet.Fleet, port int, ups []string) (*testkit.Proc, string, error) {
	bin, err := exec.LookPath(c.HAProxy)
	if err != nil {
		return nil, "", fmt.Errorf("HAProxy not found (%w): install Debian's package, apt-get install haproxy, or pass -haproxy", err)
	}
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return nil, "", fmt.Errorf("haproxy -v: %w", err)
	}
	version := strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "HAProxy version ")
	var servers strings.Builder
	for i, u := range ups {
		fmt.Fprintf(&servers, "  server s%d %s\n", i, strings.TrimPrefix(u, "http://"))
	}
	cfg := replay.HAProxyConfig(port, servers.String())
	path := filepath.Join(c.Dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, "", fmt.Errorf("HAProxy configuration: %w", err)
	}
	p, err := fleet.StartProc("haproxy", bin, "-db", "-f", path)
	if err != nil {
		return nil, "", fmt.Errorf("start HAProxy: %w", err)
	}
	return p, version, nil
}

// waitOK waits until a small request through url succeeds.
func waitOK(ctx context.Context, url, model string) error {
	body, _ := json.Marshal(chatReq{Model: model, MaxTokens: 1, Messages: []msg{{Role: "user", Content: "hi"}}})
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, err := post(ctx, url+router.PathChat, "x", body)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
