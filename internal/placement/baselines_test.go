package placement

import (
	"math"
	"testing"
)

// 1,024-token prompt in 16-token blocks: 64 request blocks.
var baseReq = Request{SessionKey: "s", PromptTokens: 1024, BlockSize: 16}

func TestLLMDWeightedSum(t *testing.T) {
	p := NewLLMD(Options{Seed: 1}, false)
	cands := workers(3)
	cands[0].MatchedBlocks, cands[0].Load = 32, Load{Waiting: 4, KVUsage: 0.5}
	cands[1].MatchedBlocks, cands[1].Load = 0, Load{Waiting: 0, KVUsage: 0.1}
	cands[2].MatchedBlocks, cands[2].Load = 64, Load{Waiting: 8, KVUsage: 0.9}
	// By hand, queue min 0 max 8:
	//   w0: 3·0.5 + 2·(8−4)/8 + 2·0.5 = 3.5
	//   w1: 3·0   + 2·1       + 2·0.9 = 3.8  ← load beats a full prefix hit
	//   w2: 3·1   + 2·0       + 2·0.1 = 3.2
	want := []float64{3.5, 3.8, 3.2}
	for i, s := range p.WeightedScores(baseReq, cands) {
		if math.Abs(s-want[i]) > 1e-9 {
			t.Errorf("score[%d] = %v, want %v", i, s, want[i])
		}
	}
	if d := mustPick(t, p, baseReq, cands); d.Index != 1 {
		t.Fatalf("picked %d, want 1", d.Index)
	}
	// w2 lightly loaded: queue max 4 (w0), min 0.
	//   w0: 1.5 + 0 + 1 = 2.5; w1: 0 + 2 + 1.8 = 3.8; w2: 3 + 2·0.5 + 2·0.7 = 5.4
	cands[2].Load = Load{Waiting: 2, KVUsage: 0.3}
	if d := mustPick(t, p, baseReq, cands); d.Index != 2 {
		t.Fatalf("picked %d, want 2 (5.4)", d.Index)
	}
	// Equal queues all score 1; equal everything ties at random.
	eq := workers(3)
	seen := map[int]bool{}
	for range 100 {
		seen[mustPick(t, p, baseReq, eq).Index] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties covered %v, want all 3", seen)
	}
}

func TestLLMDStickyUntilSaturated(t *testing.T) {
	p := mustNew(t, "llm-d-sticky", Options{Seed: 1})
	cands := workers(3)
	cands[1].MatchedBlocks = 64 // weighted winner
	if d := mustPick(t, p, baseReq, cands); d.Index != 1 {
		t.Fatalf("first pick %d, want 1", d.Index)
	}
	// The weighted sum now prefers w2, but w1 is at the thresholds, not past.
	cands[1].MatchedBlocks, cands[1].Load = 0, Load{Waiting: 5, KVUsage: 0.8}
	cands[2].MatchedBlocks = 64
	if d := mustPick(t, p, baseReq, cands); d.Index != 1 {
		t.Fatalf("unsaturated previous worker left: picked %d", d.Index)
	}
	// Another session has no previous worker: weighted choice.
	other := baseReq
	other.SessionKey = "t"
	if d := mustPick(t, p, other, cands); d.Index != 2 {
		t.Fatalf("new session: picked %d, want 2", d.Index)
	}
	// Past the queue threshold: moves to the weighted winner and stays there.
	cands[1].Load.Waiting = 6
	if d := mustPick(t, p, baseReq, cands); d.Index != 2 {
		t.Fatalf("saturated (queue): picked %d, want 2", d.Index)
	}
	cands[1].Load = Load{}
	cands[0].MatchedBlocks = 64
	cands[2].MatchedBlocks = 0
	if d := mustPick(t, p, baseReq, cands); d.Index != 2 {
		t.Fatalf("after the move: picked %d, want 2 (new previous)", d.Index)
	}
	// Past the KV threshold: moves.
	cands[2].Load.KVUsage = 0.81
	if d := mustPick(t, p, baseReq, cands); d.Index != 0 {
		t.Fatalf("saturated (KV): picked %d, want 0", d.Index)
	}
	// The plain policy keeps no memory.
	q := mustNew(t, "llm-d", Options{Seed: 1})
	cands[2].Load.KVUsage = 0
	if d := mustPick(t, q, baseReq, cands); d.Index != 0 {
		t.Fatalf("llm-d: picked %d, want 0", d.Index)
	}
}

func TestSGLangCacheAware(t *testing.T) {
	p := mustNew(t, "sglang", Options{Seed: 1})
	req := Request{PromptTokens: 1000, BlockSize: 16}
	cands := workers(2)
	// Balanced (diff 10 ≤ 32) and w0 matches 640/1000 = 0.64 > 0.5: w0, even
	// though it is busier.
	cands[0].MatchedBlocks, cands[0].Load.InFlight = 40, 10
	if d := mustPick(t, p, req, cands); d.Index != 0 {
		t.Fatalf("cache hit: picked %d, want 0", d.Index)
	}
	// Imbalanced: 40 − 5 = 35 > 32 and 40 > 5·1.0001 → shortest queue.
	cands[0].Load.InFlight, cands[1].Load.InFlight = 40, 5
	if d := mustPick(t, p, req, cands); d.Index != 1 {
		t.Fatalf("imbalanced: picked %d, want 1 (shortest queue)", d.Index)
	}
	// Diff exactly 32 is not imbalanced: back to the cache.
	cands[0].Load.InFlight, cands[1].Load.InFlight = 37, 5
	if d := mustPick(t, p, req, cands); d.Index != 0 {
		t.Fatalf("diff 32: picked %d, want 0", d.Index)
	}
}

func TestSGLangSmallestTree(t *testing.T) {
	p := mustNew(t, "sglang", Options{Seed: 1})
	cands := workers(2)
	// No match, empty trees: either; the chosen worker's tree grows by 1000.
	x := mustPick(t, p, Request{PromptTokens: 1000, BlockSize: 16}, cands).Index
	y := 1 - x
	// No match: the other, smaller tree (0 < 1000); it grows by 500.
	if d := mustPick(t, p, Request{PromptTokens: 500, BlockSize: 16}, cands); d.Index != y {
		t.Fatalf("second pick %d, want %d (smaller tree)", d.Index, y)
	}
	// x matches 320/1000 = 0.32 ≤ 0.5: still the smaller tree (500 < 1000).
	cands[x].MatchedBlocks = 20
	if d := mustPick(t, p, Request{PromptTokens: 1000, BlockSize: 16}, cands); d.Index != y {
		t.Fatalf("weak match: picked %d, want %d (smaller tree)", d.Index, y)
	}
	// Trees now x 1000, y 1500. y matching exactly 512/1024 = 0.5 is not above
	// the threshold: smallest tree, x. 528/1024 = 0.516 is: y.
	cands[x].MatchedBlocks = 0
	cands[y].MatchedBlocks = 32
	if d := mustPick(t, p, baseReq, cands); d.Index != x {
		t.Fatalf("match 0.5: picked %d, want %d (smaller tree)", d.Index, x)
	}
	cands[y].MatchedBlocks = 33
	if d := mustPick(t, p, baseReq, cands); d.Index != y {
		t.Fatalf("match 0.516: picked %d, want %d (cache)", d.Index, y)
	}
}

func TestDynamoCost(t *testing.T) {
	p := NewDynamo(Options{Seed: 1})
	cands := workers(2)
	// w0 holds 48 of 64 blocks: 1·(1024−768)/16 + (0 + 64) = 80;
	// w1 cold: 64 + 64 = 128.
	cands[0].MatchedBlocks = 48
	if l := p.Logit(baseReq, cands[0]); l != 80 {
		t.Fatalf("logit w0 = %v, want 80", l)
	}
	if d := mustPick(t, p, baseReq, cands); d.Index != 0 {
		t.Fatalf("picked %d, want 0 (overlap)", d.Index)
	}
	// Queued prefill on w0: (256+1024)/16 + 64 = 144 > 128.
	cands[0].Load.QueuedPrefillTokens = 1024
	if d := mustPick(t, p, baseReq, cands); d.Index != 1 {
		t.Fatalf("queued prefill: picked %d, want 1", d.Index)
	}
	// One running sequence of 4096 tokens adds 256 decode blocks: 16+256+64 = 336.
	cands[0].Load = Load{Running: 1}
	if d := mustPick(t, p, baseReq, cands); d.Index != 1 {
		t.Fatalf("decode load: picked %d, want 1", d.Index)
	}
	// With 512-token running contexts (32 blocks) the overlap wins again:
	// 16 + 32 + 64 = 112 < 128.
	q := NewDynamo(Options{Seed: 1, DecodeContext: 512})
	if d := mustPick(t, q, baseReq, cands); d.Index != 0 {
		t.Fatalf("short decode: picked %d, want 0", d.Index)
	}
	// Equal logits tie at random.
	seen := map[int]bool{}
	for range 100 {
		seen[mustPick(t, p, baseReq, workers(3)).Index] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties covered %v, want all 3", seen)
	}
	if _, err := p.Pick(Request{PromptTokens: 10}, workers(2)); err == nil {
		t.Fatal("block size 0 accepted")
	}
}
