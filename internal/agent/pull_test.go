package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// fakeTRT is a TensorRT-LLM pull endpoint: each POST /kv_cache_events
// drains the queued events (JSON objects) as one array; while fail > 0 it
// answers 503 instead and counts down.
type fakeTRT struct {
	mu     sync.Mutex
	queue  []string
	fail   int
	failed int
	srv    *httptest.Server
}

func newFakeTRT(t *testing.T) *fakeTRT {
	f := &fakeTRT{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/kv_cache_events" {
			http.Error(w, "no route", http.StatusNotFound)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.fail > 0 {
			f.fail--
			f.failed++
			http.Error(w, "engine busy", http.StatusServiceUnavailable)
			return
		}
		body := "[" + strings.Join(f.queue, ",") + "]"
		f.queue = nil
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeTRT) push(evs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue = append(f.queue, evs...)
}

func (f *fakeTRT) failNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = n
}

func (f *fakeTRT) failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// trtCreated and trtStored write events as trtllm-serve does (block size
// 4; the block hashes are the given ones, the tokens derived from them).
func trtCreated(id int) string {
	return fmt.Sprintf(`{"event_id":%d,"data":{"type":"created","num_blocks_per_cache_level":[100,0]},"window_size":64}`, id)
}

func trtStored(id int, parent string, hashes ...int) string {
	var blocks []string
	for _, h := range hashes {
		var toks []string
		for i := range 4 {
			toks = append(toks, fmt.Sprintf(`{"type":"unique_token","token_id":%d,"token_extra_id":0}`, h*10+i))
		}
		blocks = append(blocks, fmt.Sprintf(`{"type":"stored_block","block_hash":%d,"tokens":[%s],"cache_level":0,"priority":35}`, h, strings.Join(toks, ",")))
	}
	return fmt.Sprintf(`{"event_id":%d,"data":{"type":"stored","parent_hash":%s,"blocks":[%s]},"window_size":64}`, id, parent, strings.Join(blocks, ","))
}

// pullRig is a one-node directory and an agent polling a fakeTRT.
type pullRig struct {
	t     *testing.T
	node  *node.Node
	eng   *fakeTRT
	agent *Agent
}

func newPullRig(t *testing.T) *pullRig {
	r := &pullRig{t: t, node: dirtest.New(t, 1, nil).Nodes()[0], eng: newFakeTRT(t)}
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{r.node.APIAddr()}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	a, err := New(Config{
		WorkerID: itWorker, WorkerAddress: "http://127.0.0.1:1", Model: itModel, BlockSize: 4,
		PullURL: r.eng.srv.URL + "/kv_cache_events", PullInterval: 5 * time.Millisecond,
		BatchInterval: 5 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond, Logger: testkit.Logger(t),
	}, dir)
	if err != nil {
		t.Fatal(err)
	}
	r.agent = a
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
	return r
}

// waitBlocks waits until the directory holds n blocks of the worker.
func (r *pullRig) waitBlocks(n uint64) {
	r.t.Helper()
	testkit.Eventually(r.t, 10*time.Second, fmt.Sprintf("the directory to hold %d blocks", n), func() (bool, string) {
		w, ok := r.node.FSM().Worker(itWorker)
		if !ok {
			return false, "worker unknown"
		}
		return w.GetBlocks() == n, fmt.Sprintf("%d blocks", w.GetBlocks())
	})
}

func TestPullGapClearsAndRebuilds(t *testing.T) {
	r := newPullRig(t)
	r.eng.push(trtCreated(0), trtStored(1, "null", 11, 12), trtStored(2, "12", 13))
	r.waitBlocks(3)
	epoch := r.agent.Epoch()
	// Event 3 was lost (drained by another reader): the worker is cleared
	// and rebuilt from event 4 on, a new chain.
	r.eng.push(trtStored(4, "null", 21, 22))
	r.waitBlocks(2)
	if g := value(r.agent.m.gaps); g != 1 {
		t.Fatalf("gaps %v, want 1", g)
	}
	if n := value(r.agent.m.resyncs.WithLabelValues("pull_gap")); n != 1 {
		t.Fatalf("pull_gap resyncs %v, want 1", n)
	}
	if r.agent.Epoch() != epoch {
		t.Fatalf("a gap re-registered the worker (epoch %d -> %d)", epoch, r.agent.Epoch())
	}
	// Consecutive again: nothing more is cleared.
	r.eng.push(trtStored(5, "22", 23, 24), `{"event_id":6,"data":{"type":"removed","block_hashes":[24]},"window_size":64}`)
	r.waitBlocks(3)
	if g := value(r.agent.m.gaps); g != 1 {
		t.Fatalf("gaps %v after consecutive events, want 1", g)
	}
}

func TestPullRestartReregisters(t *testing.T) {
	r := newPullRig(t)
	r.eng.push(trtCreated(0), trtStored(1, "null", 11, 12, 13))
	r.waitBlocks(3)
	epoch := r.agent.Epoch()
	// A new engine counts from 0 again.
	r.eng.push(trtCreated(0), trtStored(1, "null", 31))
	r.waitBlocks(1)
	if r.agent.Epoch() == epoch {
		t.Fatal("an engine restart kept the epoch")
	}
	if n := value(r.agent.m.restarts); n != 1 {
		t.Fatalf("restarts %v, want 1", n)
	}
}

func TestPullStartsLate(t *testing.T) {
	r := newPullRig(t)
	// The engine's first events were read before the agent's first pull.
	r.eng.push(trtStored(7, "null", 41, 42))
	r.waitBlocks(2)
	if n := value(r.agent.m.resyncs.WithLabelValues("pull_start")); n != 1 {
		t.Fatalf("pull_start resyncs %v, want 1", n)
	}
}

func TestPullErrorsBackOffHeartbeatsGoOn(t *testing.T) {
	r := newPullRig(t)
	r.eng.push(trtCreated(0), trtStored(1, "null", 11))
	r.waitBlocks(1)
	beats := value(r.agent.m.heartbeats.WithLabelValues("ok"))
	r.eng.failNext(4)
	testkit.Eventually(t, 10*time.Second, "4 failed pulls and heartbeats meanwhile", func() (bool, string) {
		errs := value(r.agent.pull.pulls.WithLabelValues("error"))
		hb := value(r.agent.m.heartbeats.WithLabelValues("ok"))
		return errs >= 4 && hb > beats+1, fmt.Sprintf("%v pull errors, %v heartbeats since", errs, hb-beats)
	})
	if f := r.eng.failures(); f != 4 {
		t.Fatalf("engine answered %d errors, want 4", f)
	}
	// Events queued while failing arrive once the endpoint answers.
	r.eng.push(trtStored(2, "11", 12, 13))
	r.waitBlocks(3)
	if g := value(r.agent.m.gaps); g != 0 {
		t.Fatalf("errors caused %v gaps", g)
	}
}

func TestPullConfigValidation(t *testing.T) {
	base := Config{WorkerID: "w", PullURL: "http://e:8000/kv_cache_events"}
	if err := base.Validate(); err != nil {
		t.Fatalf("pull config: %v", err)
	}
	for name, c := range map[string]Config{
		"both":     {WorkerID: "w", PullURL: base.PullURL, Endpoint: "tcp://e:5557"},
		"neither":  {WorkerID: "w"},
		"scheme":   {WorkerID: "w", PullURL: "tcp://e:5557"},
		"replay":   {WorkerID: "w", PullURL: base.PullURL, ReplayEndpoint: "tcp://e:5558"},
		"interval": {WorkerID: "w", PullURL: base.PullURL, PullInterval: -time.Second},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
