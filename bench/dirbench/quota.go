package dirbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// QuotaTool is the name the block-quota run's results carry.
const QuotaTool = "directory-quota"

// QuotaOptions shape a block-quota run (RunQuota). A zero field means its
// default (see QuotaDefaults).
type QuotaOptions struct {
	// Quota is the directory's --worker-block-quota.
	Quota int
	// Flood is how many more blocks than the quota the worker stores once
	// it is at the quota, as a multiple of the quota.
	Flood float64
	// BatchBlocks is the most blocks in one batch; Inflight the batches in
	// flight on the worker's stream.
	BatchBlocks, Inflight int
	Dir                   string
	Logs                  bool
	Log                   *slog.Logger
}

// QuotaDefaults are the options of the committed figure: the default
// quota, flooded with twice as many blocks again.
var QuotaDefaults = QuotaOptions{Quota: 1 << 22, Flood: 2, BatchBlocks: 2048, Inflight: 16}

// QuotaDetails are the block-quota run's details.
type QuotaDetails struct {
	Nodes       int     `json:"nodes"`
	Quota       int     `json:"quota_blocks"`
	Flood       float64 `json:"flood_multiple"`
	Published   int64   `json:"blocks_published"`
	Held        uint64  `json:"blocks_held"`
	Dropped     uint64  `json:"blocks_dropped"`
	BaseRSSMiB  float64 `json:"base_rss_anon_mib"`
	QuotaRSSMiB float64 `json:"at_quota_rss_anon_mib"`
	FloodRSSMiB float64 `json:"after_flood_rss_anon_mib"`
	// IndexBytesPerEntry is the index's own estimate (Status counters'
	// approx_bytes over entries) at the quota, for comparison.
	IndexBytesPerEntry float64 `json:"index_estimate_bytes_per_entry"`
	// HeapInuseMiB are the nodes' Go heap in use (mean) at the base, at
	// the quota and after the flood: what the RSS holds beyond it is the
	// runtime's retained headroom.
	HeapInuseMiB []float64 `json:"heap_inuse_mib"`
	// FillBytesPerEntry is the RSS growth per block right after the fill,
	// before any garbage of re-stored blocks; GrowthOverFill the flood's
	// growth over quota x that (higher: it charges the Go heap's headroom
	// to the flood).
	FillBytesPerEntry float64 `json:"fill_only_bytes_per_entry"`
	GrowthOverFill    float64 `json:"rss_growth_over_fill_only_quota_bytes"`
	DigestsAgree      bool    `json:"digests_agree"`
	// NodeRSSMiB are each node's anonymous RSS at the base, at the quota
	// and after the flood (node order as started).
	NodeRSSMiB [][3]float64 `json:"node_rss_anon_mib"`
}

// QuotaMeasures are a block-quota run's numbers.
type QuotaMeasures struct {
	QuotaDetails
	BytesPerEntry float64 `json:"bytes_per_entry"`
	GrowthRatio   float64 `json:"rss_growth_over_quota_bytes"`
	FloodSeconds  float64 `json:"flood_seconds"`
}

// Results fills res with m's figures and details.
func (m *QuotaMeasures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "bytes_per_entry", Unit: "B", Measured: m.BytesPerEntry,
			Note: "directory RSS (anonymous) growth per block held once one worker filled its quota and stored it again (steady state), mean of the 3 nodes"},
		fig{Name: "rss_growth_over_quota_bytes", Unit: "x", Target: benchjson.Max(1.2), Measured: m.GrowthRatio,
			Note: fmt.Sprintf("RSS growth after storing %.0fx the quota past it, over quota x bytes/entry (worst node)", m.Flood)},
		fig{Name: "flood_seconds", Unit: "s", Measured: m.FloodSeconds, Note: "time to publish the blocks past the quota (all acknowledged)"},
	)
	return res.SetDetails(m.QuotaDetails)
}

// RunQuota starts a 3-node directory with --worker-block-quota, fills one
// worker to its quota and stores the same blocks again, measures the
// nodes' RSS growth per block (bytes per entry), floods the worker with
// more blocks past the quota and checks that the nodes grew by no more
// than the quota's worth.
func RunQuota(ctx context.Context, opts QuotaOptions) (*benchjson.Results, error) {
	return benchjson.Measure(QuotaTool, func() (*QuotaMeasures, error) { return measureQuota(ctx, opts.withDefaults()) })
}

func (o QuotaOptions) withDefaults() QuotaOptions {
	d := o
	benchopt.Default(&d.Quota, QuotaDefaults.Quota)
	benchopt.Default(&d.Flood, QuotaDefaults.Flood)
	benchopt.Default(&d.BatchBlocks, QuotaDefaults.BatchBlocks)
	benchopt.Default(&d.Inflight, QuotaDefaults.Inflight)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

func measureQuota(ctx context.Context, o QuotaOptions) (res *QuotaMeasures, err error) {
	log := o.Log
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvdir-dirbench-quota-"); err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	c, err := StartDirectory(dir, []string{"--worker-block-quota", strconv.Itoa(o.Quota)})
	if err != nil {
		return nil, err
	}
	defer func() {
		c.Stop()
		if o.Logs || err != nil {
			for _, n := range c.Nodes {
				fmt.Fprintf(os.Stderr, "---- %s\n%s\n", n.ID, n.Tail(40))
			}
		}
	}()
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for a leader: %w", err)
	}
	agent := kvdirv1.NewAgentServiceClient(c.Nodes[leader].Conn())
	reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{
		Id: "flood-0", BlockSize: 1, Model: "bench", Address: "http://127.0.0.1:1"}})
	if err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	if err := Converge(ctx, c, time.Minute); err != nil {
		return nil, err
	}
	base, err := settledRSS(ctx, c)
	if err != nil {
		return nil, err
	}
	res = &QuotaMeasures{QuotaDetails: QuotaDetails{Nodes: Nodes, Quota: o.Quota, Flood: o.Flood}}
	res.HeapInuseMiB = append(res.HeapInuseMiB, heapInuseMiB(c))
	gen := &floodGen{r: rand.New(rand.NewPCG(7, 11)), worker: "flood-0", epoch: reg.Epoch, batch: o.BatchBlocks}

	// Fill the quota, and measure what a block costs.
	if err := gen.publish(ctx, c, int64(o.Quota), o.Inflight); err != nil {
		return nil, fmt.Errorf("fill the quota: %w", err)
	}
	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	filled, err := settledRSS(ctx, c)
	if err != nil {
		return nil, err
	}
	// Store the same blocks once more: no new state, but the garbage of
	// applying a quota's worth of events, which a running directory
	// carries (the Go heap grows to twice the live heap before a
	// collection). Bytes per entry are then what an entry costs in steady
	// state, and the flood below is measured against that.
	again := &floodGen{r: rand.New(rand.NewPCG(7, 11)), worker: gen.worker, epoch: gen.epoch, batch: gen.batch, seq: gen.seq}
	if err := again.publish(ctx, c, int64(o.Quota), o.Inflight); err != nil {
		return nil, fmt.Errorf("store the quota again: %w", err)
	}
	gen.seq = again.seq
	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	atQuota, err := settledRSS(ctx, c)
	if err != nil {
		return nil, err
	}
	res.HeapInuseMiB = append(res.HeapInuseMiB, heapInuseMiB(c))
	var sum, sumFilled float64
	for i := range c.Nodes {
		sum += float64(atQuota[i] - base[i])
		sumFilled += float64(filled[i] - base[i])
	}
	res.BytesPerEntry = sum / float64(len(c.Nodes)) / float64(o.Quota)
	res.FillBytesPerEntry = sumFilled / float64(len(c.Nodes)) / float64(o.Quota)
	if st, err := c.Nodes[leader].Status(ctx); err == nil && st.Counters.GetEntries() > 0 {
		res.IndexBytesPerEntry = float64(st.Counters.ApproxBytes) / float64(st.Counters.Entries)
	}
	log.Info("at the quota", "bytes_per_entry", res.BytesPerEntry, "index_estimate", res.IndexBytesPerEntry)

	// Flood past it.
	start := time.Now()
	if err := gen.publish(ctx, c, int64(o.Flood*float64(o.Quota)), o.Inflight); err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	res.FloodSeconds = time.Since(start).Seconds()
	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	res.DigestsAgree = true
	after, err := settledRSS(ctx, c)
	if err != nil {
		return nil, err
	}
	res.HeapInuseMiB = append(res.HeapInuseMiB, heapInuseMiB(c))
	for i := range c.Nodes {
		grown := float64(after[i] - base[i])
		res.GrowthRatio = max(res.GrowthRatio, grown/(float64(o.Quota)*res.BytesPerEntry))
		res.GrowthOverFill = max(res.GrowthOverFill, grown/(float64(o.Quota)*res.FillBytesPerEntry))
	}
	w, err := kvdirv1.NewDirectoryServiceClient(c.Nodes[leader].Conn()).GetWorker(ctx, &kvdirv1.GetWorkerRequest{WorkerId: "flood-0"})
	if err != nil {
		return nil, fmt.Errorf("get the worker: %w", err)
	}
	res.Published, res.Held, res.Dropped = gen.published, w.Worker.GetBlocks(), w.Worker.GetDroppedBlocks()
	mib := func(v []int64) float64 {
		var s int64
		for _, x := range v {
			s += x
		}
		return float64(s) / float64(len(v)) / (1 << 20)
	}
	res.BaseRSSMiB, res.QuotaRSSMiB, res.FloodRSSMiB = mib(base), mib(atQuota), mib(after)
	for i := range c.Nodes {
		res.NodeRSSMiB = append(res.NodeRSSMiB, [3]float64{mib(base[i : i+1]), mib(atQuota[i : i+1]), mib(after[i : i+1])})
	}
	log.Info("after the flood", "growth_ratio", res.GrowthRatio, "held", res.Held, "dropped", res.Dropped)
	if res.Held > uint64(o.Quota) {
		return nil, fmt.Errorf("the worker holds %d blocks, over its quota of %d", res.Held, o.Quota)
	}
	return res, nil
}

// floodGen publishes one worker's stored blocks: chains of 512 distinct
// random blocks in pieces of 256, packed into batches.
type floodGen struct {
	r         *rand.Rand
	worker    string
	epoch     uint64
	seq       uint64
	batch     int
	inChain   int
	parent    uint64
	published int64
}

func (g *floodGen) batches(n int64) []*kvdirv1.EventBatch {
	var out []*kvdirv1.EventBatch
	for n > 0 {
		g.seq++
		b := &kvdirv1.EventBatch{WorkerId: g.worker, Epoch: g.epoch, FirstSeq: g.seq, LastSeq: g.seq}
		for left := min(int64(g.batch), n); left > 0; {
			if g.inChain == 512 {
				g.inChain, g.parent = 0, radix.Root
			}
			k := int(min(left, 256, int64(512-g.inChain)))
			hs := make([]uint64, k)
			for i := range hs {
				hs[i] = g.r.Uint64() | 1 // never the reserved 0
			}
			b.Events = append(b.Events, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Parent: g.parent, Hashes: hs}}})
			g.parent, g.inChain = hs[k-1], g.inChain+k
			left -= int64(k)
			n -= int64(k)
			g.published += int64(k)
		}
		out = append(out, b)
	}
	return out
}

// publish sends n more blocks, a million at a time, each batch
// acknowledged as applied. When a stream breaks (the leader moved, as it
// may on a loaded machine) it resends what was not acknowledged to the
// leader of the moment, as an agent does.
func (g *floodGen) publish(ctx context.Context, c *fleet.Directory, n int64, inflight int) error {
	for n > 0 {
		k := min(n, 1<<20)
		bs := g.batches(k)
		for tries := 0; len(bs) > 0; tries++ {
			leader, err := c.WaitLeader(30 * time.Second)
			if err != nil {
				return err
			}
			acked, err := sendAll(ctx, kvdirv1.NewAgentServiceClient(c.Nodes[leader].Conn()), bs, inflight)
			bs = bs[acked:]
			if err != nil && (tries == 10 || ctx.Err() != nil) {
				return err
			}
		}
		n -= k
	}
	return nil
}

// sendAll sends batches on one stream, inflight at a time, and wants each
// acknowledged as applied (over the quota included; DUPLICATE for one
// resent). It returns how many were acknowledged, in order.
func sendAll(ctx context.Context, agent kvdirv1.AgentServiceClient, bs []*kvdirv1.EventBatch, inflight int) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := agent.Publish(ctx)
	if err != nil {
		return 0, fmt.Errorf("open a publish stream: %w", err)
	}
	slots := make(chan struct{}, inflight)
	sendErr := make(chan error, 1)
	go func() {
		for _, b := range bs {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				sendErr <- ctx.Err()
				return
			}
			if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
				sendErr <- fmt.Errorf("send batch %d: %w", b.FirstSeq, err)
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	for i := range bs {
		resp, err := stream.Recv()
		if err != nil {
			return i, fmt.Errorf("publish: %w", err)
		}
		if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED && resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE {
			return i, fmt.Errorf("batch %d: %v %s", resp.FirstSeq, resp.Status, resp.Message)
		}
		<-slots
	}
	return len(bs), <-sendErr
}

// settledRSS waits until every node's anonymous RSS stops falling (the Go
// runtime returns freed memory gradually) and returns it, in bytes.
func settledRSS(ctx context.Context, c *fleet.Directory) ([]int64, error) {
	out := make([]int64, len(c.Nodes))
	for i, n := range c.Nodes {
		var last int64 = -1
		steady := 0
		deadline := time.Now().Add(30 * time.Second)
		for steady < 5 && time.Now().Before(deadline) {
			v, err := rssAnon(n.Pid())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n.ID, err)
			}
			if last >= 0 && v >= last-last/100 {
				steady++
			} else {
				steady = 0
			}
			last = v
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		out[i] = last
	}
	return out, nil
}

var metricsClient = &http.Client{Timeout: 2 * time.Second}

// heapInuseMiB is the nodes' mean go_memstats_heap_inuse_bytes (0 if a
// node's /metrics cannot be read).
func heapInuseMiB(c *fleet.Directory) float64 {
	var sum float64
	for _, n := range c.Nodes {
		resp, err := metricsClient.Get("http://" + n.HTTP + "/metrics")
		if err != nil {
			return 0
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
		resp.Body.Close()
	}
	return sum / float64(len(c.Nodes)) / (1 << 20)
}

// scrape reads the values of the named unlabelled metrics from a node's
// /metrics.
func scrape(n *fleet.DirNode, names ...string) (map[string]float64, error) {
	resp, err := metricsClient.Get("http://" + n.HTTP + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", n.ID, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		if out[name], err = strconv.ParseFloat(v, 64); err != nil {
			return nil, fmt.Errorf("metrics of %s: %s: %w", n.ID, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", n.ID, err)
	}
	return out, nil
}

// rssAnon reads a process's resident anonymous memory (RssAnon in
// /proc/PID/status: the heap and stacks, not BoltDB's mapped file).
func rssAnon(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("RssAnon:")); ok {
			kb, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse RssAnon %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no RssAnon in /proc/%d/status", pid)
}
