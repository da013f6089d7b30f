package dirbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// WorkersTool is the name of the results of the worker-pool comparison
// (kvbench directory --worker-pools).
const WorkersTool = "directory-workers"

// GroupsTool is the name of the results of the group comparison (kvbench
// directory --groups).
const GroupsTool = "directory-groups"

// WorkersTarget is the least throughput the largest pool must keep, as a
// fraction of the smallest pool's.
const WorkersTarget = 0.8

// PoolRun is one publish of the workload through a fresh cluster by one
// pool of workers.
type PoolRun struct {
	Round          int     `json:"round"`
	Workers        int     `json:"workers"`
	InflightPerWkr int     `json:"inflight_per_worker"`
	Batches        int     `json:"batches"`
	Events         int64   `json:"events"`
	EventsPerSec   float64 `json:"events_per_sec"`
	BurstP99ms     float64 `json:"burst_commit_p99_ms"`
	NodeCPUSeconds float64 `json:"node_cpu_seconds"`
	CPUPerMEvents  float64 `json:"node_cpu_seconds_per_m_events"`
	// BenchCPUSeconds is the publishing process's own CPU time over the
	// publish (getrusage): the publishers share the machine with the
	// nodes.
	BenchCPUSeconds float64 `json:"bench_cpu_seconds"`
	// LeaderCPUSeconds is the leader's share of NodeCPUSeconds.
	LeaderCPUSeconds float64 `json:"leader_cpu_seconds"`
	// BatchesPerEntry is the mean number of batches the leader committed
	// in one Raft entry (its group commit) over the publish.
	BatchesPerEntry float64 `json:"batches_per_entry"`
	// LeaderGCCycles counts the leader's garbage collections over the
	// publish.
	LeaderGCCycles  float64 `json:"leader_gc_cycles"`
	RegisterSeconds float64 `json:"register_seconds"`
}

// WorkersDetails are the pool comparison's details.
type WorkersDetails struct {
	Nodes         int   `json:"nodes"`
	Pools         []int `json:"pools"`
	Entries       int   `json:"entries"`
	BatchBlocks   int   `json:"batch_blocks"`
	TotalInflight int   `json:"total_inflight_batches"`
	Rounds        int   `json:"rounds"`
	// ConnPerWorker: each worker had its own connection to the leader
	// (else one connection carried every worker's stream).
	ConnPerWorker bool `json:"conn_per_worker"`
	// Runs are every publish, in the order they ran (the pools alternate
	// their order by round, so that both share the machine's load).
	Runs []PoolRun `json:"runs"`
	// PairRatios are, per round, the largest pool's throughput over the
	// smallest's.
	PairRatios []float64 `json:"pair_ratios"`
	// Retries counts runs done again after a failure (a leadership change
	// on the loaded machine fails a publish in flight).
	Retries int    `json:"retries"`
	Method  string `json:"method"`
}

// WorkersMeasures are the pool comparison's figures and details.
type WorkersMeasures struct {
	WorkersDetails
	small, large       float64 // median events/s
	smallCPU, largeCPU float64 // median node CPU s per M events
}

// Results fills res with the pool comparison's figures.
func (m *WorkersMeasures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	s, l := m.Pools[0], m.Pools[len(m.Pools)-1]
	res.Figures = append(res.Figures,
		fig{Name: fmt.Sprintf("events_per_sec_%d_workers", s), Unit: "events/s", Measured: m.small,
			Note: fmt.Sprintf("block events committed through Raft, published by %d workers as fast as acknowledged, median of the rounds", s)},
		fig{Name: fmt.Sprintf("events_per_sec_%d_workers", l), Unit: "events/s", Measured: m.large,
			Note: fmt.Sprintf("same workload and batches, published by %d workers", l)},
		fig{Name: "workers_throughput_ratio", Unit: "ratio", Target: benchjson.Min(WorkersTarget), Measured: median(m.PairRatios),
			Note: fmt.Sprintf("%d workers' throughput over %d workers', median of the rounds' ratios (each round runs both back to back)", l, s)},
		fig{Name: fmt.Sprintf("node_cpu_seconds_per_m_events_%d_workers", s), Unit: "s", Measured: m.smallCPU,
			Note: "CPU time of the three nodes per million events committed, median of the rounds"},
		fig{Name: fmt.Sprintf("node_cpu_seconds_per_m_events_%d_workers", l), Unit: "s", Measured: m.largeCPU, Note: "same"},
	)
	return res.SetDetails(m.WorkersDetails)
}

// RunWorkers measures the directory's commit throughput as the same
// workload shape (the index benchmark's at opts.Scale, generated for each
// pool size, cut into batches of the same size) is published by pools of
// different sizes: every pool keeps the
// same batches in flight in total (opts.Inflight per worker of the
// smallest pool), so that the offered load is the same and only the
// number of workers differs. Each round starts a fresh cluster per pool,
// the pools' order alternating by round.
func RunWorkers(ctx context.Context, opts Options, pools []int) (*benchjson.Results, error) {
	if len(pools) < 2 {
		return nil, fmt.Errorf("worker pools %v: give at least two sizes", pools)
	}
	for i, p := range pools {
		if p <= 0 || (i > 0 && p <= pools[i-1]) {
			return nil, fmt.Errorf("worker pools %v: give positive sizes in increasing order", pools)
		}
	}
	return benchjson.Measure(WorkersTool, func() (*WorkersMeasures, error) { return measureWorkers(ctx, opts.withDefaults(), pools) })
}

func measureWorkers(ctx context.Context, cfg Options, pools []int) (*WorkersMeasures, error) {
	rounds := max(cfg.Rounds, 1)
	dir, cleanup, err := benchDir(cfg.Dir, "kvdir-dirbench-workers-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	bins, err := testkit.Build(dir, "directory")
	if err != nil {
		return nil, fmt.Errorf("build the directory: %w", err)
	}
	total := pools[0] * cfg.Inflight
	m := &WorkersMeasures{WorkersDetails: WorkersDetails{Nodes: Nodes, Pools: pools, BatchBlocks: cfg.BatchBlocks, ConnPerWorker: cfg.ConnPerWorker,
		TotalInflight: total, Rounds: rounds}}
	work := map[int][][]*kvdirv1.EventBatch{}
	for _, p := range pools {
		shape := radixtest.Full.Scaled(cfg.Scale)
		shape.Workers = p
		wl := radixtest.Generate(shape)
		m.Entries = wl.Entries
		work[p] = Batches(wl, cfg.BatchBlocks)
	}
	byPool := map[int][]PoolRun{}
	for r := range rounds {
		order := append([]int(nil), pools...)
		if r%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, p := range order {
			inflight := max(1, total/p)
			var run *PoolRun
			err := retry(cfg, &m.Retries, func(try int) (err error) {
				run, err = publishPool(ctx, bins["directory"], filepath.Join(dir, fmt.Sprintf("round%d-%d-try%d", r+1, p, try)), cfg, work[p], inflight)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("round %d, %d workers: %w", r+1, p, err)
			}
			run.Round, run.Workers, run.InflightPerWkr = r+1, p, inflight
			m.Runs = append(m.Runs, *run)
			byPool[p] = append(byPool[p], *run)
			cfg.Log.Info("published", "round", r+1, "workers", p, "events_per_sec", run.EventsPerSec,
				"cpu_seconds_per_m_events", run.CPUPerMEvents, "bench_cpu_seconds", run.BenchCPUSeconds, "leader_cpu_seconds", run.LeaderCPUSeconds, "batches_per_entry", run.BatchesPerEntry, "leader_gc_cycles", run.LeaderGCCycles, "burst_commit_p99_ms", run.BurstP99ms)
		}
	}
	s, l := pools[0], pools[len(pools)-1]
	for r := range rounds {
		m.PairRatios = append(m.PairRatios, byPool[l][r].EventsPerSec/byPool[s][r].EventsPerSec)
	}
	stat := func(p int, f func(PoolRun) float64) float64 {
		var xs []float64
		for _, run := range byPool[p] {
			xs = append(xs, f(run))
		}
		return median(xs)
	}
	rate := func(r PoolRun) float64 { return r.EventsPerSec }
	cpu := func(r PoolRun) float64 { return r.CPUPerMEvents }
	m.small, m.large = stat(s, rate), stat(l, rate)
	m.smallCPU, m.largeCPU = stat(s, cpu), stat(l, cpu)
	m.Method = fmt.Sprintf("the index benchmark's shape at scale %g (%d entries) generated for each pool size and cut into batches of at most %d blocks, "+
		"each worker's batches in order on its own Publish stream, %d batches in flight in all (per worker: that over the pool size, at least 1), "+
		"published to the leader of a fresh 3-process cluster (BoltDB on disk) as fast as acknowledged; throughput is events over the publish's wall time "+
		"(registration not counted); the pools alternate their order by round on a shared machine",
		cfg.Scale, m.Entries, cfg.BatchBlocks, total)
	return m, nil
}

// The leader's histogram of the batches in each group commit.
const (
	groupSum   = "kvdir_publish_group_batches_sum"
	groupCount = "kvdir_publish_group_batches_count"
	gcCount    = "go_gc_duration_seconds_count"
)

// publishPool starts a cluster in dir, registers and publishes work with
// inflight batches per worker stream, checks the nodes agree and stops it.
func publishPool(ctx context.Context, bin, dir string, cfg Options, work [][]*kvdirv1.EventBatch, inflight int) (out *PoolRun, err error) {
	c, err := startGroup(bin, dir, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { stopGroup(c, cfg, err); os.RemoveAll(dir) }()
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for a leader: %w", err)
	}
	start := time.Now()
	if err := RegisterAll(ctx, c.Nodes[leader].Conn(), work); err != nil {
		return nil, err
	}
	out = &PoolRun{RegisterSeconds: time.Since(start).Seconds()}
	for _, b := range work {
		out.Batches += len(b)
	}
	before, err := clusterCPU(c)
	if err != nil {
		return nil, err
	}
	leaderBefore, err := nodeCPU(c.Nodes[leader])
	if err != nil {
		return nil, err
	}
	groupsBefore, err := scrape(c.Nodes[leader], groupSum, groupCount, gcCount)
	if err != nil {
		return nil, err
	}
	// One connection for all the workers' streams, or with ConnPerWorker
	// one each, as each agent has its own.
	conns := []grpc.ClientConnInterface{c.Nodes[leader].Conn()}
	if cfg.ConnPerWorker {
		conns = make([]grpc.ClientConnInterface, len(work))
		for i := range conns {
			cc, err := c.Nodes[leader].Dial()
			if err != nil {
				return nil, fmt.Errorf("connection for worker %d: %w", i, err)
			}
			defer cc.Close()
			conns[i] = cc
		}
	}
	res := &Measures{}
	beforeSelf := selfCPU()
	profiled := profileNodes(ctx, c, cfg, filepath.Base(dir))
	if err := publishOver(ctx, conns, work, inflight, res); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	if err := profiled(); err != nil {
		return nil, err
	}
	out.BenchCPUSeconds = selfCPU() - beforeSelf
	after, err := clusterCPU(c)
	if err != nil {
		return nil, err
	}
	leaderAfter, err := nodeCPU(c.Nodes[leader])
	if err != nil {
		return nil, err
	}
	out.LeaderCPUSeconds = leaderAfter - leaderBefore
	groupsAfter, err := scrape(c.Nodes[leader], groupSum, groupCount, gcCount)
	if err != nil {
		return nil, err
	}
	if n := groupsAfter[groupCount] - groupsBefore[groupCount]; n > 0 {
		out.BatchesPerEntry = (groupsAfter[groupSum] - groupsBefore[groupSum]) / n
	}
	out.LeaderGCCycles = groupsAfter[gcCount] - groupsBefore[gcCount]
	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	out.Events, out.EventsPerSec, out.BurstP99ms = res.Events, res.EventsPerSec, res.BurstCommitP99ms
	out.NodeCPUSeconds = after - before
	out.CPUPerMEvents = out.NodeCPUSeconds / float64(res.Events) * 1e6
	return out, nil
}

// GroupRun is one step of the group comparison: n independent clusters
// published to at once.
type GroupRun struct {
	Round  int `json:"round"`
	Groups int `json:"groups"`
	// Events are committed by all the groups together over WallSeconds,
	// from the first publish to the last group's last acknowledgement.
	Events       int64     `json:"events"`
	WallSeconds  float64   `json:"wall_seconds"`
	EventsPerSec float64   `json:"events_per_sec"`
	PerGroup     []float64 `json:"per_group_events_per_sec"`
	// NodeCPUSeconds is the CPU time of every node over the publish;
	// BenchCPUSeconds the publishing process's own (getrusage).
	NodeCPUSeconds  float64 `json:"node_cpu_seconds"`
	BenchCPUSeconds float64 `json:"bench_cpu_seconds"`
	// CoresBusy is the nodes' CPU seconds per wall second; EventsPerCore
	// is events/s over that (events per node CPU second).
	CoresBusy     float64 `json:"node_cores_busy"`
	EventsPerCore float64 `json:"events_per_node_cpu_second"`
	// TotalCoresBusy and EventsPerTotalCore count the publisher too.
	TotalCoresBusy     float64 `json:"total_cores_busy"`
	EventsPerTotalCore float64 `json:"events_per_total_cpu_second"`
}

// GroupsDetails are the group comparison's details.
type GroupsDetails struct {
	Nodes          int        `json:"nodes_per_group"`
	Groups         int        `json:"groups"`
	Workers        int        `json:"workers_per_group"`
	Entries        int        `json:"entries_per_group"`
	BatchBlocks    int        `json:"batch_blocks"`
	InflightPerWkr int        `json:"inflight_per_worker"`
	Rounds         int        `json:"rounds"`
	CPUs           int        `json:"cpus"`
	Runs           []GroupRun `json:"runs"`
	// Retries counts steps done again after a failure.
	Retries int    `json:"retries"`
	Method  string `json:"method"`
}

// GroupsMeasures are the group comparison's figures and details.
type GroupsMeasures struct {
	GroupsDetails
	rate, ratio, perCore, busy map[int]float64 // medians by group count
}

// Results fills res with the group comparison's figures.
func (m *GroupsMeasures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	for g := 1; g <= m.Groups; g++ {
		res.Figures = append(res.Figures,
			fig{Name: fmt.Sprintf("events_per_sec_%d_groups", g), Unit: "events/s", Measured: m.rate[g],
				Note: fmt.Sprintf("block events committed by %d independent 3-process groups published to at once, all together, median of the rounds", g)},
			fig{Name: fmt.Sprintf("node_cores_busy_%d_groups", g), Unit: "cores", Measured: m.busy[g],
				Note: "CPU seconds of all the nodes per wall second over the publish, median of the rounds"},
			fig{Name: fmt.Sprintf("events_per_node_cpu_second_%d_groups", g), Unit: "events/s/core", Measured: m.perCore[g],
				Note: "events/s over the nodes' cores busy (per-core efficiency), median of the rounds"})
		if g > 1 {
			f := fig{Name: fmt.Sprintf("throughput_ratio_%d_groups", g), Unit: "ratio", Measured: m.ratio[g],
				Note: fmt.Sprintf("%d groups' events/s over one group's, median of the rounds' ratios (each round runs every count back to back)", g)}
			if g == 2 {
				f.Target = benchjson.Min(1.5)
			}
			res.Figures = append(res.Figures, f)
		}
	}
	return res.SetDetails(m.GroupsDetails)
}

// RunGroups measures groups side by side: for 1 to groups independent
// directory groups (3 processes each, their own Raft cluster and data
// directories), every group gets the same workload (the index benchmark's
// shape at opts.Scale over its own 64 workers) published at once, as fast as
// acknowledged. Each round runs every group count back to back, the order
// alternating by round.
func RunGroups(ctx context.Context, opts Options, groups int) (*benchjson.Results, error) {
	if groups < 2 {
		return nil, fmt.Errorf("--groups %d: give at least 2 (one group is the baseline)", groups)
	}
	return benchjson.Measure(GroupsTool, func() (*GroupsMeasures, error) { return measureGroups(ctx, opts.withDefaults(), groups) })
}

func measureGroups(ctx context.Context, cfg Options, groups int) (*GroupsMeasures, error) {
	rounds := max(cfg.Rounds, 1)
	dir, cleanup, err := benchDir(cfg.Dir, "kvdir-dirbench-groups-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	bins, err := testkit.Build(dir, "directory")
	if err != nil {
		return nil, fmt.Errorf("build the directory: %w", err)
	}
	wl := radixtest.Generate(radixtest.Full.Scaled(cfg.Scale))
	m := &GroupsMeasures{GroupsDetails: GroupsDetails{Nodes: Nodes, Groups: groups, Workers: wl.Shape.Workers, Entries: wl.Entries,
		BatchBlocks: cfg.BatchBlocks, InflightPerWkr: cfg.Inflight, Rounds: rounds, CPUs: runtimeCPUs()},
		rate: map[int]float64{}, ratio: map[int]float64{}, perCore: map[int]float64{}, busy: map[int]float64{}}
	byCount := map[int][]GroupRun{}
	for r := range rounds {
		for i := range groups {
			g := i + 1
			if r%2 == 1 {
				g = groups - i
			}
			var run *GroupRun
			err := retry(cfg, &m.Retries, func(try int) (err error) {
				run, err = publishGroups(ctx, bins["directory"], filepath.Join(dir, fmt.Sprintf("round%d-%d-try%d", r+1, g, try)), cfg, wl, g)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("round %d, %d groups: %w", r+1, g, err)
			}
			run.Round = r + 1
			m.Runs = append(m.Runs, *run)
			byCount[g] = append(byCount[g], *run)
			cfg.Log.Info("published", "round", r+1, "groups", g, "events_per_sec", run.EventsPerSec,
				"node_cores_busy", run.CoresBusy, "events_per_node_cpu_second", run.EventsPerCore)
		}
	}
	for g := 1; g <= groups; g++ {
		var rate, perCore, busy, ratio []float64
		for r, run := range byCount[g] {
			rate, perCore, busy = append(rate, run.EventsPerSec), append(perCore, run.EventsPerCore), append(busy, run.CoresBusy)
			ratio = append(ratio, run.EventsPerSec/byCount[1][r].EventsPerSec)
		}
		m.rate[g], m.perCore[g], m.busy[g], m.ratio[g] = median(rate), median(perCore), median(busy), median(ratio)
	}
	m.Method = fmt.Sprintf("1 to %d independent directory groups, each 3 processes on loopback with its own Raft cluster and BoltDB data directories, "+
		"all on this machine; every group is published the index benchmark's shape at scale %g (%d entries, %d workers, batches of at most %d blocks, "+
		"%d in flight per worker) at the same time from one benchmark process, as fast as acknowledged; events/s is all the groups' events over the "+
		"wall time from the first publish to the last acknowledgement; CPU from /proc (nodes) and getrusage (the publisher)",
		groups, cfg.Scale, wl.Entries, wl.Shape.Workers, cfg.BatchBlocks, cfg.Inflight)
	return m, nil
}

// publishGroups starts n groups under dir, publishes the workload to every
// one at once and stops them.
func publishGroups(ctx context.Context, bin, dir string, cfg Options, wl *radixtest.Workload, n int) (out *GroupRun, err error) {
	var cs []*fleet.Directory
	defer func() {
		for _, c := range cs {
			stopGroup(c, cfg, err)
		}
		os.RemoveAll(dir)
	}()
	leaders := make([]*fleet.DirNode, n)
	works := make([][][]*kvdirv1.EventBatch, n)
	for g := range n {
		c, err := startGroup(bin, filepath.Join(dir, fmt.Sprintf("group%d", g+1)), cfg)
		if err != nil {
			return nil, fmt.Errorf("group %d: %w", g+1, err)
		}
		cs = append(cs, c)
	}
	for g, c := range cs {
		l, err := c.WaitLeader(30 * time.Second)
		if err != nil {
			return nil, fmt.Errorf("group %d: wait for a leader: %w", g+1, err)
		}
		leaders[g] = c.Nodes[l]
		works[g] = Batches(wl, cfg.BatchBlocks)
		if err := RegisterAll(ctx, leaders[g].Conn(), works[g]); err != nil {
			return nil, fmt.Errorf("group %d: %w", g+1, err)
		}
	}
	nodeCPU := func() (float64, error) {
		t := 0.0
		for _, c := range cs {
			s, err := clusterCPU(c)
			if err != nil {
				return 0, err
			}
			t += s
		}
		return t, nil
	}
	beforeNodes, err := nodeCPU()
	if err != nil {
		return nil, err
	}
	beforeSelf := selfCPU()
	out = &GroupRun{Groups: n, PerGroup: make([]float64, n)}
	results := make([]*Measures, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[g] = &Measures{}
			errs[g] = publishRegistered(ctx, leaders[g].Conn(), works[g], cfg.Inflight, results[g])
		}()
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	afterNodes, err := nodeCPU()
	if err != nil {
		return nil, err
	}
	out.BenchCPUSeconds = selfCPU() - beforeSelf
	out.NodeCPUSeconds = afterNodes - beforeNodes
	for g, r := range results {
		out.Events += r.Events
		out.PerGroup[g] = r.EventsPerSec
	}
	for g, c := range cs {
		if err := Converge(ctx, c, 2*time.Minute); err != nil {
			return nil, fmt.Errorf("group %d: %w", g+1, err)
		}
	}
	out.WallSeconds = wall
	out.EventsPerSec = float64(out.Events) / wall
	out.CoresBusy = out.NodeCPUSeconds / wall
	out.EventsPerCore = out.EventsPerSec / out.CoresBusy
	out.TotalCoresBusy = (out.NodeCPUSeconds + out.BenchCPUSeconds) / wall
	out.EventsPerTotalCore = out.EventsPerSec / out.TotalCoresBusy
	return out, nil
}

// profileNodes starts a CPU profile of every node of c, for
// cfg.ProfileFor, written to cfg.ProfileDir/run-NODE.pprof; the function it
// returns waits for them. Without cfg.ProfileDir it does nothing.
func profileNodes(ctx context.Context, c *fleet.Directory, cfg Options, run string) (wait func() error) {
	if cfg.ProfileDir == "" {
		return func() error { return nil }
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := filepath.Join(cfg.ProfileDir, run+"-"+n.ID+".pprof")
			if err := fetchProfile(ctx, n.HTTP, cfg.ProfileFor, out); err != nil {
				errs[i] = fmt.Errorf("CPU profile of %s: %w", n.ID, err)
			}
		}()
	}
	return func() error {
		wg.Wait()
		return errors.Join(errs...)
	}
}

// fetchProfile writes to out a CPU profile of the node serving /debug/pprof/
// on addr (--pprof), taken over d.
func fetchProfile(ctx context.Context, addr string, d time.Duration, out string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, max(1, int(d.Round(time.Second)/time.Second)))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("request %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s (does the node run with --pprof?)", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("profile directory: %w", err)
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("create the profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}

func startGroup(bin, dir string, cfg Options) (*fleet.Directory, error) {
	flags := []string{"--lease", "1h", "--log-level", "warn"}
	if cfg.ProfileDir != "" {
		flags = append(flags, "--pprof")
	}
	c, err := fleet.StartDirectory(bin, dir, Nodes, append(flags, cfg.NodeFlags...)...)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	return c, nil
}

func stopGroup(c *fleet.Directory, cfg Options, err error) {
	c.Stop()
	if cfg.Logs || err != nil {
		for _, n := range c.Nodes {
			fmt.Fprintf(os.Stderr, "---- %s\n%s\n", n.ID, n.Tail(40))
		}
	}
}

// maxRetries is how many times a failed run is done again, on a fresh
// cluster, before the benchmark gives up.
const maxRetries = 2

// retry runs f (with its attempt number) until it succeeds or failed
// maxRetries+1 times, counting the retries in n.
func retry(cfg Options, n *int, f func(try int) error) error {
	for try := 0; ; try++ {
		err := f(try)
		if err == nil || try == maxRetries || errors.Is(err, context.Canceled) {
			return err
		}
		*n++
		cfg.Log.Warn("run failed; running it again on a fresh cluster", "try", try+1, "err", err)
	}
}

// benchDir is dir, or a new temporary directory that cleanup removes.
func benchDir(dir, pattern string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, fmt.Errorf("temporary directory: %w", err)
	}
	return d, func() { os.RemoveAll(d) }, nil
}

// selfCPU is this process's CPU time (user and system), in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func runtimeCPUs() int { return runtime.NumCPU() }
