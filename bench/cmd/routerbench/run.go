package main

import (
	"bytes"
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/bench/replay"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Results are the figures written to router.json.
type Results struct {
	Machine benchjson.Machine `json:"machine"`

	DecisionP50         float64            `json:"decision_p50_us"`
	DecisionP99         float64            `json:"decision_p99_us"`
	DecisionColdP50     float64            `json:"decision_cold_p50_us"`
	DecisionColdP99     float64            `json:"decision_cold_p99_us"`
	DecisionParts       map[string]float64 `json:"decision_parts"`
	DecisionSamples     int                `json:"decision_samples"`
	DecisionColdSamples int                `json:"decision_cold_samples"`
	DecisionFallbacks   int                `json:"decision_fallbacks"`
	DecisionMatchedFrac float64            `json:"decision_matched_fraction"`
	SessionPromptTokens float64            `json:"decision_session_prompt_tokens_mean"`
	ExplainRoundTripP50 float64            `json:"explain_round_trip_p50_us"`
	DecisionMethod      string             `json:"decision_method"`

	DirectP50               float64 `json:"direct_p50_us"`
	ProxyOverheadP50        float64 `json:"proxy_overhead_p50_us"`
	KVDirProxyOverheadP50   float64 `json:"kvdir_proxy_overhead_p50_us"`
	HAProxyOverheadP50      float64 `json:"haproxy_overhead_p50_us"`
	OverheadRatio           float64 `json:"overhead_ratio_vs_haproxy"`
	KVDirOverheadRatio      float64 `json:"kvdir_overhead_ratio_vs_haproxy"`
	LatencyRequestsPerPath  int     `json:"latency_requests_per_path"`
	RequestsPerSec          float64 `json:"requests_per_sec"`
	SessionHashRequestsPerS float64 `json:"session_hash_requests_per_sec"`
	HAProxyRequestsPerSec   float64 `json:"haproxy_requests_per_sec"`
	DirectRequestsPerSec    float64 `json:"direct_requests_per_sec"`
	RequestErrors           int64   `json:"request_errors"`
	HAProxyVersion          string  `json:"haproxy_version"`
	OverheadMethod          string  `json:"overhead_method"`

	Targets map[string]string `json:"targets"`
}

func run(ctx context.Context, log *slog.Logger, c config) (*Results, error) {
	res := &Results{Machine: benchjson.ThisMachine(), Targets: map[string]string{
		"decision_p99_us": "<= 1000", "overhead_ratio_vs_haproxy": "<= 1.5"}}
	log.Info("starting a fleet: 3 directory nodes, 4 enginesims with agents, 1 router (kvdir policy)")
	f, err := fleet.Start(ctx, fleet.Config{Dir: c.dir, Engines: 4, Routers: 1,
		EngineArgs: []string{"--time-scale", "0", "--default-max-tokens", "1"},
		RouterArgs: []string{"--policy", "kvdir"}})
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	if !c.skipDecision {
		if err := benchDecision(ctx, log, c, f, res); err != nil {
			return nil, fmt.Errorf("decision phase: %w\n%s", err, f.Logs(20))
		}
	}
	if !c.skipOverhead {
		if err := benchOverhead(ctx, log, c, f, res); err != nil {
			return nil, fmt.Errorf("overhead phase: %w\n%s", err, f.Logs(20))
		}
	}
	return res, nil
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatReq struct {
	Model     string `json:"model"`
	Messages  []msg  `json:"messages"`
	MaxTokens int    `json:"max_tokens"`
}

// words is text of about one cl100k token per word.
var words = strings.Fields(`the cache prefix token block worker router engine session agent model tensor batch queue
latency memory request response stream replica cluster leader follower index chain hash snapshot lease epoch
prefill decode schedule evict store match score place route serve trace replay profile metric budget`)

func text(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	for i := range tokens {
		if i%12 == 11 {
			fmt.Fprintf(&b, " %d.", rng.IntN(1000))
			continue
		}
		b.WriteByte(' ')
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024, DisableCompression: true}, Timeout: 60 * time.Second}

// post sends a JSON body with a session header and returns the body.
func post(ctx context.Context, url, session string, body []byte) ([]byte, *http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, resp, fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	return b, resp, nil
}

// benchDecision builds long sessions through the router, then times the
// decision for one more turn (warm) and for the whole prompt under a new
// session id (cold) with the explain endpoint.
func benchDecision(ctx context.Context, log *slog.Logger, c config, f *fleet.Fleet, res *Results) error {
	r := f.Routers[0].URL
	rng := rand.New(rand.NewPCG(1, 2))
	var warm, cold, rtt []float64
	parts := map[string][]float64{}
	var matched, fallbacks, tokens int
	for s := range c.sessions {
		sess := fmt.Sprintf("long-%d", s)
		msgs := []msg{{Role: "system", Content: fmt.Sprintf("Session %d.", s) + text(rng, 1000)}}
		prompt := 0
		for prompt < c.sessionTokens-512 {
			msgs = append(msgs, msg{Role: "user", Content: text(rng, min(c.turnTokens, (c.sessionTokens-prompt)*9/10))})
			body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: msgs, MaxTokens: 1})
			out, _, err := post(ctx, r+router.PathChat, sess, body)
			if err != nil {
				return err
			}
			var cc struct {
				Choices []struct {
					Message msg `json:"message"`
				} `json:"choices"`
				Usage struct {
					Prompt int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(out, &cc); err != nil || len(cc.Choices) == 0 {
				return fmt.Errorf("decode turn answer %q: %v", out, err)
			}
			prompt = cc.Usage.Prompt
			msgs = append(msgs, cc.Choices[0].Message)
		}
		tokens += prompt
		log.Info("session built", "session", sess, "prompt_tokens", prompt, "messages", len(msgs))
		// Let the directory catch up with the last turn's blocks.
		time.Sleep(200 * time.Millisecond)
		explain := func(session string, ms []msg) (router.Explanation, error) {
			body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: ms, MaxTokens: 1})
			t0 := time.Now()
			out, _, err := post(ctx, r+router.PathExplain, session, body)
			rtt = append(rtt, float64(time.Since(t0).Microseconds()))
			var e router.Explanation
			if err == nil {
				err = json.Unmarshal(out, &e)
			}
			return e, err
		}
		for j := range c.warm {
			next := append(slices.Clip(msgs), msg{Role: "user", Content: text(rng, 60)})
			e, err := explain(sess, next)
			if err != nil {
				return err
			}
			if j > 0 { // the first one also renders the previous turn's answer
				warm = append(warm, e.DecisionMicros)
				parts["render"] = append(parts["render"], e.RenderMicros)
				parts["hash"] = append(parts["hash"], e.HashMicros)
				parts["match"] = append(parts["match"], e.MatchMicros)
				parts["score"] = append(parts["score"], e.ScoreMicros)
			}
			if e.Fallback != "" {
				fallbacks++
			}
			for _, w := range e.Workers {
				if w.Worker == e.Pick && w.DirectoryBlocks > 0 {
					matched++
				}
			}
		}
		for j := range c.cold {
			e, err := explain(fmt.Sprintf("cold-%d-%d", s, j), msgs)
			if err != nil {
				return err
			}
			cold = append(cold, e.DecisionMicros)
		}
	}
	res.DecisionP50, res.DecisionP99 = pct(warm, 50), pct(warm, 99)
	res.DecisionParts = map[string]float64{}
	for k, v := range parts {
		res.DecisionParts[k+"_p50_us"], res.DecisionParts[k+"_p99_us"] = pct(v, 50), pct(v, 99)
	}
	res.DecisionColdP50, res.DecisionColdP99 = pct(cold, 50), pct(cold, 99)
	res.DecisionSamples, res.DecisionColdSamples, res.DecisionFallbacks = len(warm), len(cold), fallbacks
	res.DecisionMatchedFrac = float64(matched) / float64(c.sessions*c.warm)
	res.SessionPromptTokens = float64(tokens) / float64(c.sessions)
	res.ExplainRoundTripP50 = pct(rtt, 50)
	res.DecisionMethod = fmt.Sprintf("%d sessions built turn by turn through the router (kvdir policy, default 5 ms match deadline) to ~%d prompt tokens "+
		"on 4 enginesims (--time-scale 0) with agents and a 3-node directory (processes on loopback); then per session %d warm decisions "+
		"(the session plus one new ~60-token user message: render + tokenize the new messages + hash the whole chain + directory Match + kvdir score) "+
		"and %d cold ones (the whole prompt under a new session id), each timed by the router itself (decision_us of POST /v1/kvdir/explain, "+
		"which excludes reading and JSON-decoding the body)", c.sessions, c.sessionTokens, c.warm, c.cold)
	return nil
}

// upstream is a minimal OpenAI-compatible server answering at once, the
// same for every path measured.
func startUpstream(model string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
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
func benchOverhead(ctx context.Context, log *slog.Logger, c config, f *fleet.Fleet, res *Results) error {
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
		return err
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
		return err
	}
	ports, err := testkit.LoopbackPorts(2)
	if err != nil {
		return err
	}
	shURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	sh, err := fleet.StartProc("router-session-hash", f.Bin("router"), "--addr", strings.TrimPrefix(shURL, "http://"),
		"--policy", "session-hash", "--log-level", "warn",
		"--workers", fmt.Sprintf("small-0=%s@%s,small-1=%s@%s", ups[0], model, ups[1], model))
	if err != nil {
		return err
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
	log.Info("timing sequential small requests", "per_path", c.latencyRequests)
	const round = 100
	for done := 0; done < c.latencyRequests; done += round {
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

	log.Info("throughput runs", "clients", c.rpsClients, "each", c.rpsDuration)
	rps := func(url string) float64 {
		var n atomic.Int64
		end := time.Now().Add(c.rpsDuration)
		var wg sync.WaitGroup
		for g := range c.rpsClients {
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
		return float64(n.Load()) / c.rpsDuration.Seconds()
	}
	res.DirectRequestsPerSec = rps(ups[0])
	res.RequestsPerSec = rps(kvdirURL)
	res.SessionHashRequestsPerS = rps(shURL)
	res.HAProxyRequestsPerSec = rps(haURL)
	res.RequestErrors = errs.Load()
	res.OverheadMethod = fmt.Sprintf("two in-process upstreams that answer a fixed chat completion at once; ~60-token chat requests (max_tokens 1) "+
		"with an X-Session-Id among 100, sent one at a time over keep-alive connections, %d per path in interleaved rounds of %d "+
		"(direct to one upstream; router --policy session-hash over a static list of the two; router --policy kvdir discovering them from the "+
		"3-node directory, so every request is tokenized, hashed and matched there; HAProxy %s with balance hdr(X-Session-Id), hash-type consistent, "+
		"hash-balance-factor 150); overhead = p50 through the proxy - p50 direct; overhead_ratio_vs_haproxy compares the router's session-hash "+
		"path (the same balancing as HAProxy's), kvdir_overhead_ratio_vs_haproxy its kvdir path; requests_per_sec: %d closed-loop clients "+
		"for %v through the kvdir router, the load generator and upstreams sharing the machine's %d cores",
		c.latencyRequests, round, version, c.rpsClients, c.rpsDuration, res.Machine.NumCPU)
	return nil
}

// startHAProxy runs Debian's HAProxy in front of ups with HAProxy's own
// bounded-load session hashing.
func startHAProxy(c config, f *fleet.Fleet, port int, ups []string) (*testkit.Proc, string, error) {
	bin, err := exec.LookPath(c.haproxy)
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
	path := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, "", err
	}
	p, err := fleet.StartProc("haproxy", bin, "-db", "-f", path)
	return p, version, err
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

// pct returns the p-th percentile of xs (nearest rank).
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
