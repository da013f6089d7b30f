package agentbench

import (
	"context"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit"
)

func check(t *testing.T, res *benchjson.Results, names ...string) Details {
	t.Helper()
	res.Command = []string{"kvbench", "agent"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d Details
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.DecodeBlocks <= 0 || d.DecodeMethod == "" || d.EngineMethod == "" {
		t.Fatalf("details %+v", d)
	}
	return d
}

// TestRunInProcess runs the in-process phases at a tiny size.
func TestRunInProcess(t *testing.T) {
	res, err := Run(context.Background(), Options{DecodeFor: 100 * time.Millisecond, EngineRequests: 300, SkipE2E: true})
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, "decode_hash_blocks_per_sec", "enginesim_requests_per_sec", "enginesim_modelled_requests_per_sec")
	if _, ok := res.Figure("end_to_end_event_lag_p99_ms"); ok {
		t.Fatal("end-to-end figure without the end-to-end phase")
	}
}

// TestRunEndToEnd runs every phase, processes included, at a tiny size.
func TestRunEndToEnd(t *testing.T) {
	testkit.SkipIfShort(t, "starts directory, enginesim and agent processes")
	res, err := Run(context.Background(), Options{DecodeFor: 100 * time.Millisecond, EngineRequests: 300,
		Requests: 12, Concurrency: 2, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	d := check(t, res, "decode_hash_blocks_per_sec", "end_to_end_event_lag_p50_ms", "end_to_end_event_lag_p99_ms")
	if d.E2ERequests+d.E2ETimeouts != 12 || d.E2EConcurrency != 2 {
		t.Fatalf("details %+v", d)
	}
}
