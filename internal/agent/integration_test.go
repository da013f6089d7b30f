package agent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/raftfsm"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const (
	itModel  = "llama"
	itWorker = "w1"
	itBS     = 16
)

// oracle records every block the engine ever stored and computes its
// content hash directly from its prefix tokens.
type oracle struct {
	mu      sync.Mutex
	blocks  map[kvevents.Hash]oracleBlock // engine hash -> its one-block store
	content map[kvevents.Hash]uint64
	parent  map[uint64]uint64 // content hash -> parent content hash
	root    uint64
}

func newOracle(t *testing.T) *oracle {
	root, err := blockhash.Namespace{Model: itModel, BlockSize: itBS}.Root()
	if err != nil {
		t.Fatal(err)
	}
	return &oracle{blocks: map[kvevents.Hash]oracleBlock{}, content: map[kvevents.Hash]uint64{},
		parent: map[uint64]uint64{}, root: root}
}

// oracleBlock is one block of a BlockStored event.
type oracleBlock struct {
	parent    kvevents.Hash // valid if hasParent
	hasParent bool
	tokens    []uint32
}

func (o *oracle) record(b simengine.EventBatch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range b.Events {
		s, ok := ev.(*kvevents.BlockStored)
		if !ok {
			continue
		}
		var parent kvevents.Hash
		has := s.Parent != nil
		if has {
			parent = *s.Parent
		}
		for i, h := range s.BlockHashes {
			o.blocks[h] = oracleBlock{parent: parent, hasParent: has,
				tokens: s.TokenIDs[i*s.BlockSize : (i+1)*s.BlockSize]}
			parent, has = h, true
		}
	}
}

// contentOf hashes the block's whole prefix, from the namespace root.
func (o *oracle) contentOf(h kvevents.Hash) uint64 {
	if c, ok := o.content[h]; ok {
		return c
	}
	var path []kvevents.Hash
	for cur := h; ; {
		path = append(path, cur)
		b := o.blocks[cur]
		if !b.hasParent {
			break
		}
		cur = b.parent
	}
	p := o.root
	for i := len(path) - 1; i >= 0; i-- {
		c := blockhash.Block(p, o.blocks[path[i]].tokens, nil)
		o.content[path[i]] = c
		if i == len(path)-1 {
			o.parent[c] = 0
		} else {
			o.parent[c] = p
		}
		p = c
	}
	return p
}

// expected returns the content hashes of every block in the cache.
func (o *oracle) expected(e *simengine.Engine) map[uint64]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[uint64]bool{}
	for _, cb := range e.Cache().Contents() {
		out[o.contentOf(cb.Hash.Wire())] = true
	}
	return out
}

// compare checks the directory's view of the worker on fsm against want:
// the same number of blocks, and block by block the same set of blocks
// reachable from the root. With subset, the directory may hold fewer.
func (o *oracle) compare(fsm *raftfsm.FSM, want map[uint64]bool, subset bool) (bool, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w, ok := fsm.Worker(itWorker)
	if !ok {
		return false, "worker unknown"
	}
	if subset && int(w.Blocks) > len(want) || !subset && int(w.Blocks) != len(want) {
		return false, fmt.Sprintf("directory holds %d blocks, engine %d", w.Blocks, len(want))
	}
	got := map[uint64]bool{}
	for _, c := range fsm.WorkerChains(itWorker, 0) {
		h := c.Tail
		for range c.Depth {
			if !want[h] {
				return false, fmt.Sprintf("directory holds %x, engine does not", h)
			}
			got[h] = true
			h = o.parent[h]
		}
	}
	if subset {
		return true, ""
	}
	for h := range want {
		closed := true
		for p := h; p != 0; p = o.parent[p] {
			if !want[p] {
				closed = false
				break
			}
		}
		if closed && !got[h] {
			var chain []uint64
			for p := h; p != 0; p = o.parent[p] {
				chain = append([]uint64{p}, chain...)
			}
			m, _, err := fsm.Match(nil, chain)
			return false, fmt.Sprintf("engine holds %x (prefix-closed, depth %d), directory does not: match %+v %v; chains %d", h, len(chain), m, err, len(fsm.WorkerChains(itWorker, 0)))
		}
	}
	return true, ""
}

func toWire(b simengine.EventBatch) kvevents.Batch {
	return kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: b.Events}
}

// rig is an engine publishing over ZMQ, an agent and a directory.
type rig struct {
	t      *testing.T
	nodes  []*node.Node
	dir    *dirclient.Client
	pub    *kvevents.Publisher
	ep     string
	replay string
	or     *oracle
	eng    *simengine.Engine
	now    time.Duration
	rng    *rand.Rand
	hist   [][]uint32
	system []uint32
	seq    int

	agent  *Agent
	cancel context.CancelFunc
	done   chan error

	// The engine's /metrics, as the agent's heartbeats read it: the prefix
	// query counter, which starts again from zero when the engine restarts.
	queries atomic.Int64
	metrics *httptest.Server
}

func newRig(t *testing.T) *rig {
	r := &rig{t: t, nodes: dirtest.New(t, 3, nil).Nodes(), or: newOracle(t), rng: rand.New(rand.NewPCG(1, 2))}
	var addrs []string
	for _, n := range r.nodes {
		addrs = append(addrs, n.APIAddr())
	}
	dir, err := dirclient.New(dirclient.Config{Addrs: addrs, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	r.dir = dir
	pub, err := kvevents.NewPublisher(context.Background(), kvevents.PublisherConfig{
		Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 100000, Form: kvevents.FormArray,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r.pub = pub
	r.ep = fmt.Sprintf("tcp://127.0.0.1:%d", pub.Addr().(*net.TCPAddr).Port)
	r.replay = fmt.Sprintf("tcp://127.0.0.1:%d", pub.ReplayAddr().(*net.TCPAddr).Port)
	r.metrics = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running 0\nvllm:prefix_cache_queries_total %d\n", r.queries.Load())
	}))
	t.Cleanup(r.metrics.Close)
	r.newEngine()
	r.system = tokens(100, 1)
	return r
}

func (r *rig) newEngine() {
	prof, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		r.t.Fatal(err)
	}
	sink := simengine.SinkFunc(func(b simengine.EventBatch) {
		r.or.record(b)
		if _, err := r.pub.Publish(toWire(b)); err != nil {
			r.t.Errorf("publish: %v", err)
		}
	})
	e, err := simengine.New(simengine.Config{Profile: prof, BlockSize: itBS, CapacityBlocks: 300}, sink)
	if err != nil {
		r.t.Fatal(err)
	}
	r.eng, r.now, r.hist = e, 0, make([][]uint32, 6)
	r.queries.Store(0)
}

func (r *rig) startAgent() {
	ctx, cancel := context.WithCancel(context.Background())
	a, err := New(Config{
		WorkerID: itWorker, WorkerAddress: "http://127.0.0.1:1", Model: itModel, BlockSize: itBS,
		Endpoint: r.ep, ReplayEndpoint: r.replay, BatchInterval: 5 * time.Millisecond,
		MapCapacity: 100000, Logger: testkit.Logger(r.t), HeartbeatInterval: 200 * time.Millisecond,
		MetricsURL: r.metrics.URL + "/metrics",
	}, r.dir)
	if err != nil {
		r.t.Fatal(err)
	}
	r.agent, r.cancel, r.done = a, cancel, make(chan error, 1)
	go func() { r.done <- a.Run(ctx) }()
	r.t.Cleanup(r.stopAgent)
	testkit.Eventually(r.t, 10*time.Second, "the agent to register", func() (bool, string) { return a.Epoch() != 0, "" })
}

func (r *rig) stopAgent() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		r.t.Errorf("agent run: %v", err)
	}
	r.cancel = nil
}

// traffic runs waves of multi-turn requests: every session sends its
// history plus new tokens and keeps the answer.
func (r *rig) traffic(waves int) {
	for range waves {
		for s := range r.hist {
			h := r.hist[s]
			if len(h) == 0 || len(h) > 1200 {
				h = append(append([]uint32(nil), r.system...), uint32(1000+s))
			}
			for range 10 + r.rng.IntN(60) {
				h = append(h, uint32(r.rng.IntN(30000)))
			}
			r.hist[s] = h
			r.seq++
			if err := r.eng.Submit(r.now, simengine.Request{ID: fmt.Sprint(r.seq), Tokens: h, MaxTokens: 8 + r.rng.IntN(16)}); err != nil {
				r.t.Fatalf("submit: %v", err)
			}
		}
		for r.eng.Busy() {
			res := r.eng.Step(r.now)
			r.now = res.End
			for _, f := range res.Finished {
				_ = f // outputs are not appended: the next turn adds new user tokens
			}
		}
	}
	r.queries.Store(r.eng.Stats().PrefixQueries)
}

func (r *rig) waitConsistent(what string, subset bool) {
	r.t.Helper()
	want := r.or.expected(r.eng)
	testkit.Eventually(r.t, 15*time.Second, what, func() (bool, string) {
		for _, n := range r.nodes {
			if ok, why := r.or.compare(n.FSM(), want, subset); !ok {
				return false, n.ID() + ": " + why
			}
		}
		return true, ""
	})
}

func TestAgentEndToEnd(t *testing.T) {
	testkit.SkipIfShort(t, "a long randomised run of the agent against an in-process directory")
	r := newRig(t)
	r.startAgent()

	// (a) Steady traffic, including the slow-joiner start (replay from 0).
	r.traffic(30)
	r.waitConsistent("the directory to equal the engine's cache", false)
	if st := r.agent.TranslatorStats(); st.BlocksRemoved == 0 || st.BlocksStored == 0 {
		t.Fatalf("expected evictions in steady traffic: %+v", st)
	}

	// (b1) Lost batches (kept for replay): gaps are replayed, exact view.
	replays0 := metricValue(t, r.agent, "kvdir_agent_replays_total", "ok")
	r.pub.SetLossRate(0.3)
	r.traffic(15)
	r.pub.SetLossRate(0)
	r.traffic(2)
	r.waitConsistent("the directory to equal the cache after replayed gaps", false)
	if metricValue(t, r.agent, "kvdir_agent_gaps_total", "") == 0 || metricValue(t, r.agent, "kvdir_agent_replays_total", "ok") == replays0 {
		t.Fatal("lost batches caused no gap or replay")
	}

	// (b2) Dropped batches (not replayable): clear and rebuild; the
	// directory never holds a block the engine does not.
	r.pub.SetDropRate(0.3)
	r.traffic(10)
	r.pub.SetDropRate(0)
	r.traffic(3)
	r.waitConsistent("the directory to be a subset of the cache after drops", true)
	if metricValue(t, r.agent, "kvdir_agent_resyncs_total", "replay_incomplete") == 0 {
		t.Fatal("dropped batches caused no resync")
	}

	// Directory-side loss: the worker is expired behind the agent's back;
	// a refused batch or a heartbeat answered known=false re-registers.
	epoch0 := r.agent.Epoch()
	if _, err := r.dir.ExpireWorker(context.Background(), itWorker); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a new registration after expiry", func() (bool, string) {
		return r.agent.Epoch() > epoch0, ""
	})
	r.traffic(5)
	r.waitConsistent("the directory to be a subset of the cache after expiry", true)

	// (c) Engine restart: sequence back to 0, new cache, new epoch.
	epoch := r.agent.Epoch()
	r.pub.Restart()
	r.newEngine()
	r.traffic(10)
	r.waitConsistent("the directory to equal the restarted engine's cache", false)
	if r.agent.Epoch() == epoch {
		t.Fatal("engine restart did not lead to a new epoch")
	}
	// Two signals can each see the restart: the event sequence going back and
	// the engine's counters going back. Old batches still queued when the
	// counters are seen can make the sequence signal fire too, so the count
	// may be 2; the view above is what must be right.
	if n := metricValue(t, r.agent, "kvdir_agent_engine_restarts_total", ""); n < 1 || n > 2 {
		t.Fatalf("engine restarts counted: %v, want 1 (or 2)", n)
	}

	// (e) Directory leader change right after a burst, while the agent
	// still has batches in flight: its publisher moves to the new leader
	// and re-sends what was not acknowledged; the view stays exact.
	r.traffic(5)
	var leader *node.Node
	for _, n := range r.nodes {
		if n.IsLeader() {
			leader = n
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	if err := leader.Raft().LeadershipTransfer().Error(); err != nil {
		t.Fatalf("leadership transfer: %v", err)
	}
	r.traffic(10)
	r.waitConsistent("the directory to equal the cache after a leader change", false)
	if leader.IsLeader() {
		t.Fatal("leadership did not move")
	}

	// (d) Agent restart: the new agent replays the engine's buffer from 0
	// at start-up, so the view is right again before the engine publishes
	// anything new; then traffic continues from there.
	r.stopAgent()
	r.startAgent()
	r.waitConsistent("the directory to equal the cache after an agent restart, with no new events", false)
	if metricValue(t, r.agent, "kvdir_agent_replays_total", "startup") == 0 {
		t.Fatal("the restarted agent did not replay at start-up")
	}
	r.traffic(3)
	r.waitConsistent("the directory to equal the cache after an agent restart", false)
	// The agent's own HTTP endpoints.
	rec := httptest.NewRecorder()
	r.agent.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, name := range []string{"kvdir_agent_events_decoded_total", "kvdir_agent_blocks_stored_total",
		"kvdir_agent_batches_published_total", "kvdir_agent_publish_lag_seconds_bucket", "kvdir_agent_map_entries"} {
		if !strings.Contains(rec.Body.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	rec = httptest.NewRecorder()
	r.agent.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Errorf("/healthz = %d", rec.Code)
	}
	// Shutdown deregisters the worker.
	r.stopAgent()
	testkit.Eventually(t, 10*time.Second, "the worker to be deregistered", func() (bool, string) {
		w, ok := r.nodes[0].FSM().Worker(itWorker)
		return ok && w.Blocks == 0 && w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE, fmt.Sprint(w)
	})
}

// metricValue returns a counter of the agent's registry (summed over series
// whose label value is label, or all series if label is "").
func metricValue(t *testing.T, a *Agent, name, label string) float64 {
	t.Helper()
	fams, err := a.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					match = true
				}
			}
			if match {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
