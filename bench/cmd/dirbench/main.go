// Command dirbench measures a directory cluster of three real processes on
// loopback (BoltDB on disk): block events committed through Raft per second
// by publishers emulating 64 workers, publish-to-commit latency, match
// latency over gRPC against a follower, snapshot time and size, and how long
// a restarted follower takes to catch up. It writes the figures as JSON.
//
//	go run ./bench/cmd/dirbench -out bench/results/directory.json
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func main() {
	var (
		out       = flag.String("out", "bench/results/directory.json", "where to write the JSON figures (- for stdout)")
		scale     = flag.Float64("scale", 1, "fraction of the full shape's 10 M entries to publish")
		batch     = flag.Int("batch-blocks", 2048, "blocks per published batch (at most)")
		inflight  = flag.Int("inflight", 16, "batches in flight per worker stream")
		matches   = flag.Int("matches", 5000, "match queries to time against a follower")
		workDir   = flag.String("dir", "", "directory for the binary and data (default: a temporary one, removed after)")
		keepLogs  = flag.Bool("logs", false, "print the nodes' logs at the end")
		chainSize = flag.Int("chain", 2048, "blocks per matched chain")
		rate      = flag.Int("latency-rate", 1_000_000, "block events per second offered while commit latency is measured")
		latFor    = flag.Duration("latency-for", 10*time.Second, "how long commit latency is measured")
		nodeFlags = flag.String("node-flags", "", "extra flags for every directory process, space-separated")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: dirbench [flags]\n\n"+
			"Starts three directory processes on loopback, publishes the index benchmark's shape through\n"+
			"them as 64 workers, and measures commit throughput and latency, match latency against a\n"+
			"follower, snapshot time and size, and a follower's restart catch-up.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	res, err := run(log, config{scale: *scale, batchBlocks: *batch, inflight: *inflight, matches: *matches,
		dir: *workDir, logs: *keepLogs, chain: *chainSize, rate: *rate, latencyFor: *latFor, nodeFlags: strings.Fields(*nodeFlags)})
	if err != nil {
		log.Error("dirbench failed", "err", err)
		os.Exit(1)
	}
	if err := benchjson.Write(*out, res); err != nil {
		log.Error("write results", "err", err)
		os.Exit(1)
	}
	if *out != "-" {
		log.Info("wrote results", "file", *out)
	}
}

type config struct {
	scale       float64
	batchBlocks int
	inflight    int
	matches     int
	dir         string
	logs        bool
	chain       int
	rate        int
	latencyFor  time.Duration
	nodeFlags   []string
}

// Results is the JSON written to bench/results/directory.json.
type Results struct {
	Machine          benchjson.Machine `json:"machine"`
	Nodes            int               `json:"nodes"`
	Workers          int               `json:"workers"`
	Entries          int64             `json:"entries"`
	Events           int64             `json:"events"`
	Batches          int               `json:"batches"`
	BatchBlocks      int               `json:"batch_blocks"`
	InflightPerWkr   int               `json:"inflight_per_worker"`
	EventsPerSec     float64           `json:"events_per_sec"`
	BurstCommitP99ms float64           `json:"burst_commit_p99_ms"`
	LatencyRate      float64           `json:"latency_phase_events_per_sec"`
	CommitP50ms      float64           `json:"publish_commit_p50_ms"`
	CommitP99ms      float64           `json:"publish_commit_p99_ms"`
	MatchChain       int               `json:"match_chain_blocks"`
	HealthP50us      float64           `json:"rpc_baseline_p50_us"`
	HealthP99us      float64           `json:"rpc_baseline_p99_us"`
	MatchP50us       float64           `json:"match_p50_us"`
	MatchP99us       float64           `json:"match_p99_us"`
	SnapshotSeconds  float64           `json:"snapshot_seconds"`
	SnapshotBytes    int64             `json:"snapshot_bytes"`
	RestartCatchupS  float64           `json:"restart_catchup_seconds"`
	DigestsAgree     bool              `json:"digests_agree"`
	Targets          map[string]string `json:"targets"`
}

func run(log *slog.Logger, cfg config) (res *Results, err error) {
	dir := cfg.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvdir-dirbench-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	bins, err := testkit.Build(dir, "directory")
	if err != nil {
		return nil, err
	}
	c, err := fleet.StartDirectory(bins["directory"], dir, 3, append([]string{"--lease", "1h", "--log-level", "warn"}, cfg.nodeFlags...)...)
	if err != nil {
		return nil, err
	}
	defer func() {
		c.Stop()
		if cfg.logs || err != nil {
			for _, n := range c.Nodes {
				fmt.Fprintf(os.Stderr, "---- %s\n%s\n", n.ID, n.Tail(40))
			}
		}
	}()
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, err
	}
	log.Info("cluster up", "leader", c.Nodes[leader].ID)

	res = &Results{Machine: benchjson.ThisMachine(), Nodes: 3, BatchBlocks: cfg.batchBlocks, InflightPerWkr: cfg.inflight,
		MatchChain: cfg.chain, Targets: map[string]string{
			"events_per_sec": ">= 1000000", "publish_commit_p99_ms": "<= 50", "match_p99_us": "<= 500",
		}}
	wl := radixtest.Generate(radixtest.Full.Scaled(cfg.scale))
	res.Workers = wl.Shape.Workers
	work := batches(wl, cfg.batchBlocks)
	for _, b := range work {
		res.Batches += len(b)
	}
	if err := publishAll(log, c.Nodes[leader], work, cfg.inflight, res); err != nil {
		return nil, err
	}
	log.Info("published", "events", res.Events, "events_per_sec", res.EventsPerSec, "burst_commit_p99_ms", res.BurstCommitP99ms)
	if err := pacedLatency(c.Nodes[leader], wl, work, cfg.rate, cfg.latencyFor, res); err != nil {
		return nil, err
	}
	log.Info("commit latency at a steady rate", "events_per_sec", res.LatencyRate, "p50_ms", res.CommitP50ms, "p99_ms", res.CommitP99ms)

	if err := converge(c, 2*time.Minute); err != nil {
		return nil, err
	}
	res.DigestsAgree = true
	st, err := c.Nodes[leader].Status(context.Background())
	if err != nil {
		return nil, err
	}
	res.Entries = int64(st.Counters.Entries)

	follower := (leader + 1) % 3
	if res.MatchP50us, res.MatchP99us, res.HealthP50us, res.HealthP99us, err = timeMatches(c.Nodes[follower], wl, cfg.chain, cfg.matches); err != nil {
		return nil, err
	}
	log.Info("match against a follower", "p50_us", res.MatchP50us, "p99_us", res.MatchP99us,
		"baseline_p50_us", res.HealthP50us, "baseline_p99_us", res.HealthP99us)

	start := time.Now()
	snap, err := kvdirv1.NewAdminServiceClient(c.Nodes[leader].Conn()).Snapshot(context.Background(), &kvdirv1.SnapshotRequest{})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	res.SnapshotSeconds = time.Since(start).Seconds()
	res.SnapshotBytes = newestSnapshotSize(filepath.Join(c.Nodes[leader].DataDir, "snapshots"))
	log.Info("snapshot", "index", snap.Index, "seconds", res.SnapshotSeconds, "bytes", res.SnapshotBytes)

	if res.RestartCatchupS, err = restartCatchup(c, follower); err != nil {
		return nil, err
	}
	log.Info("restart catch-up", "seconds", res.RestartCatchupS)
	return res, nil
}

// batches turns the workload into each worker's event batches: its system
// prompts, then its sessions turn by turn, packed up to max blocks a batch.
func batches(wl *radixtest.Workload, max int) [][]*kvdirv1.EventBatch {
	pieces := make([][]*kvdirv1.StoredBlocks, wl.Shape.Workers)
	for i, sys := range wl.Systems {
		for _, h := range wl.SystemHolders[i] {
			pieces[h] = append(pieces[h], &kvdirv1.StoredBlocks{Parent: radix.Root, Hashes: sys})
		}
	}
	for _, s := range wl.Sessions {
		sys := wl.Systems[s.System]
		for _, h := range s.Holders {
			parent := sys[len(sys)-1]
			for start := 0; start < len(s.Hashes); start += wl.Shape.TurnBlocks {
				end := min(start+wl.Shape.TurnBlocks, len(s.Hashes))
				pieces[h] = append(pieces[h], &kvdirv1.StoredBlocks{Parent: parent, Hashes: s.Hashes[start:end]})
				parent = s.Hashes[end-1]
			}
		}
	}
	out := make([][]*kvdirv1.EventBatch, wl.Shape.Workers)
	for w, ps := range pieces {
		var cur *kvdirv1.EventBatch
		n := 0
		for _, p := range ps {
			if cur == nil || n+len(p.Hashes) > max {
				cur = &kvdirv1.EventBatch{WorkerId: radixtest.WorkerName(w)}
				out[w] = append(out[w], cur)
				n = 0
			}
			cur.Events = append(cur.Events, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: p}})
			n += len(p.Hashes)
		}
	}
	return out
}

// publishAll registers every worker on the leader and publishes their
// batches on one stream each, inflight batches at a time.
func publishAll(log *slog.Logger, leader *fleet.DirNode, work [][]*kvdirv1.EventBatch, inflight int, res *Results) error {
	agent := kvdirv1.NewAgentServiceClient(leader.Conn())
	ctx := context.Background()
	for w, bs := range work {
		reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{
			Id: radixtest.WorkerName(w), BlockSize: 16, Model: "bench", Address: "http://127.0.0.1:1",
		}})
		if err != nil {
			return fmt.Errorf("register: %w", err)
		}
		for i, b := range bs {
			b.Epoch, b.FirstSeq, b.LastSeq = reg.Epoch, uint64(i+1), uint64(i+1)
		}
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		lat     []time.Duration
		events  atomic.Int64
		firstEr error
	)
	start := time.Now()
	for _, bs := range work {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, n, err := publishWorker(ctx, agent, bs, inflight)
			mu.Lock()
			lat = append(lat, l...)
			if err != nil && firstEr == nil {
				firstEr = err
			}
			mu.Unlock()
			events.Add(n)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstEr != nil {
		return firstEr
	}
	res.Events = events.Load()
	res.EventsPerSec = float64(res.Events) / elapsed.Seconds()
	res.BurstCommitP99ms = pct(lat, 0.99) / 1e3
	return nil
}

// publishWorker sends one worker's batches on one stream and returns each
// batch's publish-to-acknowledgement latency and the events acknowledged.
func publishWorker(ctx context.Context, agent kvdirv1.AgentServiceClient, bs []*kvdirv1.EventBatch, inflight int) ([]time.Duration, int64, error) {
	stream, err := agent.Publish(ctx)
	if err != nil {
		return nil, 0, err
	}
	sent := make([]atomic.Int64, len(bs)) // send times, Unix nanoseconds
	slots := make(chan struct{}, inflight)
	sendErr := make(chan error, 1)
	go func() {
		for i, b := range bs {
			slots <- struct{}{}
			sent[i].Store(time.Now().UnixNano())
			if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	lat := make([]time.Duration, 0, len(bs))
	var events int64
	for i := range bs {
		resp, err := stream.Recv()
		if err != nil {
			return lat, events, fmt.Errorf("batch %d of %s: %w", i+1, bs[i].WorkerId, err)
		}
		if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			return lat, events, fmt.Errorf("batch %d of %s: %v %s", i+1, bs[i].WorkerId, resp.Status, resp.Message)
		}
		lat = append(lat, time.Duration(time.Now().UnixNano()-sent[resp.FirstSeq-1].Load()))
		for _, ev := range bs[i].Events {
			events += int64(len(ev.GetStored().Hashes))
		}
		<-slots
	}
	if err := <-sendErr; err != nil {
		return lat, events, err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return lat, events, fmt.Errorf("stream end: %v", err)
	}
	return lat, events, nil
}

// pacedLatency measures publish-to-commit latency at a steady offered rate:
// every worker in turn removes its last stored piece and stores it again,
// one batch each, paced so that all together offer rate block events per
// second. The index ends as it began.
func pacedLatency(leader *fleet.DirNode, wl *radixtest.Workload, work [][]*kvdirv1.EventBatch, rate int, d time.Duration, res *Results) error {
	agent := kvdirv1.NewAgentServiceClient(leader.Conn())
	ctx := context.Background()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		lat    []time.Duration
		events atomic.Int64
		errs   = make(chan error, len(work))
	)
	busy := 0 // workers with something to churn (a small scale leaves some without)
	for _, bs := range work {
		if len(bs) > 0 {
			busy++
		}
	}
	if busy == 0 {
		return errors.New("no worker has a batch to churn")
	}
	perWorker := float64(rate) / float64(busy)
	start := time.Now()
	for _, bs := range work {
		if len(bs) == 0 {
			continue
		}
		last := bs[len(bs)-1]
		piece := last.Events[len(last.Events)-1].GetStored()
		seq := last.LastSeq
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := agent.Publish(ctx)
			if err != nil {
				errs <- err
				return
			}
			// The sender keeps the pace without waiting for answers; the
			// receiver times each batch from its send to its answer.
			var sent sync.Map // seq -> send time
			n := 0
			done := make(chan error, 1)
			go func() {
				defer close(done)
				for i := 0; time.Since(start) < d || i%2 == 1; i++ { // end on a store: the index ends as it began
					due := start.Add(time.Duration(float64(n*len(piece.Hashes)) / perWorker * float64(time.Second)))
					time.Sleep(time.Until(due))
					seq++
					n++
					ev := &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: piece}}
					if i%2 == 0 {
						ev = &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: piece.Hashes}}}
					}
					sent.Store(seq, time.Now())
					b := &kvdirv1.EventBatch{WorkerId: last.WorkerId, Epoch: last.Epoch, FirstSeq: seq, LastSeq: seq, Events: []*kvdirv1.Event{ev}}
					if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
						done <- err
						return
					}
				}
				done <- stream.CloseSend()
			}()
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
					errs <- fmt.Errorf("paced batch: %v %v", resp, err)
					return
				}
				t, _ := sent.Load(resp.FirstSeq)
				mu.Lock()
				lat = append(lat, time.Since(t.(time.Time)))
				mu.Unlock()
				events.Add(int64(len(piece.Hashes)))
			}
			if err := <-done; err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	res.LatencyRate = float64(events.Load()) / time.Since(start).Seconds()
	res.CommitP50ms = pct(lat, 0.50) / 1e3
	res.CommitP99ms = pct(lat, 0.99) / 1e3
	return nil
}

// converge waits until every running node has the same applied index and
// digest.
func converge(c *fleet.Directory, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		var applied uint64
		var digest uint64
		same, first := true, true
		last = ""
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			st, err := n.Status(context.Background())
			if err != nil {
				same = false
				break
			}
			last += fmt.Sprintf("%s:%d/%016x ", n.ID, st.AppliedIndex, st.Digest)
			if first {
				applied, digest, first = st.AppliedIndex, st.Digest, false
			} else if st.AppliedIndex != applied || st.Digest != digest {
				same = false
			}
		}
		if same && !first {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nodes did not converge: %s", last)
}

// timeMatches times Match of size-block chains against node n, interleaved
// with the cheapest call there is (a gRPC health check) as the baseline of
// what any call costs on this machine.
func timeMatches(n *fleet.DirNode, wl *radixtest.Workload, size, count int) (p50, p99, base50, base99 float64, err error) {
	var chains [][]uint64
	for i := range wl.Sessions {
		if c := wl.Chain(i, size); len(c) == size {
			chains = append(chains, c)
		}
	}
	if len(chains) == 0 {
		return 0, 0, 0, 0, errors.New("no chain long enough to match")
	}
	dir := kvdirv1.NewDirectoryServiceClient(n.Conn())
	health := healthpb.NewHealthClient(n.Conn())
	var lat, base []time.Duration
	for i := range count + count/10 {
		req := &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chains[i%len(chains)], BlockSize: 16}}}
		t := time.Now()
		resp, err := dir.Match(context.Background(), req)
		d := time.Since(t)
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("match: %w", err)
		}
		if len(resp.Matches) == 0 {
			return 0, 0, 0, 0, errors.New("match found no worker for a published chain")
		}
		t = time.Now()
		if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			return 0, 0, 0, 0, fmt.Errorf("health check: %w", err)
		}
		h := time.Since(t)
		if i >= count/10 { // the first tenth warms the connection up
			lat = append(lat, d)
			base = append(base, h)
		}
	}
	return pct(lat, 0.5), pct(lat, 0.99), pct(base, 0.5), pct(base, 0.99), nil
}

func newestSnapshotSize(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return 0
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names) // term-index-time names sort by age
	if len(names) == 0 {
		return 0
	}
	return fleet.DirSize(filepath.Join(dir, names[len(names)-1]))
}

// restartCatchup kills a follower, restarts it on its data directory and
// times how long until it has applied what the leader had committed.
func restartCatchup(c *fleet.Directory, follower int) (float64, error) {
	n := c.Nodes[follower]
	n.Kill9()
	var target uint64
	for _, o := range c.Nodes {
		if o.Running() {
			if st, err := o.Status(context.Background()); err == nil && st.State == "Leader" {
				target = st.CommitIndex
			}
		}
	}
	if target == 0 {
		return 0, errors.New("no leader to catch up with")
	}
	start := time.Now()
	if err := n.Start(); err != nil {
		return 0, err
	}
	deadline := start.Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if st, err := n.Status(context.Background()); err == nil && st.AppliedIndex >= target {
			return time.Since(start).Seconds(), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, errors.New("restarted follower did not catch up in 5 minutes")
}

// pct returns the q-quantile of ds in microseconds.
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1e3
}
