package indexbench

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit"
)

// TestRunTiny runs every phase at a tiny scale and checks the envelope.
func TestRunTiny(t *testing.T) {
	testkit.SkipIfShort(t, "runs the index benchmark, 10 s or more under -race")
	res, err := Run(context.Background(), Options{Scale: 0.001, Matches: 400, WriteRate: 10_000, ChurnEvents: 20_000,
		GoRadixScale: 0.0005, ChainBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "index"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	if res.Tool != Tool {
		t.Fatalf("tool %q", res.Tool)
	}
	for _, name := range []string{"apply_events_per_sec", "match_p50_us", "match_p99_us", "bytes_per_entry",
		"snapshot_write_mb_per_sec", "snapshot_read_mb_per_sec", "hash_32k_tokens_us", GoRadixPrefix + "goradix_match_p50_us"} {
		f, ok := res.Figure(name)
		if !ok || f.Measured <= 0 || f.Unit == "" {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d Details
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.Workers <= 0 || d.Entries <= 0 || d.ChainBlocks != 64 || d.MatchQueries != 400 || d.GoRadix == nil {
		t.Fatalf("details %+v", d)
	}
	// The envelope survives a round trip through its file form.
	b, err := benchjson.Encode(res)
	if err != nil {
		t.Fatal(err)
	}
	var back benchjson.Results
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Figures) != len(res.Figures) || back.Started != res.Started {
		t.Fatalf("round trip: %d figures, started %v", len(back.Figures), back.Started)
	}
}
