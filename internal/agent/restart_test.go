package agent

import (
	"testing"

	"github.com/kvdir/kvdir/internal/dirclient"
)

// TestWatchCounters checks the heartbeat's restart detection: a drop of the
// engine's cumulative prefix-cache counter signals a restart, tagged with
// the restart generation of the sample before the drop, so that the main
// loop ignores it when it already handled a restart (seen in the event
// sequence) in between.
func TestWatchCounters(t *testing.T) {
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	a, err := New(Config{WorkerID: "w", Endpoint: "tcp://127.0.0.1:1"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	signalled := func() (uint64, bool) {
		select {
		case g := <-a.counterReset:
			return g, true
		default:
			return 0, false
		}
	}
	for _, q := range []float64{0, 100, 100, 250} {
		a.watchCounters(q)
		if _, ok := signalled(); ok {
			t.Fatalf("counter at %v (not decreasing) signalled a restart", q)
		}
	}
	a.watchCounters(12)
	if g, ok := signalled(); !ok || g != a.restartGen.Load() {
		t.Fatalf("drop 250 -> 12: signalled %v with generation %d, want generation %d", ok, g, a.restartGen.Load())
	}
	// A restart handled from the event sequence between two samples makes
	// the next drop's signal stale.
	a.watchCounters(500)
	a.restartGen.Add(1)
	a.watchCounters(3)
	if g, ok := signalled(); !ok || g == a.restartGen.Load() {
		t.Fatalf("signal after a handled restart: %v, generation %d (current %d); want a stale generation", ok, g, a.restartGen.Load())
	}
}
