package dirbench

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// RaftTLSTool is the name of the results of the Raft transport comparison
// (kvbench directory --raft-tls).
const RaftTLSTool = "directory-raft-tls"

// DefaultRounds is how many times the comparison runs each transport.
const DefaultRounds = 5

// RaftTLSDetails are the comparison's details.
type RaftTLSDetails struct {
	Nodes          int   `json:"nodes"`
	Workers        int   `json:"workers"`
	Events         int64 `json:"events"`
	Batches        int   `json:"batches"`
	BatchBlocks    int   `json:"batch_blocks"`
	InflightPerWkr int   `json:"inflight_per_worker"`
	Rounds         int   `json:"rounds"`
	// Order is the transports in the order they ran, by round.
	Order [][]string `json:"order"`
	// PlainEventsPerSec and MTLSEventsPerSec are every round's throughput.
	PlainEventsPerSec []float64 `json:"plain_events_per_sec"`
	MTLSEventsPerSec  []float64 `json:"mtls_events_per_sec"`
	// PairRatios are each round's mutual-TLS throughput over its plain
	// run's (the two ran back to back, so they shared the machine's load).
	PairRatios []float64 `json:"pair_ratios"`
	// RatioOfMedians is the median mutual-TLS throughput over the median
	// plain one.
	RatioOfMedians float64 `json:"ratio_of_medians"`
	// PlainCPUPerMEvents and MTLSCPUPerMEvents are every round's CPU
	// seconds (user and system, the three nodes together) per million
	// events committed; CPUPairRatios each round's mutual-TLS over plain.
	// CPU time moves less than throughput with what else the machine runs.
	PlainCPUPerMEvents []float64 `json:"plain_cpu_seconds_per_m_events"`
	MTLSCPUPerMEvents  []float64 `json:"mtls_cpu_seconds_per_m_events"`
	CPUPairRatios      []float64 `json:"cpu_pair_ratios"`
	DigestsAgree       bool      `json:"digests_agree"`
	Setup              string    `json:"setup"`
}

// RaftTLSMeasures are the comparison's figures and details.
type RaftTLSMeasures struct {
	RaftTLSDetails
	Plain, MTLS       float64 // median events/s
	PlainP99, MTLSP99 float64 // median burst p99, ms
}

// Results fills res with the comparison's figures.
func (m *RaftTLSMeasures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "plain_events_per_sec", Unit: "events/s", Measured: m.Plain, Note: "block events committed through Raft on plain TCP (--insecure-raft), median of the rounds"},
		fig{Name: "mtls_events_per_sec", Unit: "events/s", Measured: m.MTLS, Note: "same, Raft over mutual TLS"},
		fig{Name: "mtls_throughput_ratio", Unit: "ratio", Target: benchjson.Min(0.8), Measured: median(m.PairRatios), Note: "mutual TLS over plain TCP, median of the rounds' ratios (each round runs both back to back)"},
		fig{Name: "plain_cpu_seconds_per_m_events", Unit: "s", Measured: median(m.PlainCPUPerMEvents), Note: "CPU time of the three nodes per million events committed, plain TCP, median of the rounds"},
		fig{Name: "mtls_cpu_seconds_per_m_events", Unit: "s", Measured: median(m.MTLSCPUPerMEvents), Note: "same over mutual TLS"},
		fig{Name: "mtls_cpu_ratio", Unit: "ratio", Measured: median(m.CPUPairRatios), Note: "CPU per event, mutual TLS over plain TCP, median of the rounds' ratios"},
		fig{Name: "plain_burst_commit_p99_ms", Unit: "ms", Measured: m.PlainP99, Note: "publish-to-acknowledgement p99 on plain TCP, median of the rounds"},
		fig{Name: "mtls_burst_commit_p99_ms", Unit: "ms", Measured: m.MTLSP99, Note: "same over mutual TLS"},
	)
	return res.SetDetails(m.RaftTLSDetails)
}

// RunRaftTLS measures the directory's commit throughput with Raft over
// mutual TLS against plain TCP, in the same run: both serve the API over
// TLS, so that the Raft transport is the only difference; each round starts
// a fresh cluster per transport, in alternating order, and publishes the
// same workload as Run's throughput phase.
func RunRaftTLS(ctx context.Context, opts Options) (*benchjson.Results, error) {
	return benchjson.Measure(RaftTLSTool, func() (*RaftTLSMeasures, error) { return measureRaftTLS(ctx, opts.withDefaults()) })
}

func measureRaftTLS(ctx context.Context, cfg Options) (*RaftTLSMeasures, error) {
	log := cfg.Log
	rounds := cfg.Rounds
	if rounds <= 0 {
		rounds = DefaultRounds
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvdir-dirbench-tls-")
		if err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	bins, err := testkit.Build(dir, "directory")
	if err != nil {
		return nil, fmt.Errorf("build the directory: %w", err)
	}
	ca, err := testkit.NewCA("kvdir bench CA")
	if err != nil {
		return nil, err
	}
	cert, err := ca.Issue([]string{"127.0.0.1"})
	if err != nil {
		return nil, err
	}
	caFile, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := cert.Write(dir, "node")
	if err != nil {
		return nil, err
	}
	client := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	tlsFlags := []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-ca", caFile}

	m := &RaftTLSMeasures{RaftTLSDetails: RaftTLSDetails{Nodes: Nodes, BatchBlocks: cfg.BatchBlocks, InflightPerWkr: cfg.Inflight,
		Rounds: rounds, DigestsAgree: true,
		Setup: "API over TLS in both; Raft on plain TCP (--insecure-raft) or over mutual TLS (TLS 1.3); one certificate for 127.0.0.1 shared by the nodes"}}
	wl := radixtest.Generate(radixtest.Full.Scaled(cfg.Scale))
	m.Workers = wl.Shape.Workers
	var plainP99, tlsP99 []float64
	for r := range rounds {
		order := []string{"plain", "mtls"}
		if r%2 == 1 {
			order = []string{"mtls", "plain"}
		}
		m.Order = append(m.Order, order)
		for _, mode := range order {
			flags := append([]string{"--lease", "1h", "--log-level", "warn"}, tlsFlags...)
			if mode == "plain" {
				flags = append(flags, "--insecure-raft")
			}
			flags = append(flags, cfg.NodeFlags...)
			res, err := publishRound(ctx, bins["directory"], filepath.Join(dir, fmt.Sprintf("round%d-%s", r+1, mode)), client, flags, wl, cfg)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, mode, err)
			}
			m.Events, m.Batches = res.Events, res.Batches
			m.DigestsAgree = m.DigestsAgree && res.DigestsAgree
			cpu := res.cpuSeconds / float64(res.Events) * 1e6
			if mode == "plain" {
				m.PlainCPUPerMEvents = append(m.PlainCPUPerMEvents, cpu)
				m.PlainEventsPerSec = append(m.PlainEventsPerSec, res.EventsPerSec)
				plainP99 = append(plainP99, res.BurstCommitP99ms)
			} else {
				m.MTLSCPUPerMEvents = append(m.MTLSCPUPerMEvents, cpu)
				m.MTLSEventsPerSec = append(m.MTLSEventsPerSec, res.EventsPerSec)
				tlsP99 = append(tlsP99, res.BurstCommitP99ms)
			}
			log.Info("published", "round", r+1, "raft", mode, "events_per_sec", res.EventsPerSec, "burst_commit_p99_ms", res.BurstCommitP99ms, "cpu_seconds_per_m_events", cpu)
		}
	}
	for r := range rounds {
		m.PairRatios = append(m.PairRatios, m.MTLSEventsPerSec[r]/m.PlainEventsPerSec[r])
		m.CPUPairRatios = append(m.CPUPairRatios, m.MTLSCPUPerMEvents[r]/m.PlainCPUPerMEvents[r])
	}
	m.Plain, m.MTLS = median(m.PlainEventsPerSec), median(m.MTLSEventsPerSec)
	m.RatioOfMedians = m.MTLS / m.Plain
	m.PlainP99, m.MTLSP99 = median(plainP99), median(tlsP99)
	return m, nil
}

// roundResult is one publish run: its measures and the CPU time the nodes
// spent in it.
type roundResult struct {
	*Measures
	cpuSeconds float64
}

// publishRound starts a cluster with flags in dir, publishes the workload
// as fast as it is acknowledged (timing the nodes' CPU over it), checks
// that the nodes agree and stops it.
func publishRound(ctx context.Context, bin, dir string, client *tls.Config, flags []string, wl *radixtest.Workload, cfg Options) (out *roundResult, err error) {
	c, err := fleet.StartDirectoryTLS(bin, dir, Nodes, client, flags...)
	if err != nil {
		return nil, fmt.Errorf("start the cluster: %w", err)
	}
	defer func() {
		c.Stop()
		if cfg.Logs || err != nil {
			for _, n := range c.Nodes {
				fmt.Fprintf(os.Stderr, "---- %s\n%s\n", n.ID, n.Tail(40))
			}
		}
		os.RemoveAll(dir)
	}()
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return nil, fmt.Errorf("wait for a leader: %w", err)
	}
	res := &Measures{}
	work := Batches(wl, cfg.BatchBlocks)
	for _, b := range work {
		res.Batches += len(b)
	}
	before, err := clusterCPU(c)
	if err != nil {
		return nil, err
	}
	if err := PublishAll(ctx, c.Nodes[leader], work, cfg.Inflight, res); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	after, err := clusterCPU(c)
	if err != nil {
		return nil, err
	}
	if err := Converge(ctx, c, 2*time.Minute); err != nil {
		return nil, err
	}
	res.DigestsAgree = true
	return &roundResult{Measures: res, cpuSeconds: after - before}, nil
}

// clusterCPU is the CPU time (user and system, seconds) the nodes' processes
// have used, from /proc (Linux; clock ticks of 1/100 s).
func clusterCPU(c *fleet.Directory) (float64, error) {
	total := 0.0
	for _, n := range c.Nodes {
		s, err := nodeCPU(n)
		if err != nil {
			return 0, err
		}
		total += s
	}
	return total, nil
}

// nodeCPU is the CPU time (user and system) of a node's process, in
// seconds.
func nodeCPU(n *fleet.DirNode) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.Pid()))
	if err != nil {
		return 0, fmt.Errorf("CPU time of %s: %w", n.ID, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count from after it. utime and stime are fields 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("CPU time of %s: short /proc stat", n.ID)
	}
	total := 0.0
	for _, v := range f[11:13] {
		ticks, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("CPU time of %s: %w", n.ID, err)
		}
		total += ticks / 100
	}
	return total, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
