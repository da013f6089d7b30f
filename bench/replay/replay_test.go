package replay

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/workload"
)

// TestCompareLive replays a small generated session trace through real
// processes (3 directory nodes, 3 enginesims with agents, the router) under
// round-robin and kvdir, and checks what the engines reported: every
// request served, kvdir capturing more of the reuse than round-robin.
func TestCompareLive(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 3,
		EngineArgs: []string{"--time-scale", "0.1", "--profile", "llama3-70b", "--kv-blocks", "8192"}})
	cfg := workload.SessionPresets["chat"]
	cfg.Sessions, cfg.SessionRate, cfg.ThinkTimeSec, cfg.MaxTurns, cfg.OutputTokens = 24, 1, 4, 4, 20
	recs, err := workload.GenerateSessions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The whole fleet shares this machine's cores, its time compressed 10x
	// (at 50x a turn sent 0.4 s after the one before it would reach the
	// other router in 8 ms, before the first turn's placement had been
	// shared: a race real traffic does not run). The routers get the
	// look-up deadline kvbench replay gives them (the router's 5 ms default
	// is for a directory on its own machines) and the engines' profile.
	c := &Compare{Fleet: f, Routers: 2, Log: testkit.Logger(t), RouterArgs: []string{"--match-timeout", "25ms", "--profile", "llama3-70b"},
		Base: Config{Records: recs, TraceBlockSize: workload.DefaultBlockSize, EngineBlockSize: 16, Model: "llama3-8b", TimeScale: 0.1}}
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Fatal("haproxy is not installed; the HAProxy baseline needs it (make deps installs Debian's package)")
	}
	policies := []string{"round-robin", "kvdir", HAProxy}
	hit := map[string]float64{}
	for _, p := range policies {
		pol, res, err := c.Run(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v\n%s", p, err, f.Logs(20))
		}
		if res.Errors > 0 || pol.Requests != len(recs) {
			t.Fatalf("%s: %d of %d requests completed, %d errors (first: %s)", p, pol.Requests, len(recs), res.Errors, res.FirstErr)
		}
		if pol.HitRate <= 0 || pol.ReuseCaptured > 1.0001 || pol.TTFTP50Ms <= 0 {
			t.Fatalf("%s: implausible summary %+v", p, pol)
		}
		hit[p] = pol.HitRate
		t.Logf("%s: hit rate %.3f, reuse captured %.3f, TTFT p50/p90 %.0f/%.0f ms, max share %.2f", p, pol.HitRate, pol.ReuseCaptured, pol.TTFTP50Ms, pol.TTFTP90Ms, pol.MaxReplicaShare)
		if p == "kvdir" {
			// What the routers saw: requests placed without the directory
			// and the blocks the directory holds once the run is over.
			blocks := directoryBlocks(ctx, t, f, c.Base.Model)
			t.Logf("kvdir: fallbacks %v, directory look-up p50/p99 %.1f/%.1f ms, directory blocks per worker %v",
				res.Fallbacks, res.LookupP50Ms, res.LookupP99Ms, blocks)
			if hit["kvdir"] <= hit["round-robin"] {
				t.Fatalf("kvdir hit rate %.3f is not above round-robin's %.3f\n%s\n%s", hit["kvdir"], hit["round-robin"], c.RouterLogs(), f.Logs(20))
			}
		}
	}
}

// directoryBlocks returns the blocks f's directory holds per worker of
// model.
func directoryBlocks(ctx context.Context, t *testing.T, f *fleet.Fleet, model string) map[string]uint64 {
	t.Helper()
	dc, err := dirclient.New(dirclient.Config{Addrs: strings.Split(f.DirectoryAddrs(), ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	lw, err := dc.ListWorkers(ctx, model, false)
	if err != nil {
		t.Fatalf("list the directory's workers: %v", err)
	}
	blocks := map[string]uint64{}
	for _, w := range lw.GetWorkers() {
		blocks[w.GetSpec().GetId()] = w.GetBlocks()
	}
	return blocks
}

// TestRunEndpoint replays a trace against an endpoint kvbench did not start
// (here one engine simulator, which names no worker): every request is
// served and counted for the one "endpoint" replica, with the engine's own
// cache hits.
func TestRunEndpoint(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{NoDirectory: true, Engines: 1,
		EngineArgs: []string{"--time-scale", "0.02"}})
	cfg := workload.SessionPresets["chat"]
	cfg.Sessions, cfg.SessionRate, cfg.ThinkTimeSec, cfg.MaxTurns, cfg.OutputTokens = 8, 4, 2, 3, 10
	recs, err := workload.GenerateSessions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunEndpoint(ctx, Options{Trace: "gen", Records: recs, TraceBlockSize: workload.DefaultBlockSize,
		TimeScale: 0.02, Model: "llama3-8b", Log: testkit.Logger(t)},
		f.Engines[0].URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != 1 {
		t.Fatalf("%d policies, want 1", len(rep.Policies))
	}
	p := rep.Policies[0]
	if p.Requests != len(recs) || len(p.Replicas) != 1 || p.Replicas[0].ID != "endpoint" || p.HitRate <= 0 {
		t.Fatalf("summary: %d of %d requests, replicas %+v, hit rate %.3f", p.Requests, len(recs), p.Replicas, p.HitRate)
	}
}

func TestMain(m *testing.M) { testkit.Main(m) }
