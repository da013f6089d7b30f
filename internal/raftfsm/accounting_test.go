package raftfsm_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// predictedSess is a session record with the router's prediction.
func predictedSess(id, worker string, predicted, cached uint32) *kvdirv1.SessionRecord {
	r := sess(id, worker, 7)
	r.CachedTokens = cached
	r.PredictedCachedTokens = proto.Uint32(predicted)
	return r
}

func TestSessionRecordsFeedCacheAccounting(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	e := h.register("w")
	// Before the directory holds blocks of w, an unpredicted hit is not
	// held against it.
	h.record(100, predictedSess("s0", "w", 0, 32))
	h.publish1(batch("w", e, 1, 1, stored(0, kvdirv1.Medium_MEDIUM_GPU, 11, 12, 13)), kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED)
	for i := range cachecheck.MinTurns {
		h.record(200, predictedSess(fmt.Sprint("s", i+1), "w", 0, 32))
	}
	h.record(300, sess("old-router", "w", 9)) // no prediction: not counted
	h.record(300, predictedSess("gone", "nobody", 0, 32))
	acc := mustWorker(t, h.f, "w").GetCacheAccounting()
	want := &kvdirv1.CacheAccounting{Turns: cachecheck.MinTurns + 1, HitTurns: cachecheck.MinTurns + 1,
		UnpredictedHits: cachecheck.MinTurns, ReportedTokens: 32 * (cachecheck.MinTurns + 1), LastBlockSize: 16}
	if !proto.Equal(acc, want) {
		t.Fatalf("accounting %v, want %v", acc, want)
	}
	if k := cachecheck.Evaluate(acc); k != cachecheck.KindUnmatched {
		t.Fatalf("Evaluate = %q, want %q", k, cachecheck.KindUnmatched)
	}

	// Snapshot and restore carry it, and the replica is identical.
	snap := snapshotBytes(t, h.f)
	g := raftfsm.New(raftfsm.Options{Logger: discardLogger})
	if err := restore(g, snap); err != nil {
		t.Fatal(err)
	}
	if got := mustWorker(t, g, "w").GetCacheAccounting(); !proto.Equal(got, want) {
		t.Fatalf("restored accounting %v, want %v", got, want)
	}
	if g.Digest() != h.f.Digest() {
		t.Fatalf("restored digest %x, original %x", g.Digest(), h.f.Digest())
	}

	// The state digest covers it.
	d := h.f.Digest()
	h.record(400, predictedSess("s1", "w", 32, 32))
	if h.f.Digest() == d {
		t.Fatalf("digest unchanged after the accounting changed")
	}

	// A new registration starts over.
	h.register("w")
	if acc := mustWorker(t, h.f, "w").GetCacheAccounting(); acc != nil {
		t.Fatalf("accounting after re-registration %v, want none", acc)
	}
}

func TestCacheAccountingDecaysDeterministically(t *testing.T) {
	a, b := newHarness(t, raftfsm.Options{}), newHarness(t, raftfsm.Options{})
	for _, h := range []*harness{a, b} {
		h.register("w")
		for i := range 5 * cachecheck.Window {
			h.record(int64(1000+i), predictedSess(fmt.Sprint("s", i%7), "w", 48, uint32(48*(i%2))))
		}
	}
	acc := mustWorker(t, a.f, "w").GetCacheAccounting()
	if acc.Turns >= 2*cachecheck.Window || acc.Turns < cachecheck.Window {
		t.Fatalf("turns %d, want within [%d, %d)", acc.Turns, cachecheck.Window, 2*cachecheck.Window)
	}
	if !proto.Equal(acc, mustWorker(t, b.f, "w").GetCacheAccounting()) || a.f.Digest() != b.f.Digest() {
		t.Fatalf("two replicas of one log differ: %v vs %v", acc, mustWorker(t, b.f, "w").GetCacheAccounting())
	}
}
