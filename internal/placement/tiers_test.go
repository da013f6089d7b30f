package placement

import (
	"math"
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

func TestTierSplit(t *testing.T) {
	for _, c := range []struct{ matched, gpu, fast, host, disk int }{
		{10, 10, 10, 0, 0}, // all on the GPU
		{10, 4, 10, 6, 0},  // GPU run, then host memory
		{10, 4, 7, 3, 3},   // GPU, host, then disk beyond the GPU-or-host run
		{10, 0, 0, 0, 10},  // disk (or remote) only
		{10, 6, 3, 0, 4},   // a lower bound of fast inside the GPU run
		{10, 12, 12, 0, 0}, // runs longer than the match are capped
		{0, 0, 0, 0, 0},
	} {
		h, d := TierSplit(c.matched, c.gpu, c.fast)
		if h != c.host || d != c.disk {
			t.Errorf("TierSplit(%d, %d, %d) = %d, %d; want %d, %d", c.matched, c.gpu, c.fast, h, d, c.host, c.disk)
		}
	}
}

// tierScores scores cands with kvdir under prof and returns the decision.
func tierPick(t *testing.T, prof costmodel.Profile, req Request, cands ...Candidate) Decision {
	t.Helper()
	p, err := NewKVDir(Options{Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The seed document's turn 2 (5,100 tokens, 306 blocks of 16 matched) with
// the match offloaded to host memory: loading 4,896 tokens over the host
// link (12.8 ms at 50 GB/s) beats recomputing them (~118 ms), so the
// offloaded worker wins over a cold one, and the load shows in the score.
func TestKVDirPrefersHostTierOverRecompute(t *testing.T) {
	prof := llama8b(t)
	req := Request{PromptTokens: 5100, BlockSize: 16}
	d := tierPick(t, prof, req,
		Candidate{Worker: "cold"},
		Candidate{Worker: "host", MatchedBlocks: 306, HostBlocks: 306})
	if d.Worker != "host" || d.PredictedCachedTokens != 4896 {
		t.Fatalf("picked %s with %d cached, want host with 4896", d.Worker, d.PredictedCachedTokens)
	}
	s := d.Scores[1]
	transfer := prof.TransferMillis(4896, costmodel.TierHost)
	if math.Abs(s.TransferMs-transfer) > 1e-9 || s.LoadedTokens != 4896 ||
		math.Abs(s.PrefillMs-prof.Prefill.Millis(204, 4896)) > 1e-9 || math.Abs(s.TotalMs-s.PrefillMs-transfer) > 1e-9 {
		t.Fatalf("host score %+v, want transfer %.2f ms before the prefill", s, transfer)
	}
	if cold := d.Scores[0]; cold.TransferMs != 0 || cold.PrefillMs != cold.ColdPrefillMs {
		t.Fatalf("cold score %+v", cold)
	}
}

// At equal load, a GPU-held prefix beats the same prefix in host memory
// (no load), and counting the offloaded blocks as GPU-held would make them
// a tie.
func TestKVDirPrefersGPUOverHostTier(t *testing.T) {
	prof := llama8b(t)
	req := Request{PromptTokens: 5100, BlockSize: 16}
	load := Load{Running: 4, Waiting: 1, QueuedPrefillTokens: 2000}
	for seed := range int64(20) {
		p, err := NewKVDir(Options{Profile: prof, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.Pick(req, []Candidate{
			{Worker: "host", MatchedBlocks: 306, HostBlocks: 306, Load: load},
			{Worker: "gpu", MatchedBlocks: 306, Load: load},
		})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker != "gpu" {
			t.Fatalf("seed %d: picked %s (scores %+v), want gpu", seed, d.Worker, d.Scores)
		}
		if d.Scores[0].TotalMs <= d.Scores[1].TotalMs*1.05 {
			t.Fatalf("host tier costs %.2f ms, GPU %.2f: want the load to show", d.Scores[0].TotalMs, d.Scores[1].TotalMs)
		}
	}
}

// When loading costs more than recomputing, the score recomputes: a slow
// disk link makes disk-held blocks worth nothing, and the host-held part
// before them is still loaded.
func TestKVDirRecomputesWhenTransferIsSlower(t *testing.T) {
	prof := llama8b(t)
	prof.DiskToGPUGBps = 0.5 // 262 µs per token against ~24 µs to recompute one
	p, err := NewKVDir(Options{Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptTokens: 5100, BlockSize: 16}
	cold := prof.Prefill.Millis(5100, 0)

	s := p.Score(req, Candidate{Worker: "disk", MatchedBlocks: 306, DiskBlocks: 306})
	if s.CachedTokens != 0 || s.LoadedTokens != 0 || s.TransferMs != 0 || s.PrefillMs != cold || s.MatchedTokens != 4896 {
		t.Fatalf("disk-only score %+v, want a cold prefill of %.1f ms", s, cold)
	}
	if load := prof.TransferMillis(4896, costmodel.TierDisk); load <= cold {
		t.Fatalf("test premise: disk load %.1f ms, cold prefill %.1f", load, cold)
	}

	s = p.Score(req, Candidate{Worker: "mixed", MatchedBlocks: 306, HostBlocks: 100, DiskBlocks: 106})
	want := prof.Prefill.Millis(5100-3200, 3200) + prof.TransferMillis(1600, costmodel.TierHost)
	if s.CachedTokens != 3200 || s.LoadedTokens != 1600 || math.Abs(s.PrefillMs+s.TransferMs-want) > 1e-9 {
		t.Fatalf("mixed score %+v, want GPU and host (3200 cached, 1600 loaded) at %.2f ms", s, want)
	}

	// With the default disk link, the same disk blocks are worth loading.
	prof.DiskToGPUGBps = 0
	p, _ = NewKVDir(Options{Profile: prof})
	if s := p.Score(req, Candidate{Worker: "disk", MatchedBlocks: 306, DiskBlocks: 306}); s.CachedTokens != 4896 || s.PrefillMs+s.TransferMs >= cold {
		t.Fatalf("default disk link: %+v", s)
	}
}

// Retain discounts the match from its end: the expected lost tokens come
// off the slowest tier first.
func TestKVDirTierRetainFromTheEnd(t *testing.T) {
	prof := llama8b(t)
	p, _ := NewKVDir(Options{Profile: prof})
	req := Request{PromptTokens: 5100, BlockSize: 16}
	s := p.Score(req, Candidate{Worker: "a", MatchedBlocks: 306, HostBlocks: 100, Load: Load{KVUsage: 1}})
	// 4,896 matched, half expected: 2,448, all within the 206 GPU blocks.
	if s.CachedTokens != 2448 || s.LoadedTokens != 0 || s.TransferMs != 0 {
		t.Fatalf("score %+v, want 2448 GPU tokens and no load", s)
	}
}

func TestTierBlocksValidated(t *testing.T) {
	p, _ := NewKVDir(Options{})
	req := Request{PromptTokens: 100, BlockSize: 16}
	for _, c := range []Candidate{
		{Worker: "a", MatchedBlocks: 2, HostBlocks: 2, DiskBlocks: 1},
		{Worker: "a", MatchedBlocks: 2, HostBlocks: -1},
	} {
		if _, err := p.Pick(req, []Candidate{c}); err == nil {
			t.Errorf("candidate %+v accepted", c)
		}
	}
}

// The baselines see MatchedBlocks only: the split changes nothing for them.
func TestBaselinesIgnoreTiers(t *testing.T) {
	req := Request{PromptTokens: 5100, BlockSize: 16}
	dyn := NewDynamo(Options{})
	plain := Candidate{Worker: "a", MatchedBlocks: 306, Load: Load{Running: 3}}
	tiered := plain
	tiered.HostBlocks, tiered.DiskBlocks = 100, 100
	if dyn.Logit(req, plain) != dyn.Logit(req, tiered) {
		t.Fatalf("dynamo logit changed with the tier split")
	}
	for _, name := range []string{"prefix", "llm-d", "sglang"} {
		pol, err := New(name, Options{})
		if err != nil {
			t.Fatal(err)
		}
		d, err := pol.Pick(req, []Candidate{{Worker: "gpu", MatchedBlocks: 200}, tiered})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker != "a" {
			t.Errorf("%s picked %s, want the longer (offloaded) match", name, d.Worker)
		}
	}
}

// The load delays the request, not the requests queued behind it: the
// extra term charges only the computation.
func TestKVDirTransferNotInExtra(t *testing.T) {
	prof := llama8b(t)
	p, _ := NewKVDir(Options{Profile: prof})
	req := Request{PromptTokens: 5100, BlockSize: 16}
	busy := Load{Waiting: 4}
	d, err := p.Pick(req, []Candidate{
		{Worker: "gpu", MatchedBlocks: 306, Load: busy},
		{Worker: "host", MatchedBlocks: 306, HostBlocks: 306, Load: busy},
	})
	if err != nil {
		t.Fatal(err)
	}
	if h := d.Scores[1]; h.ExtraMs != 0 || math.Abs(h.TotalMs-d.Scores[0].TotalMs-h.TransferMs) > 1e-9 {
		t.Fatalf("host %+v against gpu %+v: want only the transfer between them", h, d.Scores[0])
	}
}
