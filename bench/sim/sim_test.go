package sim

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

// smallTrace is a few dozen chat sessions with shared system prompts.
func smallTrace(t *testing.T) ([]workload.Record, []int) {
	t.Helper()
	cfg := workload.SessionPresets["agent"]
	cfg.Sessions, cfg.SessionRate, cfg.MaxTurns, cfg.ThinkTimeSec = 24, 2, 5, 5
	cfg.DocumentTokens, cfg.ToolTokens, cfg.MaxInputTokens = 1500, 600, 16000
	recs, err := workload.GenerateSessions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return recs, workload.IdealHits(recs, workload.DefaultBlockSize, simengine.DefaultBlockSize)
}

func config(t *testing.T, policy string, kvBlocks int) Config {
	t.Helper()
	prof, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	return Config{Policy: policy, Profile: prof, Replicas: 4, KVBlocks: kvBlocks, Seed: 7}
}

func TestDeterministic(t *testing.T) {
	recs, ideal := smallTrace(t)
	for _, pol := range []string{"kvdir", "random", "llm-d"} {
		a, err := Run(context.Background(), recs, ideal, config(t, pol, 4000))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(context.Background(), recs, ideal, config(t, pol, 4000))
		if err != nil {
			t.Fatal(err)
		}
		a.WallSec, b.WallSec = 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs with the same seed differ:\n%+v\n%+v", pol, a, b)
		}
	}
}

// TestConservation runs every policy: every request finishes (or is
// rejected) exactly once, the prompt tokens add up, and no policy hits more
// than one unlimited cache would.
func TestConservation(t *testing.T) {
	recs, ideal := smallTrace(t)
	var input, idealSum int64
	for i, r := range recs {
		input += int64(r.InputLength)
		idealSum += int64(ideal[i])
	}
	for _, pol := range append(placement.Names(), "kvdir-fixed-ttl") {
		cfg := config(t, pol, 2000)
		if pol == "kvdir-fixed-ttl" {
			cfg.Policy, cfg.SpeculativeFixedTTL = "kvdir", true
		}
		p, err := Run(context.Background(), recs, ideal, cfg)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		if p.Requests+p.Rejected != len(recs) || p.Rejected != 0 {
			t.Fatalf("%s: %d finished + %d rejected of %d", pol, p.Requests, p.Rejected, len(recs))
		}
		if p.PromptTokens != input {
			t.Fatalf("%s: %d prompt tokens, trace has %d", pol, p.PromptTokens, input)
		}
		if p.HitTokens > idealSum || p.ReuseCaptured > 1 {
			t.Fatalf("%s: %d hit tokens, more than the ideal %d", pol, p.HitTokens, idealSum)
		}
		if p.PrefillTokensComputed < p.PromptTokens-p.HitTokens {
			t.Fatalf("%s: computed %d prefill tokens, fewer than the %d uncached", pol, p.PrefillTokensComputed, p.PromptTokens-p.HitTokens)
		}
		n := 0
		for _, r := range p.Replicas {
			n += r.Requests
		}
		if n != p.Requests || len(p.Queue.Replicas) != 4 {
			t.Fatalf("%s: replicas served %d of %d requests", pol, n, p.Requests)
		}
		if len(p.DirectoryProblems) != 0 {
			t.Fatalf("%s: directory translation problems %v", pol, p.DirectoryProblems)
		}
	}
}

// TestCacheAwareBeatsRoundRobin checks that the directory view reaches the
// policies: with room for the working set, longest-prefix placement captures
// most of the reuse and round-robin on 4 replicas much less.
func TestCacheAwareBeatsRoundRobin(t *testing.T) {
	recs, ideal := smallTrace(t)
	rr, err := Run(context.Background(), recs, ideal, config(t, "round-robin", 20000))
	if err != nil {
		t.Fatal(err)
	}
	px, err := Run(context.Background(), recs, ideal, config(t, "prefix", 20000))
	if err != nil {
		t.Fatal(err)
	}
	if px.ReuseCaptured < 0.9 || rr.ReuseCaptured > 0.7 {
		t.Fatalf("reuse captured: prefix %.3f (want >= 0.9), round-robin %.3f (want <= 0.7)", px.ReuseCaptured, rr.ReuseCaptured)
	}
}

func TestRejectsWhatDoesNotFit(t *testing.T) {
	recs := []workload.Record{
		{Timestamp: 0, InputLength: 600, OutputLength: 2, HashIDs: []int64{1, 2}},
		{Timestamp: 10, InputLength: 5000, OutputLength: 2, HashIDs: []int64{3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{Timestamp: 20, InputLength: 700, OutputLength: 2, HashIDs: []int64{1, 13}},
	}
	ideal := workload.IdealHits(recs, 512, 16)
	p, err := Run(context.Background(), recs, ideal, config(t, "kvdir", 100)) // 1,600 tokens per replica
	if err != nil {
		t.Fatal(err)
	}
	if p.Rejected != 1 || p.Requests != 2 {
		t.Fatalf("%d rejected, %d finished; want 1 and 2", p.Rejected, p.Requests)
	}
}

func TestConfigErrors(t *testing.T) {
	recs, ideal := smallTrace(t)
	bad := []func(*Config){
		func(c *Config) { c.Replicas = 0 },
		func(c *Config) { c.KVBlocks = 0 },
		func(c *Config) { c.TimeScale = -1 },
		func(c *Config) { c.EventLag = -1 },
	}
	for i, mod := range bad {
		c := config(t, "kvdir", 1000)
		mod(&c)
		if _, err := Run(context.Background(), recs, ideal, c); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("case %d: err %v, want ErrBadConfig", i, err)
		}
	}
	c := config(t, "no-such-policy", 1000)
	if _, err := Run(context.Background(), recs, ideal, c); !errors.Is(err, placement.ErrUnknownPolicy) {
		t.Fatalf("unknown policy: err %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, recs, ideal, config(t, "kvdir", 1000)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: err %v", err)
	}
}

func TestDefaultKVBlocks(t *testing.T) {
	a, ok := DefaultKVBlocks("llama3-70b", 16)
	if !ok || a.BytesPerToken != 327680 || a.Blocks < 8000 || a.Blocks > 11000 {
		t.Fatalf("70B: %+v", a)
	}
	b, ok := DefaultKVBlocks("llama3-8b", 16)
	if !ok || b.BytesPerToken != 131072 || b.Blocks < 45000 || b.Blocks > 60000 {
		t.Fatalf("8B: %+v", b)
	}
	if _, ok := DefaultKVBlocks("custom", 16); ok {
		t.Fatal("unknown profile has a default")
	}
}

// TestLateBinding overloads two replicas: late binding holds requests at
// the router, and every request is still served or refused exactly once
// (Run fails otherwise); held requests' time to first token counts from
// their arrival, so none is shorter than without holding could explain.
func TestLateBinding(t *testing.T) {
	recs, ideal := smallTrace(t)
	for i := range recs {
		recs[i].Timestamp /= 8 // eight times the rate: the two replicas drown
	}
	base := config(t, "kvdir", 4000)
	base.Replicas = 2
	free, err := Run(context.Background(), recs, ideal, base)
	if err != nil {
		t.Fatal(err)
	}
	if free.Held != 0 || free.AdmissionRejected != 0 {
		t.Fatalf("without late binding: held %d, refused %d", free.Held, free.AdmissionRejected)
	}
	lb := base
	lb.LateBinding, lb.AdmissionQueue, lb.AdmissionMaxWait = true, 1<<20, time.Hour
	held, err := Run(context.Background(), recs, ideal, lb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held %d of %d; peak engine queue %d (without: %d); TTFT p99 %.0f ms (without: %.0f)",
		held.Held, len(recs), held.MaxPeakQueue, free.MaxPeakQueue, held.TTFTP99Ms, free.TTFTP99Ms)
	if held.Held == 0 {
		t.Fatal("late binding held no request of an overloaded run")
	}
	if held.Requests != len(recs) || held.Rejected != 0 {
		t.Fatalf("unbounded queue: %d served, %d rejected of %d", held.Requests, held.Rejected, len(recs))
	}
	// Holding moves the wait from the engines' queues to the router's: the
	// engines' queues stay short.
	if held.MaxPeakQueue >= free.MaxPeakQueue {
		t.Fatalf("peak engine queue %d with late binding, %d without", held.MaxPeakQueue, free.MaxPeakQueue)
	}

	// A tight bound refuses requests; they are counted, never lost.
	lb.AdmissionQueue, lb.AdmissionMaxWait = 2, 2*time.Second
	tight, err := Run(context.Background(), recs, ideal, lb)
	if err != nil {
		t.Fatal(err)
	}
	if tight.AdmissionRejected == 0 || tight.Rejected != tight.AdmissionRejected || tight.Requests+tight.Rejected != len(recs) {
		t.Fatalf("tight queue: %d served, %d rejected (%d by admission) of %d", tight.Requests, tight.Rejected, tight.AdmissionRejected, len(recs))
	}
}
