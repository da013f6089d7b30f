package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/raftfsm"
)

// TestLeasesExpired checks the leader's lease clocks: a worker seen for the
// first time (or in a new epoch) starts its clock, one past its lease is
// returned, and one no longer listed is forgotten.
func TestLeasesExpired(t *testing.T) {
	l := newLeases()
	t0 := time.Unix(1000, 0)
	ws := []raftfsm.WorkerEpoch{{ID: "a", Epoch: 1}, {ID: "b", Epoch: 1}}
	if got := l.expired(ws, time.Second, t0); len(got) != 0 {
		t.Fatalf("first sight expired %v", got)
	}
	l.renew("a", 1, nil, t0.Add(time.Second))
	got := l.expired(ws, time.Second, t0.Add(1500*time.Millisecond))
	if len(got) != 1 || got[0].ID != "b" {
		t.Fatalf("expired %v, want [b]", got)
	}
	// b registered again: a new clock, not expired.
	ws[1].Epoch = 2
	if got := l.expired(ws, time.Second, t0.Add(1600*time.Millisecond)); len(got) != 0 {
		t.Fatalf("new epoch expired %v", got)
	}
	// a is gone: forgotten.
	if got := l.expired(ws[1:], time.Second, t0.Add(1700*time.Millisecond)); len(got) != 0 {
		t.Fatalf("expired %v", got)
	}
	if _, ok := l.entries["a"]; ok || len(l.entries) != 1 {
		t.Fatalf("entries %v, want only b", l.entries)
	}
}

// TestLeasesExpiredAllocatesNothingPerKnownWorker checks that a tick over
// many known, live workers allocates nothing: the leader runs it four
// times a second over every worker.
func TestLeasesExpiredAllocatesNothingPerKnownWorker(t *testing.T) {
	l := newLeases()
	now := time.Unix(1000, 0)
	ws := make([]raftfsm.WorkerEpoch, 1024)
	for i := range ws {
		ws[i] = raftfsm.WorkerEpoch{ID: fmt.Sprintf("w%d", i), Epoch: 1}
	}
	l.expired(ws, time.Minute, now)
	if a := testing.AllocsPerRun(20, func() { l.expired(ws, time.Minute, now) }); a != 0 {
		t.Fatalf("%v allocations per tick over %d known workers, want 0", a, len(ws))
	}
}
