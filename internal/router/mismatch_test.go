package router

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// fakeWorkers answers GetWorker from a fixed record.
type fakeWorkers struct {
	w   *kvdirv1.Worker
	err error
}

func (f *fakeWorkers) GetWorker(context.Context, string, uint32) (*kvdirv1.GetWorkerResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &kvdirv1.GetWorkerResponse{Worker: f.w}, nil
}

func newTestChecker(t *testing.T, dir workerGetter) (*mismatchChecker, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	c := newMismatchChecker(prometheus.NewRegistry(), dir, context.Background,
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	return c, &logs
}

func registered(model string, bs uint32, blocks uint64) *fakeWorkers {
	return &fakeWorkers{w: &kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "w0", Model: model, BlockSize: bs}, Blocks: blocks}}
}

// waitRegistration waits until the checker has read w0's directory record.
func waitRegistration(t *testing.T, c *mismatchChecker) {
	t.Helper()
	c.observe("w0", windowTurn{Turn: cachecheck.Turn{BlockSize: 16}, model: "m"}, 0) // a cold turn starts the read
	testkit.Eventually(t, 5*time.Second, "the checker to read the worker's record", func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		st := c.byID["w0"]
		return st != nil && st.reg.known, "not read yet"
	})
}

// value reads one series of a collector (0 if absent).
func value(t *testing.T, col prometheus.Collector, cause cachecheck.Cause) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 16)
	col.Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["worker"] == "w0" && labels["cause"] == string(cause) {
			return pb.GetGauge().GetValue() + pb.GetCounter().GetValue()
		}
	}
	return 0
}

// series counts a collector's series.
func series(col prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 16)
	col.Collect(ch)
	close(ch)
	n := 0
	for range ch {
		n++
	}
	return n
}

func TestMismatchCheckerNamesModelName(t *testing.T) {
	c, logs := newTestChecker(t, registered("llama3-8b-instruct", 16, 40))
	waitRegistration(t, c)
	miss := windowTurn{Turn: cachecheck.Turn{Predicted: 0, Reported: 64, BlockSize: 16}, model: "llama3-8b"}
	for range cachecheck.MinTurns + 3 {
		c.observe("w0", windowTurn{Turn: cachecheck.Turn{BlockSize: 16}, model: "llama3-8b"}, 0)
		c.observe("w0", miss, 0)
	}
	st := c.state("w0")
	if st == nil || st.Condition != string(cachecheck.KindUnmatched) || st.Cause != string(cachecheck.CauseModelName) {
		t.Fatalf("state %+v, want unmatched events caused by the model name", st)
	}
	if g := value(t, c.gauge, cachecheck.CauseModelName); g != 1 {
		t.Fatalf("kvdir_router_cache_mismatch{cause=model name} = %v, want 1", g)
	}
	if n := value(t, c.flagged, cachecheck.CauseModelName); n != 1 {
		t.Fatalf("flagged transitions = %v, want 1", n)
	}
	out := logs.String()
	if strings.Count(out, "router: cache mismatch:") != 1 || !strings.Contains(out, `likely_cause="model name"`) ||
		!strings.Contains(out, "registered_model=llama3-8b-instruct") {
		t.Fatalf("want one warning naming the model name, got:\n%s", out)
	}

	// Fixed: predictions come back, the flag clears once, with an info line.
	for range cachecheck.Window {
		c.observe("w0", windowTurn{Turn: cachecheck.Turn{Predicted: 64, Reported: 64, BlockSize: 16}, model: "llama3-8b"}, 4)
	}
	if st := c.state("w0"); st != nil {
		t.Fatalf("still flagged after a window of good turns: %+v", st)
	}
	if n := series(c.gauge); n != 0 {
		t.Fatalf("%d kvdir_router_cache_mismatch series after clearing, want 0", n)
	}
	if out := logs.String(); strings.Count(out, "cache mismatch cleared") != 1 {
		t.Fatalf("want one clearing line, got:\n%s", out)
	}
}

func TestMismatchCheckerCauses(t *testing.T) {
	for _, c := range []struct {
		name string
		dir  *fakeWorkers
		turn windowTurn
		want cachecheck.Cause
	}{
		{"block size", registered("m", 32, 40), windowTurn{Turn: cachecheck.Turn{Reported: 64, BlockSize: 16}, model: "m"}, cachecheck.CauseBlockSize},
		{"cache salt", registered("m", 16, 40), windowTurn{Turn: cachecheck.Turn{Reported: 64, BlockSize: 16, Salted: true}, model: "m"}, cachecheck.CauseCacheSalt},
		{"hash seed", registered("m", 16, 40), windowTurn{Turn: cachecheck.Turn{Reported: 64, BlockSize: 16}, model: "m"}, cachecheck.CauseHashSeed},
		{"over-predicted", registered("m", 16, 40), windowTurn{Turn: cachecheck.Turn{Predicted: 64, BlockSize: 16}, model: "m"}, cachecheck.CauseEvents},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch, _ := newTestChecker(t, c.dir)
			waitRegistration(t, ch)
			for range cachecheck.MinTurns {
				ch.observe("w0", c.turn, 0)
			}
			if st := ch.state("w0"); st == nil || st.Cause != string(c.want) {
				t.Fatalf("state %+v, want cause %q", st, c.want)
			}
			if g := value(t, ch.gauge, c.want); g != 1 {
				t.Fatalf("gauge %v, want 1", g)
			}
		})
	}
}

func TestMismatchCheckerHealthyAndCold(t *testing.T) {
	c, logs := newTestChecker(t, registered("m", 16, 40))
	waitRegistration(t, c)
	for i := range 5 * cachecheck.Window {
		c.observe("w0", windowTurn{Turn: cachecheck.Turn{BlockSize: 16}, model: "m"}, 0) // cold first turn
		good := windowTurn{Turn: cachecheck.Turn{Predicted: 96, Reported: 96, BlockSize: 16}, model: "m"}
		if i%10 == 0 {
			good.Predicted = 0 // events still in flight now and then
		}
		c.observe("w0", good, 6)
		if st := c.state("w0"); st != nil {
			t.Fatalf("turn %d: healthy worker flagged: %+v", i, st)
		}
	}
	if strings.Contains(logs.String(), "cache mismatch") {
		t.Fatalf("healthy worker logged a mismatch:\n%s", logs.String())
	}
}

func TestMismatchCheckerWithoutDirectoryRecord(t *testing.T) {
	// Unknown to the directory (a static worker without an agent): the
	// directory holds none of its blocks, so its hits are not mismatches.
	c, _ := newTestChecker(t, &fakeWorkers{err: errors.New("not found")})
	for range 3 * cachecheck.Window {
		c.observe("w0", windowTurn{Turn: cachecheck.Turn{Reported: 64, BlockSize: 16}, model: "m"}, 0)
	}
	if st := c.state("w0"); st != nil {
		t.Fatalf("flagged without any directory blocks: %+v", st)
	}
}
