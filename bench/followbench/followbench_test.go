package followbench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestRunTiny runs the whole benchmark (three directory processes) at a
// tiny size and checks the envelope.
func TestRunTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts three directory processes")
	res, err := Run(context.Background(), Options{Scale: 0.002, ColdStarts: 2, LagRates: []int{20_000}, LagFor: time.Second, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "follow"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cold_start_seconds", "snapshot_bytes", "node_fsm_bytes_per_entry", "replica_bytes_per_entry",
		"replica_memory_ratio", "lag_events_per_sec"} {
		if f, ok := res.Figure(name); !ok || f.Measured <= 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	// On a loaded machine a one-second phase may fall short of its rate,
	// and a replica may apply a batch before its acknowledgement arrives:
	// these may be zero, never negative.
	for _, name := range []string{"view_lag_p99_ms", "max_sustained_events_per_sec"} {
		if f, ok := res.Figure(name); !ok || f.Measured < 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d Details
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.Entries <= 0 || len(d.ColdStarts) != 2 || len(d.LagPhases) != 1 || d.LagPhases[0].Batches == 0 {
		t.Fatalf("details %+v", d)
	}
	for _, cs := range d.ColdStarts {
		if cs.SnapshotBytes <= 0 || cs.Seconds < cs.ReceiveSeconds+cs.ApplySeconds {
			t.Fatalf("cold start %+v: no snapshot, or its parts exceed the whole", cs)
		}
	}
}

func TestRunRefusesBadRate(t *testing.T) {
	if _, err := Run(context.Background(), Options{LagRates: []int{1000, 0}}); err == nil || !strings.Contains(err.Error(), "lag rate 0") {
		t.Fatalf("Run with a zero lag rate: %v", err)
	}
}
