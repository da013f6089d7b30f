package chaos

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/loadgen"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/workload"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// The compose cluster (deploy/compose/docker-compose.yml).
const (
	model     = "llama3-8b"
	blockSize = 16
)

var (
	dirNames    = []string{"kvdir-dir1", "kvdir-dir2", "kvdir-dir3"}
	engineNames = []string{"kvdir-engine1", "kvdir-engine2", "kvdir-engine3", "kvdir-engine4"}
	agentNames  = []string{"kvdir-agent1", "kvdir-agent2", "kvdir-agent3", "kvdir-agent4"}
	routerNames = []string{"kvdir-router1", "kvdir-router2"}
	dirAPI      = "kvdir-dir1:7001,kvdir-dir2:7001,kvdir-dir3:7001"
)

// Bounds of the checks.
const (
	leaderBound   = 30 * time.Second // a leader all reachable nodes agree on
	rejoinBound   = 60 * time.Second // a restarted or reconnected node healthy and caught up
	viewBound     = 30 * time.Second // every worker's view equal to its engine's cache
	digestBound   = 30 * time.Second // equal digests at one applied index
	drainBound    = 30 * time.Second // a drained engine idle
	partitionHold = 5 * time.Second  // how long a partition lasts
	pauseBound    = 30 * time.Second // a paused agent's worker expired by the directory
	warmRequests  = 10               // requests completed before a fault is injected
	// rampUp is how long a fault's load runs before the fault: the time
	// its first sessions take to reach their last turns (think time and
	// service of two turns), after which the offered rate is steady.
	rampUp = 4 * time.Second
	// maxRecentProbes bounds the prompts of a fault's load the view is
	// checked for: at a hundred requests a second, all of them would make
	// a poll of the view take longer than the view takes to converge.
	maxRecentProbes = 96
	afterRequests   = 8 // requests completed after recovery before the load stops
	// viewPollEvery is the pause between two checks of the view.
	viewPollEvery = 50 * time.Millisecond
)

// FaultResult is one fault's line in bench/results/chaos.json.
type FaultResult struct {
	Name                    string  `json:"name"`
	OK                      bool    `json:"ok"`
	FailedRequests          int     `json:"failed_requests"`
	LostAcknowledgedBatches int     `json:"lost_acknowledged_batches"`
	LeaderRecoverySeconds   float64 `json:"leader_recovery_seconds"`
	ViewConvergedSeconds    float64 `json:"view_converged_seconds"`

	Target string `json:"target"`
	// The load held during the fault window (from the injection until
	// the repair and the recovery it waits for): requests completed per
	// second through the routers, and block events per second the
	// synthetic worker sent in the window, every one of them acknowledged
	// by the end of the fault's load (events a leader loss held back are
	// committed once there is a leader). WindowCommitEventsPerSecond is
	// what was acknowledged within the window itself. WindowSeconds is
	// the window's length; the Load* fields cover the fault's whole load.
	RequestsPerSecond           float64 `json:"requests_per_second"`
	BlockEventsPerSecond        float64 `json:"block_events_per_second"`
	WindowCommitEventsPerSecond float64 `json:"window_commit_block_events_per_second"`
	WindowSeconds               float64 `json:"fault_window_seconds"`
	LoadRequestsPerSecond       float64 `json:"load_requests_per_second"`
	LoadEventsPerSecond         float64 `json:"load_block_events_per_second"`
	// CPUCores is the machine's busy cores, on average over the fault's
	// load, by what used them (the containers' cgroups, the test process,
	// and the rest of the machine: other work on a shared host).
	CPUCores map[string]float64 `json:"cpu_cores,omitempty"`
	// SyntheticRegistrations counts the synthetic worker's registrations
	// during the fault (0: it kept its epoch).
	SyntheticRegistrations int `json:"synthetic_registrations"`
	// Fault-specific measurements (0 when the fault has none).
	ExpiredAfterSeconds  float64 `json:"expired_after_seconds,omitempty"`  // pause-agent, clock-skew: from the pause to the worker's expiry
	ResumeToViewSeconds  float64 `json:"resume_to_view_seconds,omitempty"` // pause-agent: from the resume to the view equal to the engine's cache
	FailedVisiblySeconds float64 `json:"failed_visibly_seconds,omitempty"` // disk-full: from the fill to the node's readiness failing
	RestartNeeded        bool    `json:"restart_needed,omitempty"`         // disk-full: the node did not recover without a restart
	Detail               string  `json:"detail,omitempty"`                 // what the fault saw, in words
	// Requests sent during the fault's load, and how many of the failed
	// ones were in flight at a router when it was killed (allowed).
	Requests                int `json:"requests"`
	FailedInFlightAtKilled  int `json:"failed_in_flight_at_killed_router"`
	ReroutedBeforeFirstByte int `json:"rerouted_before_first_byte"`
	// What the checks looked at.
	LeaderBefore     string `json:"leader_before"`
	LeaderAfter      string `json:"leader_after"`
	DigestsAgreeAt   uint64 `json:"digests_agree_at_applied_index"`
	ViewProbes       int    `json:"view_probe_prompts"`
	EngineProbes     int    `json:"engine_probes"`
	GapRefusals      int    `json:"agent_gap_refusals"`
	EngineWarmups    int    `json:"engine_warmup_requests"`
	FallbackRequests int    `json:"router_fallbacks"`
	// Routers following the log (--follow-log): how many, what answered
	// their matches during the fault, their fallbacks to hashing, the
	// snapshots their replicas restored, and, per router, the applied
	// index at which its replica's digest was last found equal to a node's.
	FollowingRouters          int      `json:"following_routers"`
	FollowingFallbacks        int      `json:"following_router_fallbacks"`
	FollowingLocalMatches     int      `json:"following_router_local_matches"`
	FollowingStaleMatches     int      `json:"following_router_stale_matches"`
	FollowingDirectoryMatches int      `json:"following_router_directory_matches"`
	ReplicaSnapshots          int      `json:"replica_snapshots"`
	ReplicasEqualAt           []uint64 `json:"replicas_equal_at_applied_index,omitempty"`
	// ReplicaResumeSeconds (kill-followed-node): from the kill until the
	// router's replica is in sync again, streaming from another node.
	ReplicaResumeSeconds float64  `json:"replica_resume_seconds,omitempty"`
	DurationSeconds      float64  `json:"duration_seconds"`
	Problems             []string `json:"problems,omitempty"`
}

func (r *FaultResult) problem(format string, a ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, a...))
}

// harness drives the cluster.
type harness struct {
	t     *testing.T
	ctx   context.Context
	d     Docker
	addrs *Addrs // containers' addresses, for dialling them by name
	root  string
	dir   *Directory
	creds *Credentials // the CA and admin token of the cluster (deploy/secrets)
	lb    *Balancer
	seqs  *SeqMonitor
	model *Model
	hc    *http.Client
	seed  uint64
	rng   *rand.Rand

	dataDir string            // the host tmpfs holding diskNode's data ("" if none)
	dc      *dirclient.Client // the synthetic worker's client
	synth   *Synthetic

	routerURLs []string
	following  []bool // per router: it follows the log (its view says so)
	engineMu   sync.Mutex
	engineURL  map[string]string // worker id (= engine container) -> base URL
	kvdirctl   string            // image
	routerKill *killedRouter     // set by restart-router, read by classify
	// onRepair is called by a fault right after its repair action.
	onRepair func(time.Time)
	rngMu    sync.Mutex
}

// shuffle shuffles s with the harness's generator.
func shuffle[T any](h *harness, s []T) {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	h.rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}

// engineUp waits until the engine answers /health at its (possibly new)
// address.
func (h *harness) engineUp(name string) error {
	return testkit.Poll(h.ctx, rejoinBound, "the engine to answer /health", func() (bool, string) {
		u, err := h.engine(name, true)
		if err != nil {
			return false, err.Error()
		}
		resp, err := h.hc.Get(u + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, name + ": " + resp.Status
	})
}

// registered reports whether the leader's registry has the worker ACTIVE
// in an epoch after the given one, holding at least blocks blocks.
func (h *harness) registered(worker string, after, blocks uint64) (bool, string) {
	ws, err := h.workers()
	if err != nil {
		return false, err.Error()
	}
	w := ws[worker]
	ok := w != nil && w.Epoch > after && w.State == kvdirv1.WorkerState_WORKER_STATE_ACTIVE && w.Blocks >= blocks
	return ok, fmt.Sprintf("%s: %v epoch %d (was %d), %d blocks (want >= %d)", worker, w.GetState(), w.GetEpoch(), after, w.GetBlocks(), blocks)
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// newHarness brings the cluster up (and registers its removal) and starts
// the balancer and the monitors.
func newHarness(t *testing.T, ctx context.Context) *harness {
	t.Helper()
	raiseFileLimit(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, ctx: ctx, root: root, model: NewModel(blockSize),
		hc:        &http.Client{Timeout: 30 * time.Second},
		seed:      uint64(time.Now().Unix()),
		engineURL: map[string]string{},
		kvdirctl:  env("KVDIR_IMAGE_PREFIX", "kvdir/") + "kvdirctl:" + env("KVDIR_IMAGE_TAG", "dev"),
	}
	h.rng = rand.New(rand.NewPCG(h.seed, 1))
	h.addrs = NewAddrs(h.d, time.Second)
	for _, tool := range []string{"docker", "docker-compose"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: the chaos tests need Docker and docker-compose", tool)
		}
	}
	out, err := h.d.Run(ctx, "ps", "-a", "--filter", "name=^kvdir-", "--format", "{{.Names}}")
	if err != nil {
		t.Fatalf("docker: %v", err)
	}
	if strings.TrimSpace(out) != "" {
		t.Fatalf("kvdir containers already exist (%s): the chaos test brings up its own cluster; run `make cluster-down` first",
			strings.Join(strings.Fields(out), " "))
	}
	if _, err := h.d.Run(ctx, "image", "inspect", h.kvdirctl); err != nil {
		t.Fatalf("image %s missing: run `make images` (make test-chaos does)", h.kvdirctl)
	}
	var unmount func()
	h.dataDir, unmount = dataTmpfs(t)
	t.Cleanup(unmount) // after the cluster's removal (cleanups run last first)
	t.Cleanup(h.teardown)
	if out, err := h.compose("up"); err != nil {
		t.Fatalf("cluster.sh up: %v\n%s", err, out)
	}
	secrets := env("KVDIR_SECRETS", "deploy/secrets")
	if !filepath.IsAbs(secrets) {
		secrets = filepath.Join(h.root, secrets)
	}
	if h.creds, err = LoadCredentials(secrets); err != nil {
		t.Fatal(err)
	}
	h.dir = NewSecureDirectory(h.d, h.creds, dirNames...)
	// The routers at their container addresses, as a Service reaches its
	// endpoints: through their ports published on the host, Docker's proxy
	// closed some new connections (EOF) while directory containers were
	// started again.
	h.routerURLs = []string{"http://" + routerNames[0] + ":8080", "http://" + routerNames[1] + ":8080"}
	h.hc.Transport = &http.Transport{DialContext: h.dialContainer, MaxIdleConnsPerHost: 64}
	h.lb, err = NewBalancer(h.routerURLs, h.dialContainer)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.lb.waitRouters(ctx, 30*time.Second); err != nil {
		t.Fatalf("routers: %v", err)
	}
	if err := h.findFollowing(); err != nil {
		t.Fatalf("routers' views: %v", err)
	}
	for _, e := range engineNames {
		if _, err := h.engine(e, true); err != nil {
			t.Fatal(err)
		}
	}
	h.seqs = NewSeqMonitor(h.dir)
	mctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.seqs.Run(mctx, 250*time.Millisecond) }()
	t.Cleanup(func() { cancel(); wg.Wait(); h.lb.Close(); h.dir.Close() })
	if _, err := h.dir.WaitLeader(ctx, leaderBound, 3, ""); err != nil {
		t.Fatalf("no leader: %v", err)
	}
	rate, err := strconv.Atoi(env("KVDIR_CHAOS_EVENT_RATE", "100000"))
	if err != nil || rate < 0 {
		t.Fatalf("KVDIR_CHAOS_EVENT_RATE: %q is not a number of block events per second", os.Getenv("KVDIR_CHAOS_EVENT_RATE"))
	}
	h.dc, err = dirclient.New(dirclient.Config{
		Addrs: strings.Split(dirAPI, ","), Dialer: h.dialNode,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: h.creds.CA}, Token: h.creds.Token,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.synth, err = NewSynthetic(ctx, SyntheticConfig{Client: h.dc, WorkerID: syntheticWorker, Rate: rate, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.synth.Close(); h.dc.Close() })
	return h
}

// dialContainer dials addr, whose host is an IP address or a container's
// name on Network (Addrs: a restarted container may have a new address).
func (h *harness) dialContainer(ctx context.Context, network, addr string) (net.Conn, error) {
	return h.addrs.Dial(ctx, network, addr, 10*time.Second)
}

// syntheticWorker is the synthetic worker's id.
const syntheticWorker = "chaos-synthetic-1"

// dialNode dials a directory node by its advertised address (its
// container name), at its current address on Network.
func (h *harness) dialNode(ctx context.Context, addr string) (net.Conn, error) {
	return h.addrs.Dial(ctx, "tcp", addr, 2*time.Second)
}

// compose runs deploy/compose/cluster.sh.
func (h *harness) compose(arg string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(h.root, "deploy/compose/cluster.sh"), arg)
	cmd.Env = append(os.Environ(), h.clusterEnv()...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// clusterEnv is the compose settings (deploy/compose/.env) the chaos load
// needs, unless the environment sets them: engines a quarter of real time,
// a cache (and a replay buffer) large enough that nothing is evicted in a
// run, so that the test's model of each cache holds; and diskNode's data
// on the host's tmpfs, if there is one.
func (h *harness) clusterEnv() []string {
	var out []string
	if h.dataDir != "" {
		out = append(out, "KVDIR_DIR3_DATA="+h.dataDir)
	}
	for _, kv := range [][2]string{
		{"KVDIR_TIME_SCALE", "0.25"}, {"KVDIR_KV_BLOCKS", "524288"}, {"KVDIR_REPLAY_BUFFER_STEPS", "1000000"},
	} {
		if os.Getenv(kv[0]) == "" {
			out = append(out, kv[0]+"="+kv[1])
		}
	}
	return out
}

// teardown keeps the logs of a failed run and removes the cluster.
func (h *harness) teardown() {
	if h.t.Failed() {
		dir := env("KVDIR_CHAOS_LOGS", filepath.Join(os.TempDir(), "kvdir-chaos-logs"))
		_ = os.MkdirAll(dir, 0o755)
		for _, c := range append(append(append(append([]string{}, dirNames...), engineNames...), agentNames...), routerNames...) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			logs, _ := h.d.Logs(ctx, c, time.Time{})
			cancel()
			_ = os.WriteFile(filepath.Join(dir, c+".log"), []byte(logs), 0o644)
		}
		h.t.Logf("container logs written to %s", dir)
	}
	if os.Getenv("KVDIR_CHAOS_KEEP") == "1" {
		h.t.Log("KVDIR_CHAOS_KEEP=1: leaving the cluster up (make cluster-down removes it)")
		return
	}
	if out, err := h.compose("down"); err != nil {
		h.t.Errorf("cluster.sh down: %v\n%s", err, out)
	}
}

// engine returns the engine's base URL, looking its address up when fresh.
func (h *harness) engine(name string, fresh bool) (string, error) {
	h.engineMu.Lock()
	defer h.engineMu.Unlock()
	if u, ok := h.engineURL[name]; ok && !fresh {
		return u, nil
	}
	ip, err := h.d.IP(h.ctx, name)
	if err != nil || ip == "" {
		return "", fmt.Errorf("address of %s: %q %v", name, ip, err)
	}
	u := "http://" + ip + ":8000"
	h.engineURL[name] = u
	return u, nil
}

// kvdirctl runs the kvdirctl image on the cluster's network.
func (h *harness) kvdirctlRun(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	docker, ctl := h.creds.kvdirctl()
	run := append(append([]string{"run", "--rm", "--network", Network}, docker...), h.kvdirctl, "--directory", dirAPI)
	return h.d.Run(ctx, append(append(run, ctl...), args...)...)
}

// digestsAgree runs `kvdirctl status -o json` until every node answers and
// the digests are comparable; it returns the applied index they agree at.
func (h *harness) digestsAgree() (uint64, error) {
	var idx uint64
	var agreeErr error
	err := testkit.Poll(h.ctx, digestBound, "the digests to agree", func() (bool, string) {
		out, err := h.kvdirctlRun("-o", "json", "status")
		if err != nil {
			return false, err.Error()
		}
		var st struct {
			Nodes []struct {
				ID, State, Digest string
			} `json:"nodes"`
			Digests struct {
				Agree, Comparable bool
				Index             uint64 `json:"applied_index"`
				Nodes             int    `json:"nodes_compared"`
				Detail            string
			} `json:"digests"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return false, fmt.Sprintf("kvdirctl status: %v: %s", err, out)
		}
		for _, n := range st.Nodes {
			if n.State == "unreachable" || n.State == "" {
				return false, "node " + n.ID + " unreachable"
			}
		}
		if !st.Digests.Comparable || st.Digests.Nodes != len(dirNames) {
			return false, "digests not comparable yet: " + st.Digests.Detail
		}
		idx = st.Digests.Index
		if !st.Digests.Agree {
			agreeErr = fmt.Errorf("digests differ at applied index %d: %s", idx, st.Digests.Detail)
		}
		return true, ""
	})
	if err != nil {
		return 0, err
	}
	return idx, agreeErr
}

// waitRequests waits until n requests that arrived at or after since have
// completed.
func (h *harness) waitRequests(since time.Time, n int, timeout time.Duration) error {
	return testkit.Poll(h.ctx, timeout, fmt.Sprintf("%d requests", n), func() (bool, string) {
		done := 0
		for _, r := range h.lb.Records(since) {
			if !r.End.IsZero() {
				done++
			}
		}
		return done >= n, fmt.Sprintf("%d of %d requests completed", done, n)
	})
}

// served returns every request engines ran, through the balancer.
func (h *harness) served() []Served { return FromRecords(h.lb.Records(time.Time{})) }

// probes returns the prompts to check: those sent since the fault's load
// began and a sample of earlier ones.
func (h *harness) probes(since time.Time) [][]uint32 {
	recent := Probes(FromRecords(h.lb.Records(since)))
	if len(recent) > maxRecentProbes {
		// The latest ones (most likely not yet in the directory) and a
		// sample of the others.
		last := recent[len(recent)-maxRecentProbes/4:]
		rest := append([][]uint32(nil), recent[:len(recent)-len(last)]...)
		shuffle(h, rest)
		recent = append(rest[:maxRecentProbes-len(last)], last...)
	}
	// 16 earlier prompts, drawn from the whole run without hashing all of
	// them (tens of thousands by the last faults).
	var older []Served
	for _, s := range h.served() {
		if s.At.Before(since) {
			older = append(older, s)
		}
	}
	shuffle(h, older)
	old := Probes(older[:min(len(older), 64)])
	return append(recent, old[:min(len(old), 16)]...)
}

// waitView waits until the directory's view (read on the leader) of every
// probe prompt, for every worker, is what the engines hold: at least what
// requests completed by asOf stored, at most what every request started so
// far could have stored. It returns the time from `from` to success. The
// checks follow each other viewPollEvery apart, not with Poll's pause as
// long as the check: a check takes up to a second or two on the loaded
// leader, and the time to the first equal view is the figure measured.
func (h *harness) waitView(since, asOf, from time.Time, timeout time.Duration) (float64, int, error) {
	probes := h.probes(since)
	var mism []Mismatch
	var polled time.Time
	polls := 0
	err := testkit.PollEvery(h.ctx, timeout, viewPollEvery, "the directory view to match the engines", func() (bool, string) {
		if polls > 0 && os.Getenv("KVDIR_CHAOS_DEBUG") == "1" {
			h.t.Logf("view poll %d at +%.2fs took %.2fs", polls, polled.Sub(from).Seconds(), time.Since(polled).Seconds())
		}
		polls++
		polled = time.Now()
		lv := h.dir.Leader(h.ctx)
		if lv.Container == "" {
			return false, "no leader: " + lv.Detail
		}
		var err error
		mism, err = h.model.CompareView(h.ctx, h.dir, lv.Container, model, probes, h.served(), asOf, engineNames)
		if err != nil {
			return false, err.Error()
		}
		if len(mism) > 0 {
			var s []string
			for _, m := range mism[:min(len(mism), 5)] {
				s = append(s, m.String())
			}
			return false, fmt.Sprintf("%d mismatches of %d prompts x %d workers, e.g. %s", len(mism), len(probes), len(engineNames), strings.Join(s, "; "))
		}
		return true, ""
	})
	// The view was read during the successful poll: count up to its start.
	return polled.Sub(from).Seconds(), len(probes), err
}

// crossCheck asks each engine directly for a sample of probe prompts and
// compares what the engine reports as cached with the directory's matches,
// read for all the probes first (the load is stopped, so only the probes
// themselves change the caches meanwhile; what an earlier probe stored on
// an engine is added to the expectation). The probes are recorded as
// served, since the engines now hold them.
func (h *harness) crossCheck(since time.Time, n int) (int, []string) {
	probes := h.probes(since)
	shuffle(h, probes)
	probes = probes[:min(n, len(probes))]
	lv := h.dir.Leader(h.ctx)
	if lv.Container == "" {
		return 0, []string{"no leader: " + lv.Detail}
	}
	dir := make([]map[string]int, len(probes))
	for i, p := range probes {
		var err error
		if dir[i], err = h.dir.Match(h.ctx, lv.Container, model, blockSize, p); err != nil {
			return 0, []string{err.Error()}
		}
	}
	var bad []string
	asked := 0
	for i, p := range probes {
		for _, w := range engineNames {
			u, err := h.engine(w, false)
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			held := dir[i][w]
			for _, q := range probes[:i] {
				held = max(held, commonBlocks(p, q, blockSize))
			}
			cached, err := AskEngine(h.ctx, h.hc, u, model, p)
			now := time.Now()
			h.model.AddDirect(Served{Worker: w, Prompt: p, At: now, Done: now})
			asked++
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			if want := EngineCachedTokens(held, len(p), blockSize); cached != want {
				bad = append(bad, fmt.Sprintf("probe %d (%d tokens) on %s: engine served %d cached tokens, directory holds %d blocks (so %d expected)",
					i, len(p), w, cached, dir[i][w], want))
			}
		}
	}
	return asked, bad
}

// metric sums the samples of a Prometheus text page whose line starts
// with name and contains every one of match.
func metric(ctx context.Context, hc *http.Client, url, name string, match ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
line:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		for _, m := range match {
			if !strings.Contains(l, m) {
				continue line
			}
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", url, l, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// rejoin waits until the node answers, agrees with the others on the
// leader and has applied what that leader had committed when asked.
func (h *harness) rejoin(name string) error {
	var target uint64
	return testkit.Poll(h.ctx, rejoinBound, "the node to rejoin", func() (bool, string) {
		lv := h.dir.Leader(h.ctx)
		if lv.Leader == "" || lv.Reachable < len(dirNames) {
			return false, lv.Detail
		}
		lst, err := h.dir.Status(h.ctx, lv.Container)
		if err != nil {
			return false, err.Error()
		}
		if target == 0 {
			target = lst.CommitIndex
		}
		st, err := h.dir.Status(h.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		return st.AppliedIndex >= target, fmt.Sprintf("%s applied %d of %d", name, st.AppliedIndex, target)
	})
}

// workers returns the leader's registry.
func (h *harness) workers() (map[string]*kvdirv1.Worker, error) {
	lv := h.dir.Leader(h.ctx)
	if lv.Container == "" {
		return nil, fmt.Errorf("no leader: %s", lv.Detail)
	}
	ws, err := h.dir.Workers(h.ctx, lv.Container)
	if err != nil {
		return nil, err
	}
	out := map[string]*kvdirv1.Worker{}
	for _, w := range ws {
		out[w.GetSpec().GetId()] = w
	}
	return out, nil
}

// loadConfig is the load of one fault.
func (h *harness) loadConfig() LoadConfig {
	h.seed++
	var engines []loadgen.Engine
	for _, e := range engineNames {
		u, _ := h.engine(e, false)
		engines = append(engines, loadgen.Engine{ID: e, URL: u})
	}
	rate, err := strconv.ParseFloat(env("KVDIR_CHAOS_SESSION_RATE", "55"), 64)
	if err != nil {
		h.t.Errorf("KVDIR_CHAOS_SESSION_RATE: %v", err)
	}
	return LoadConfig{URLs: h.lb.Fronts(), Engines: engines, Model: model, BlockSize: blockSize, ChunkSec: 6, Seed: h.seed * 1000,
		SessionRate: rate, Short: true}
}

// warmUp sends a fresh prompt straight to an engine, so that it publishes
// events, and records it.
func (h *harness) warmUp(engine string) error {
	u, err := h.engine(engine, true)
	if err != nil {
		return err
	}
	h.rngMu.Lock()
	id := int64(h.rng.Uint32()) << 20
	h.rngMu.Unlock()
	p := workload.BlockTokens(nil, id, 3*blockSize+5)
	_, err = AskEngine(h.ctx, h.hc, u, model, p)
	now := time.Now()
	h.model.AddDirect(Served{Worker: engine, Prompt: p, At: now, Done: now})
	return err
}

// warmUntil waits until cond holds. With KVDIR_CHAOS_WARMUP=1 it also sends
// warm-up requests straight to the engine, one every 300 ms, as a readiness
// probe that runs a tiny prompt would: before the agent rebuilt from the
// engine's replay buffer at start-up and watched the engine's counters, it
// noticed an engine restart, and rebuilt a worker after its own restart,
// only when the engine published an event. It returns how many it sent.
func (h *harness) warmUntil(engine string, cond func() (bool, string)) (int, error) {
	n := 0
	noWarm := os.Getenv("KVDIR_CHAOS_WARMUP") != "1"
	err := testkit.Poll(h.ctx, viewBound, "the directory view after warm-up", func() (bool, string) {
		if ok, why := cond(); ok {
			return true, why
		}
		if noWarm {
			return false, "no warm-up requests (set KVDIR_CHAOS_WARMUP=1 to send them)"
		}
		n++
		if err := h.warmUp(engine); err != nil {
			return false, err.Error()
		}
		return cond()
	})
	return n, err
}
