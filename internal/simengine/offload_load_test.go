package simengine

import (
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// evictToTier runs each prompt once, then a filler that evicts them all
// from the GPU onto the tier, on an engine of capacity blocks of 16 tokens.
func evictToTier(t *testing.T, prof costmodel.Profile, medium string, capacity int, prompts ...[]uint32) *Engine {
	t.Helper()
	e := mustEngine(t, Config{Profile: prof, BlockSize: 16, CapacityBlocks: capacity, OffloadMedium: medium, OffloadBlocks: 64}, nil)
	for i, p := range prompts {
		mustSubmit(t, e, e.Now(), Request{ID: "warm" + string(rune('a'+i)), Tokens: p, MaxTokens: 1})
		drain(t, e, e.Now())
	}
	mustSubmit(t, e, e.Now(), Request{ID: "filler", Tokens: seqTokens(capacity*16, 50000), MaxTokens: 1})
	drain(t, e, e.Now())
	if e.OffloadedBlocks() == 0 {
		t.Fatal("nothing on the tier")
	}
	return e
}

// A prefix on the offload tier costs its copy before the prefill starts:
// TTFT is the copy (bytes over the link) plus the prefill of the rest.
func TestOffloadLoadTakesTransferTime(t *testing.T) {
	for _, c := range []struct {
		medium string
		tier   costmodel.Tier
	}{{"CPU", costmodel.TierHost}, {"Disk", costmodel.TierDisk}} {
		t.Run(c.medium, func(t *testing.T) {
			prof := mustProfile(t, "llama3-70b") // loading from disk beats recomputing too
			a := seqTokens(256, 1)
			e := evictToTier(t, prof, c.medium, 24, a)
			now := e.Now()
			mustSubmit(t, e, now, Request{ID: "again", Tokens: a, MaxTokens: 2})
			r := drain(t, e, now)["again"]
			const hit = 240 // 15 of the 16 blocks: the last token is computed
			if r.CachedTokens != hit {
				t.Fatalf("cached %d, want %d", r.CachedTokens, hit)
			}
			copyDur := costmodel.MillisToDuration(prof.TransferMillis(hit, c.tier))
			want := copyDur + costmodel.MillisToDuration(prof.Prefill.Millis(16, hit))
			if got := r.TTFT(); got != want {
				t.Fatalf("TTFT %v, want the copy %v plus the prefill: %v", got, copyDur, want)
			}
		})
	}
}

// When the copy is slower than recomputing, the engine recomputes.
func TestOffloadSlowLinkRecomputes(t *testing.T) {
	prof := mustProfile(t, "llama3-8b")
	prof.HostToGPUGBps = 0.01
	a := seqTokens(256, 1)
	e := evictToTier(t, prof, "CPU", 24, a)
	now := e.Now()
	mustSubmit(t, e, now, Request{ID: "again", Tokens: a, MaxTokens: 2})
	r := drain(t, e, now)["again"]
	if want := costmodel.MillisToDuration(prof.Prefill.Millis(256, 0)); r.CachedTokens != 0 || r.TTFT() != want {
		t.Fatalf("cached %d, TTFT %v; want a cold prefill of %v", r.CachedTokens, r.TTFT(), want)
	}
}

// Copies share the tier's link: the second waits for the first. A request
// with nothing to load runs meanwhile.
func TestOffloadLoadsQueueOnTheLink(t *testing.T) {
	prof := mustProfile(t, "llama3-70b")
	prof.HostToGPUGBps = 5 // a copy of 240 tokens takes 15.7 ms, the cold prefill 12.4
	a, b := seqTokens(256, 1), seqTokens(256, 1000)
	e := evictToTier(t, prof, "CPU", 40, a, b)
	now := e.Now()
	mustSubmit(t, e, now, Request{ID: "a", Tokens: a, MaxTokens: 2})
	mustSubmit(t, e, now, Request{ID: "b", Tokens: b, MaxTokens: 2})
	mustSubmit(t, e, now, Request{ID: "cold", Tokens: seqTokens(32, 9000), MaxTokens: 2})
	res := drain(t, e, now)
	copyDur := costmodel.MillisToDuration(prof.TransferMillis(240, costmodel.TierHost))
	if res["a"].CachedTokens != 240 || res["b"].CachedTokens != 240 {
		t.Fatalf("cached %d and %d, want 240 each", res["a"].CachedTokens, res["b"].CachedTokens)
	}
	if res["a"].TTFT() < copyDur || res["b"].TTFT() < 2*copyDur {
		t.Fatalf("TTFT a %v, b %v; want at least one and two copies of %v", res["a"].TTFT(), res["b"].TTFT(), copyDur)
	}
	if cold := res["cold"].TTFT(); cold >= copyDur {
		t.Fatalf("the request without a load waited %v for the copies (%v each)", cold, copyDur)
	}
	if err := checkRefs(e); err != nil {
		t.Fatal(err)
	}
}
