package sim

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

// TestOneRouterReproducesResults runs the demo trace the way
// bench/results/sim-demo.json was made (before the simulator modelled
// several routers) and requires every figure of every policy to be equal:
// one router is the simulator as it was, whatever the intent settings
// (with one router there are no other routers to share with).
func TestOneRouterReproducesResults(t *testing.T) {
	path := filepath.Join("..", "results", "sim-demo.json")
	want, err := report.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadFile(filepath.Join("..", "testdata", "demo-sessions.jsonl"), workload.DefaultBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	workload.SortByTime(recs)
	ideal := workload.IdealHits(recs, workload.DefaultBlockSize, simengine.DefaultBlockSize)
	prof, err := costmodel.ProfileByName(want.Profile)
	if err != nil {
		t.Fatal(err)
	}
	variants := map[string]func(*Config){
		"default":           func(*Config) {},
		"routers 1":         func(c *Config) { c.Routers = 1 },
		"intents, lag 1 s":  func(c *Config) { c.SharedIntents, c.IntentLag = true, time.Second },
		"random balance":    func(c *Config) { c.Balance = BalanceRandom },
		"intents, lag 0 ms": func(c *Config) { c.SharedIntents = true },
	}
	for _, w := range want.Policies {
		for name, mod := range variants {
			cfg := Config{Policy: w.Name, Profile: prof, Replicas: want.Replicas, KVBlocks: want.KVBlocks, Seed: want.Seed}
			mod(&cfg)
			got, err := Run(context.Background(), recs, ideal, cfg)
			if err != nil {
				t.Fatalf("%s, %s: %v", w.Name, name, err)
			}
			got.WallSec, w.WallSec = 0, 0
			got.ReuseVsPooled, w.ReuseVsPooled = 0, 0 // the command fills it from the trace
			if !reflect.DeepEqual(got, w) {
				t.Fatalf("%s, %s: differs from %s:\ngot  %+v\nwant %+v", w.Name, name, path, got, w)
			}
		}
	}
}

// burstTokens is the prompt length of a burst request.
const burstTokens = 24 * 512

// burst is a session warmed on one replica, then, once its blocks are in
// the directory, n sibling requests within n ms: the session's 16-block
// prefix (8,192 tokens) and 8 blocks of their own each.
func burst(n int) ([]workload.Record, []int) {
	prefix := make([]int64, 16)
	for i := range prefix {
		prefix[i] = int64(i + 1)
	}
	recs := []workload.Record{{Timestamp: 0, InputLength: 8704, OutputLength: 2, HashIDs: append(slices.Clone(prefix), 100)}}
	for k := range n {
		ids := slices.Clone(prefix)
		for b := range 8 {
			ids = append(ids, int64(1000+100*k+b))
		}
		recs = append(recs, workload.Record{Timestamp: 20_000 + float64(k), InputLength: burstTokens, OutputLength: 2, HashIDs: ids})
	}
	return recs, workload.IdealHits(recs, workload.DefaultBlockSize, simengine.DefaultBlockSize)
}

// placements runs the burst under kvdir and returns the burst's requests
// each replica took, the warm one (the replica of the warm-up) first and
// the others in decreasing order: cold replicas are alike, so which of them
// a router picks among equals is its own random choice.
func placements(t *testing.T, recs []workload.Record, ideal []int, mod func(*Config)) []int {
	t.Helper()
	cfg := config(t, "kvdir", 20000)
	mod(&cfg)
	p, err := Run(context.Background(), recs, ideal, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The warm replica served the warm-up, the one request whose prompt is
	// not burstTokens long.
	counts := make([]int, len(p.Replicas))
	warm := -1
	for i, r := range p.Replicas {
		counts[i] = r.Requests
		if r.PromptTokens%burstTokens != 0 {
			warm, counts[i] = i, r.Requests-1
		}
	}
	if warm < 0 {
		t.Fatalf("no replica served the warm-up: %+v", p.Replicas)
	}
	rest := slices.Delete(slices.Clone(counts), warm, warm+1)
	slices.SortFunc(rest, func(a, b int) int { return b - a })
	return append([]int{counts[warm]}, rest...)
}

// TestRoutersHerdWithoutIntents: one router spreads a burst of siblings
// once the warm replica's queue costs more than recomputing the prefix;
// four routers, each seeing only its own placements, send about four times
// as many to the warm replica before spilling.
func TestRoutersHerdWithoutIntents(t *testing.T) {
	recs, ideal := burst(16)
	one := placements(t, recs, ideal, func(*Config) {})
	four := placements(t, recs, ideal, func(c *Config) { c.Routers = 4 })
	t.Logf("warm replica first: 1 router %v, 4 routers %v", one, four)
	if one[0] >= len(recs) || one[0] < 2 {
		t.Fatalf("1 router: %v, want the warm replica to take some but not all of the burst", one)
	}
	if four[0] < one[0]+4 {
		t.Fatalf("4 routers without intents sent %d requests to the warm replica, 1 router %d: want at least 4 more (herding)", four[0], one[0])
	}
}

// TestSharedIntentsPlaceLikeOneRouter: with every placement shared at once
// (IntentLag 0), four routers give the policy what one router gives it.
// With one kvdir instance behind all four (its random tie breaks then come
// from one stream, as for one router) every figure of the run is equal;
// with an instance per router, as in a deployment, only the tie breaks
// differ. Intents that arrive after the burst change nothing.
func TestSharedIntentsPlaceLikeOneRouter(t *testing.T) {
	recs, ideal := burst(16)
	kvdir := func(c *Config) {
		var err error
		if c.Impl, err = placement.NewKVDir(placement.Options{Seed: c.Seed, Profile: c.Profile, ChunkTokens: simengine.DefaultMaxBatchedTokens}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(mod func(*Config)) report.Policy {
		t.Helper()
		cfg := config(t, "kvdir", 20000)
		kvdir(&cfg)
		mod(&cfg)
		p, err := Run(context.Background(), recs, ideal, cfg)
		if err != nil {
			t.Fatal(err)
		}
		p.WallSec = 0
		return p
	}
	one := run(func(*Config) {})
	for _, balance := range []string{BalanceRoundRobin, BalanceRandom} {
		shared := run(func(c *Config) { c.Routers, c.SharedIntents, c.Balance = 4, true, balance })
		if !reflect.DeepEqual(shared, one) {
			t.Fatalf("%s balance: 4 routers sharing intents at once, one policy instance:\n%+v\n1 router:\n%+v", balance, shared, one)
		}
		none := run(func(c *Config) { c.Routers, c.Balance = 4, balance })
		if reflect.DeepEqual(none, one) {
			t.Fatalf("%s balance: 4 routers without intents place as 1 router", balance)
		}
	}
	// The burst is one session (no session id: its first hash id is the
	// key), which the session balancer sends through one router: one router
	// even without intents.
	if got := run(func(c *Config) { c.Routers, c.Balance = 4, BalanceSession }); !reflect.DeepEqual(got, one) {
		t.Fatalf("session balance: one session through 4 routers without intents:\n%+v\n1 router:\n%+v", got, one)
	}

	single := placements(t, recs, ideal, func(*Config) {})
	own := placements(t, recs, ideal, func(c *Config) { c.Routers, c.SharedIntents = 4, true })
	late := placements(t, recs, ideal, func(c *Config) { c.Routers, c.SharedIntents, c.IntentLag = 4, true, time.Second })
	none := placements(t, recs, ideal, func(c *Config) { c.Routers = 4 })
	t.Logf("policy instance per router, warm replica first: 1 router %v, 4 sharing at once %v, 4 sharing after 1 s %v, 4 not sharing %v",
		single, own, late, none)
	if d := own[0] - single[0]; d < -1 || d > 1 {
		t.Fatalf("4 routers sharing intents sent %d requests to the warm replica, 1 router %d", own[0], single[0])
	}
	if !slices.Equal(late, none) {
		t.Fatalf("intents arriving after the burst: %v, want as without intents %v", late, none)
	}
}

// TestRouterViewLag: a router whose view of the directory lags past the
// burst does not know the warm replica and loses the burst's hits.
func TestRouterViewLag(t *testing.T) {
	recs, ideal := burst(4)
	run := func(lag time.Duration) report.Policy {
		cfg := config(t, "kvdir", 20000)
		cfg.RouterViewLag, cfg.SpeculativeTTL = lag, -1
		p, err := Run(context.Background(), recs, ideal, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	fresh, stale := run(0), run(time.Minute)
	t.Logf("hit rate: view lag 0 %.3f, 1 min %.3f", fresh.HitRate, stale.HitRate)
	if fresh.HitRate < 0.4 || stale.HitRate > fresh.HitRate-0.2 {
		t.Fatalf("hit rate with a fresh view %.3f (want >= 0.4), with a view 1 min late %.3f (want 0.2 lower)", fresh.HitRate, stale.HitRate)
	}
}

func TestViewLags(t *testing.T) {
	cfg := Config{Routers: 8, RouterViewLag: 20 * time.Millisecond, RouterViewJitter: 30 * time.Millisecond, Seed: 3}
	a, b := ViewLags(cfg), ViewLags(cfg)
	if !slices.Equal(a, b) || len(a) != 8 {
		t.Fatalf("lags %v then %v", a, b)
	}
	distinct := map[time.Duration]bool{}
	for _, l := range a {
		if l < 0 || l > 50*time.Millisecond {
			t.Fatalf("lag %v outside [0, 50ms]: %v", l, a)
		}
		distinct[l] = true
	}
	if len(distinct) < 4 {
		t.Fatalf("jitter gave %d distinct lags of 8: %v", len(distinct), a)
	}
	cfg.RouterViewJitter = 0
	for _, l := range ViewLags(cfg) {
		if l != cfg.RouterViewLag {
			t.Fatalf("without jitter: %v", ViewLags(cfg))
		}
	}
}

func TestRouterConfigErrors(t *testing.T) {
	recs, ideal := burst(2)
	bad := []func(*Config){
		func(c *Config) { c.Routers = -1 },
		func(c *Config) { c.Balance = "sticky" },
		func(c *Config) { c.RouterViewLag = -time.Millisecond },
		func(c *Config) { c.RouterViewJitter = -time.Millisecond },
		func(c *Config) { c.IntentLag = -time.Millisecond },
	}
	for i, mod := range bad {
		c := config(t, "kvdir", 1000)
		mod(&c)
		if _, err := Run(context.Background(), recs, ideal, c); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("case %d: err %v, want ErrBadConfig", i, err)
		}
	}
}
