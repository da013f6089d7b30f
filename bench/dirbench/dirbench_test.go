package dirbench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit"
)

// TestRunTiny runs the whole benchmark (three directory processes) at a
// tiny size and checks the envelope.
func TestRunTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts three directory processes")
	res, err := Run(context.Background(), Options{Scale: 0.001, Matches: 50, ChainBlocks: 64,
		LatencyRate: 20_000, LatencyFor: time.Second, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "directory"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"events_per_sec", "publish_commit_p99_ms", "match_p99_us", "rpc_baseline_p99_us",
		"snapshot_seconds", "snapshot_bytes", "restart_catchup_seconds"} {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d Details
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.Nodes != Nodes || !d.DigestsAgree || d.Entries <= 0 || d.Events != d.Entries {
		t.Fatalf("details %+v", d)
	}
	if f, _ := res.Figure("match_p99_us"); f.Target == nil || f.Target.Direction != benchjson.AtMost {
		t.Fatalf("match_p99_us target %+v", f.Target)
	}
}

// TestRunRaftTLSTiny runs the transport comparison (two clusters of three
// processes, one round) at a tiny size and checks its figures.
func TestRunRaftTLSTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts two clusters of three directory processes")
	res, err := RunRaftTLS(context.Background(), Options{Scale: 0.001, Rounds: 1, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "directory", "--raft-tls"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain_events_per_sec", "mtls_events_per_sec", "mtls_throughput_ratio"} {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d RaftTLSDetails
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.Rounds != 1 || len(d.PairRatios) != 1 || !d.DigestsAgree || d.Events <= 0 {
		t.Fatalf("details %+v", d)
	}
}

// TestRunWorkersTiny runs the worker-pool comparison (two clusters of
// three processes, one round) at a tiny size and checks its figures.
func TestRunWorkersTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts two clusters of three directory processes")
	res, err := RunWorkers(context.Background(), Options{Scale: 0.002, BatchBlocks: 64, Rounds: 1, Dir: t.TempDir()}, []int{4, 32})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "directory", "--worker-pools", "4,32"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"events_per_sec_4_workers", "events_per_sec_32_workers", "workers_throughput_ratio"} {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d WorkersDetails
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	// The shape is generated for each pool size: the same entries, within
	// what the generator's rounding gives.
	if len(d.Runs) != 2 || d.Runs[0].Workers != 4 || d.Runs[1].Workers != 32 || d.Runs[1].InflightPerWkr != 2 ||
		d.Runs[0].Events <= 0 || math.Abs(float64(d.Runs[0].Events-d.Runs[1].Events)) > 0.05*float64(d.Runs[0].Events) {
		t.Fatalf("details %+v", d)
	}
}

// TestRunGroupsTiny runs the group comparison (1 then 2 groups of three
// processes, one round) at a tiny size and checks its figures.
func TestRunGroupsTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts three clusters of three directory processes")
	res, err := RunGroups(context.Background(), Options{Scale: 0.002, Rounds: 1, Dir: t.TempDir()}, 2)
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "directory", "--groups", "2"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"events_per_sec_1_groups", "events_per_sec_2_groups", "throughput_ratio_2_groups", "events_per_node_cpu_second_2_groups"} {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d GroupsDetails
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if len(d.Runs) != 2 || d.Runs[1].Groups != 2 || len(d.Runs[1].PerGroup) != 2 || d.Runs[1].Events != 2*d.Runs[0].Events {
		t.Fatalf("details %+v", d)
	}
}

// TestRunWorkersRefusesBadPools checks the pool list is validated.
func TestRunWorkersRefusesBadPools(t *testing.T) {
	for _, pools := range [][]int{nil, {64}, {1024, 64}, {0, 64}} {
		if _, err := RunWorkers(context.Background(), Options{}, pools); err == nil {
			t.Errorf("pools %v accepted", pools)
		}
	}
	if _, err := RunGroups(context.Background(), Options{}, 1); err == nil {
		t.Error("--groups 1 accepted")
	}
}
