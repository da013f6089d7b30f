package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// When the engine's metrics endpoint stops answering, the agent
// deregisters the worker and stops heartbeating; when it answers again,
// the agent registers a new epoch. An endpoint that answers with an error
// status is an engine that is up.
func TestEngineGoneAndBack(t *testing.T) {
	nodes := dirtest.New(t, 1, nil).Nodes()
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{nodes[0].APIAddr()}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	var mode atomic.Int32 // 0 up, 1 no answer, 2 answers 500
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		switch mode.Load() {
		case 1:
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = c.Close() // no HTTP answer at all
			}
		case 2:
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			fmt.Fprintln(w, "vllm:num_requests_running 0\nvllm:prefix_cache_queries_total 0")
		}
	}))
	t.Cleanup(metrics.Close)
	a, err := New(Config{
		WorkerID: itWorker, WorkerAddress: "http://127.0.0.1:1", Model: itModel, BlockSize: itBS,
		Endpoint: "inproc://agent-engine-gone", Logger: testkit.Logger(t),
		HeartbeatInterval: 50 * time.Millisecond, EngineDownAfter: 300 * time.Millisecond,
		MetricsURL: metrics.URL + "/metrics",
	}, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent run: %v", err)
		}
	})
	testkit.Eventually(t, 10*time.Second, "the agent to register", func() (bool, string) { return a.Epoch() != 0, "" })
	first := a.Epoch()
	worker := func() *kvdirv1.Worker {
		w, _ := nodes[0].FSM().Worker(itWorker)
		return w
	}

	mode.Store(2) // a 500 is an answer: the worker stays
	// Twice EngineDownAfter: long enough for the rule to fire if it did.
	time.Sleep(600 * time.Millisecond)
	if w := worker(); w.GetState() != kvdirv1.WorkerState_WORKER_STATE_ACTIVE || a.Epoch() != first {
		t.Fatalf("an engine answering 500 was taken out: %v", w)
	}

	mode.Store(1)
	testkit.Eventually(t, 5*time.Second, "the worker deregistered", func() (bool, string) {
		w := worker()
		return w.GetState() == kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED, fmt.Sprint(w.GetState())
	})
	if a.Healthy() {
		t.Error("healthy while the engine is gone")
	}
	if v := metricValue(t, a, "kvdir_agent_engine_down_total", ""); v != 1 {
		t.Errorf("kvdir_agent_engine_down_total %v, want 1", v)
	}

	mode.Store(0)
	testkit.Eventually(t, 5*time.Second, "the worker registered again", func() (bool, string) {
		w := worker()
		return w.GetState() == kvdirv1.WorkerState_WORKER_STATE_ACTIVE && w.GetEpoch() > first && a.Healthy(),
			fmt.Sprint(w.GetState(), w.GetEpoch())
	})
}
