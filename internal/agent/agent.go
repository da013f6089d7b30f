package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Defaults of Config.
const (
	DefaultBatchInterval     = 10 * time.Millisecond
	DefaultBatchBlocks       = 4096
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultReplayTimeout     = 5 * time.Second
	DefaultRegisterRetry     = time.Second
	DefaultShutdownTimeout   = 5 * time.Second
)

// maxRefusedBackoff bounds the pause between registrations the directory
// refused as of a model its group does not serve (FailedPrecondition).
const maxRefusedBackoff = time.Minute

// Config configures an Agent.
type Config struct {
	// WorkerID, WorkerAddress, Model, BlockSize, Engine and Labels are
	// registered with the directory. BlockSize (0: not told) is what the
	// operator expects the engine to use: events carry their own, which the
	// directory learns from the layout events the agent sends and routers
	// prefer; an indexed store of another size is warned about and counted
	// (ProblemBlockSizeMismatch).
	WorkerID      string
	WorkerAddress string
	Model         string
	BlockSize     int
	Engine        kvdirv1.EngineKind
	Labels        map[string]string

	// Endpoint is the engine's KV-events address (tcp://host:5557); with
	// Bind the agent binds it (the engine's PUB connects).
	Endpoint string
	Bind     bool
	// ReplayEndpoint is the engine's replay (ROUTER) address; "" disables
	// replay, and every gap then clears and rebuilds.
	ReplayEndpoint string
	Topic          string
	// MaxMessageBytes bounds one inbound ZMQ message (live or replayed):
	// a connection whose peer declares a larger one is closed and counted
	// (kvdir_agent_zmtp_oversized_total). 0 means
	// kvevents.DefaultMaxMessageBytes.
	MaxMessageBytes int64

	// PullURL, instead of Endpoint, is a TensorRT-LLM engine's pull-only
	// KV-events endpoint (trtllm-serve's POST /kv_cache_events), polled
	// every PullInterval (DefaultPullInterval); see pull.go.
	PullURL      string
	PullInterval time.Duration

	// MetricsURL is the engine's Prometheus endpoint for the load; "" sends
	// heartbeats without load. Its shape is SGLang's or TensorRT-LLM's
	// when Engine says so, and detected otherwise (see LoadOptions).
	MetricsURL string
	// MetricsRank, with MetricsByRank, is the data-parallel rank whose
	// series of MetricsURL are this worker's load (one agent per rank of
	// an engine whose API server exports every rank's series).
	MetricsRank   int
	MetricsByRank bool
	// DataParallelRank, when set, is the data-parallel rank this worker is
	// behind an API server shared with the engine's other ranks; it is
	// registered with the worker so that routers pin its requests to the
	// rank (X-data-parallel-rank). Nil for a worker that is its own server.
	DataParallelRank *uint32

	// ReportMode is how the engine reports stores: ReportIncremental
	// (vLLM's default) or ReportFull (kv_cache_report_mode="full", where
	// prefix reuse re-sends stores without removals).
	ReportMode ReportMode

	// BatchInterval and BatchBlocks bound how long and how big a batch of
	// directory events grows before it is sent.
	BatchInterval time.Duration
	BatchBlocks   int
	// MapCapacity bounds the engine-hash map (see Translator).
	MapCapacity int
	// QueueLimit bounds the batches the directory publisher buffers
	// unacknowledged; beyond it batches are dropped and the worker is
	// resynchronised (default dirclient.DefaultQueueLimit).
	QueueLimit int
	// HeartbeatInterval is fixed if set; otherwise lease/3 as the directory
	// reports it (every 250 ms until known, for at most 5 s, then
	// DefaultHeartbeatInterval).
	HeartbeatInterval time.Duration
	// EngineDownAfter is how long the engine's metrics endpoint may go
	// without answering (refused, timed out, or a gateway's 502-504; from
	// the first failed probe, and at least three probes in a row) before
	// the agent deregisters the worker; it registers again, and
	// rebuilds, once the endpoint answers. 0 means half the directory's
	// lease. Without a MetricsURL the engine is not watched.
	EngineDownAfter time.Duration
	ReplayTimeout   time.Duration
	RegisterRetry   time.Duration
	ShutdownTimeout time.Duration

	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if err := c.Validate(); err != nil {
		return err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.BatchInterval, DefaultBatchInterval)
	def(&c.ReplayTimeout, DefaultReplayTimeout)
	def(&c.RegisterRetry, DefaultRegisterRetry)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.BatchBlocks <= 0 {
		c.BatchBlocks = DefaultBatchBlocks
	}
	if c.QueueLimit <= 0 {
		c.QueueLimit = dirclient.DefaultQueueLimit
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Agent follows one engine's KV events and keeps the directory's view of the
// worker in step with the engine's cache.
type Agent struct {
	cfg Config
	dir *dirclient.Client
	log *slog.Logger
	m   *metrics
	hc  *http.Client

	trMu sync.Mutex // guards tr against metric reads
	tr   *Translator

	epoch      atomic.Uint64 // current registered epoch (0: none)
	healthy    atomic.Bool
	reregister chan uint64 // epochs a heartbeat found unknown

	// The engine's metrics endpoint stopped answering (engineDown, set by
	// the heartbeat goroutine, cleared by the main loop once it answers
	// again): the worker is out of the directory and not registered again
	// until then. engineGoneC and engineUp carry the two transitions.
	engineDown  atomic.Bool
	engineGoneC chan struct{}
	engineUp    chan struct{}

	// Engine restarts seen by the heartbeat: its prefix-cache counters went
	// down. The main loop acts on one only if no restart was handled since
	// the sample before the drop (restartGen then still equals the value
	// sent), so a restart already seen in the event sequence is not
	// handled twice.
	counterReset chan uint64
	restartGen   atomic.Uint64
	lastQueries  float64   // heartbeat goroutine only
	lastGen      uint64    // heartbeat goroutine only
	lastEventAt  time.Time // main loop only: when the last live event arrived

	// partial: the directory's view of the worker may miss blocks the
	// engine holds (the last rebuild could not cover its cache); sent with
	// every heartbeat and exported as kvdir_agent_view_partial.
	partial atomic.Bool
	// registered: a registration succeeded once, so the next one replaces
	// an epoch whose view the directory dropped (main loop only).
	registered bool

	// Main-loop state.
	pub           *dirclient.Publisher
	pending       []*kvdirv1.Event
	pendingBlocks int
	pendingSince  time.Time
	needClear     bool
	lastReg       time.Time
	regBackoff    time.Duration // pause after a refused registration (wrong directory group), doubling
	haveLive      bool
	lastLive      uint64
	last          uint64

	pull *pullState // with Config.PullURL: the poller's state and metrics
	lim  kvevents.Limits
}

// New returns an Agent publishing through dir.
func New(cfg Config, dir *dirclient.Client) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if dir == nil {
		return nil, errors.New("agent: directory client is required")
	}
	a := &Agent{
		cfg: cfg, dir: dir, log: cfg.Logger,
		hc:           &http.Client{Timeout: 2 * time.Second},
		tr:           NewTranslator(cfg.Model, cfg.MapCapacity, cfg.Logger),
		reregister:   make(chan uint64, 1),
		engineGoneC:  make(chan struct{}, 1),
		engineUp:     make(chan struct{}, 1),
		counterReset: make(chan uint64, 1),
		lastQueries:  -1,
	}
	a.tr.SetBlockSize(cfg.BlockSize)
	a.tr.SetReportMode(cfg.ReportMode)
	a.m = newMetrics(a)
	a.lim = kvevents.NewLimits(cfg.MaxMessageBytes, a.m.oversized.Inc)
	if cfg.PullURL != "" {
		a.pull = newPullState(a)
	}
	return a, nil
}

// TranslatorLayout returns the KV-cache groups and block sizes the engine's
// events showed so far.
func (a *Agent) TranslatorLayout() Layout {
	a.trMu.Lock()
	defer a.trMu.Unlock()
	return a.tr.Layout()
}

// TranslatorStats returns the translator's counters.
func (a *Agent) TranslatorStats() TranslatorStats {
	a.trMu.Lock()
	defer a.trMu.Unlock()
	return a.tr.Stats()
}

// Epoch returns the worker's current epoch (0 before registering).
func (a *Agent) Epoch() uint64 { return a.epoch.Load() }

// Handler serves /metrics and /healthz (200 once registered, else 503).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", a.m.handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if a.healthy.Load() {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		http.Error(w, "not registered", http.StatusServiceUnavailable)
	})
	return mux
}

// Run subscribes to the engine (or polls its pull endpoint) and runs until
// ctx ends; it then flushes, deregisters the worker and returns nil. It
// fails only if the subscriber cannot be created.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	// One source of events: a TensorRT-LLM pull endpoint (pulls) or a
	// ZeroMQ subscription (msgs); the other channel stays nil.
	var msgs chan kvevents.Msg
	var pulls chan pulled
	var sub *kvevents.Subscriber
	if a.cfg.PullURL != "" {
		pulls = make(chan pulled, 16)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(pulls)
			a.pullLoop(ctx, pulls)
		}()
	} else {
		var err error
		sub, err = kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{
			Endpoint: a.cfg.Endpoint, Bind: a.cfg.Bind, Topic: a.cfg.Topic,
			MaxMessageBytes: a.cfg.MaxMessageBytes, OnOversized: a.m.oversized.Inc,
		})
		if err != nil {
			return fmt.Errorf("agent: subscribe: %w", err)
		}
		defer sub.Close()
		msgs = make(chan kvevents.Msg, 1024)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(msgs)
			a.recvLoop(ctx, sub, msgs)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.heartbeatLoop(ctx)
	}()
	a.register(ctx)
	a.startupReplay(ctx)
	tick := time.NewTicker(a.cfg.BatchInterval)
	defer tick.Stop()
loop:
	for {
		var pubDone <-chan struct{}
		if a.pub != nil {
			pubDone = a.pub.Done()
		}
		select {
		case <-ctx.Done():
			break loop
		case m, ok := <-msgs:
			if !ok {
				break loop
			}
			a.handle(ctx, m)
		case p, ok := <-pulls:
			if !ok {
				break loop
			}
			a.handlePull(ctx, p)
		case <-a.engineGoneC:
			a.engineGone(ctx)
		case <-a.engineUp:
			a.engineBack(ctx)
		case <-tick.C:
			if a.pub == nil && !a.engineDown.Load() && time.Since(a.lastReg) >= a.cfg.RegisterRetry {
				a.register(ctx)
			}
			a.flush(ctx)
		case ep := <-a.reregister:
			if ep == a.epoch.Load() {
				a.log.Warn("agent: directory does not know the worker; registering again", "epoch", ep)
				a.register(ctx)
			}
		case <-pubDone:
			a.publisherStopped(ctx)
		case gen := <-a.counterReset:
			// Only for an engine that has gone quiet: while events flow, the
			// sequence says when the engine restarted, and acting on the
			// counters with the old engine's last batches still queued would
			// interleave them with the new engine's (a stress run counted
			// three restarts for one).
			if gen == a.restartGen.Load() && time.Since(a.lastEventAt) > counterRestartQuiet {
				a.m.restarts.Inc()
				a.log.Warn("agent: the engine's prefix-cache counters went back; engine restarted")
				a.engineRestarted(ctx)
			}
		}
	}
	a.shutdown()
	if sub != nil {
		_ = sub.Close()
	}
	wg.Wait()
	return nil
}

// recvLoop forwards the subscriber's messages to msgs until ctx ends or
// the subscriber closes.
func (a *Agent) recvLoop(ctx context.Context, sub *kvevents.Subscriber, msgs chan<- kvevents.Msg) {
	for {
		m, err := sub.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kvevents.ErrClosed) {
				return
			}
			a.m.decodeErrors.Inc()
			continue
		}
		select {
		case msgs <- m:
		case <-ctx.Done():
			return
		}
	}
}

// shutdown flushes what is pending and deregisters.
func (a *Agent) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	a.healthy.Store(false)
	if a.pub == nil {
		return
	}
	a.flush(ctx)
	if err := a.pub.Flush(ctx); err != nil {
		a.log.Warn("agent: flush at shutdown", "err", err)
	}
	if _, err := a.dir.Deregister(ctx, a.cfg.WorkerID, a.pub.Epoch()); err != nil {
		a.log.Warn("agent: deregister", "err", err)
	}
	a.pub.Close()
	a.pub = nil
	a.epoch.Store(0)
}

// register registers the worker (a new epoch) and starts a publisher; the
// next batch starts with AllCleared. On failure it leaves a.pub nil and the
// main loop retries.
func (a *Agent) register(ctx context.Context) {
	if a.registerEpoch(ctx) && a.registered {
		a.rebuild(ctx)
	}
	a.registered = a.registered || a.pub != nil
}

// registerEpoch registers the worker and reports whether it succeeded. It
// does not while the engine is down (engineBack registers).
func (a *Agent) registerEpoch(ctx context.Context) bool {
	a.lastReg = time.Now()
	if a.engineDown.Load() {
		return false
	}
	if a.pub != nil {
		a.pub.Close()
		a.pub = nil
		a.healthy.Store(false)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := a.dir.Register(rctx, &kvdirv1.WorkerSpec{
		Id: a.cfg.WorkerID, Address: a.cfg.WorkerAddress, Model: a.cfg.Model,
		BlockSize: uint32(max(a.cfg.BlockSize, 0)), Engine: a.cfg.Engine, Labels: a.cfg.Labels,
		DataParallelRank: a.cfg.DataParallelRank,
	})
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			// The directory group does not serve this model (its nodes'
			// --models): retrying soon cannot help, so back off, and say
			// what to fix.
			a.regBackoff = min(max(2*a.regBackoff, a.cfg.RegisterRetry), maxRefusedBackoff)
			a.lastReg = time.Now().Add(a.regBackoff - a.cfg.RegisterRetry)
			a.log.Error("agent: the directory refused to register the worker, and retrying soon cannot help: a directory group serving other models (its nodes' --models) refuses this one; point --directory at the nodes of the group serving it",
				"worker", a.cfg.WorkerID, "model", a.cfg.Model, "retry_in", a.regBackoff, "err", status.Convert(err).Message())
			return false
		}
		a.log.Warn("agent: register failed; will retry", "worker", a.cfg.WorkerID, "err", err)
		return false
	}
	a.regBackoff = 0
	a.pub = a.dir.NewPublisher(a.cfg.WorkerID, resp.Epoch, dirclient.WithQueueLimit(a.cfg.QueueLimit))
	a.epoch.Store(resp.Epoch)
	a.needClear = true
	a.healthy.Store(true)
	a.m.registers.Inc()
	a.log.Info("agent: registered", "worker", a.cfg.WorkerID, "epoch", resp.Epoch)
	return true
}

// engineGone takes the worker out of the directory: the engine stopped
// answering, so routers must not place there, and its blocks are stale.
// It deregisters the current epoch (if that fails, the heartbeats have
// stopped and the lease lapses), keeping the engine-hash map for the
// rebuild when the engine answers again.
func (a *Agent) engineGone(ctx context.Context) {
	a.m.engineDowns.Inc()
	a.healthy.Store(false)
	a.pending, a.pendingBlocks = nil, 0
	if a.pub == nil {
		return
	}
	ep := a.pub.Epoch()
	a.pub.Close()
	a.pub = nil
	a.epoch.Store(0)
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := a.dir.Deregister(dctx, a.cfg.WorkerID, ep); err != nil {
		a.log.Warn("agent: deregister after the engine went away; the lease will lapse", "epoch", ep, "err", err)
		return
	}
	a.log.Warn("agent: deregistered the worker: its engine does not answer", "worker", a.cfg.WorkerID, "epoch", ep)
}

// engineBack registers the worker again once its engine answers and
// rebuilds its view as at start-up, from the engine's replay buffer: the
// engine may have restarted (its buffer then starts at its first batch,
// and the view becomes exactly its cache) or only been unreachable (its
// buffer may no longer reach back to its first batch: the view is then
// reported partial). The engine-hash map starts over.
func (a *Agent) engineBack(ctx context.Context) {
	a.engineDown.Store(false)
	a.restartGen.Add(1) // a counter drop seen meanwhile is handled here
	a.trMu.Lock()
	held := a.tr.Len() > 0
	a.tr.Reset()
	a.trMu.Unlock()
	a.pending, a.pendingBlocks = nil, 0
	a.haveLive, a.lastLive, a.last = false, 0, 0
	a.setPartial(false, "")
	if !a.registerEpoch(ctx) {
		return // the main loop retries, with a rebuild
	}
	a.registered = true
	if a.cfg.ReplayEndpoint == "" || a.pull != nil {
		if held {
			a.setPartial(true, "the engine was unreachable and has no replay endpoint; blocks it still holds are not in the directory until it stores them again")
		}
		return
	}
	a.startupReplay(ctx)
}

// publisherStopped handles a refusal or a fatal publisher error: register
// again (new epoch) and go on; unacknowledged batches are lost.
func (a *Agent) publisherStopped(ctx context.Context) {
	err := a.pub.Err()
	status := "error"
	var re *dirclient.RefusedError
	if errors.As(err, &re) {
		status = re.Status().String()
	}
	a.m.refusals.WithLabelValues(status).Inc()
	a.log.Warn("agent: directory publisher stopped; registering again", "status", status, "err", err)
	a.pub = nil
	a.register(ctx)
}

// counterRestartQuiet is how long the engine's event stream must have been
// silent before a drop of its counters is taken as a restart.
const counterRestartQuiet = time.Second

// handle applies the sequence rules to one live message.
func (a *Agent) handle(ctx context.Context, m kvevents.Msg) {
	a.lastEventAt = time.Now()
	s := m.Seq
	if a.haveLive {
		switch {
		case s < a.lastLive:
			a.m.restarts.Inc()
			a.log.Warn("agent: engine sequence went backwards; engine restarted", "seq", s, "last", a.lastLive)
			a.engineRestarted(ctx)
		case s == a.lastLive:
			a.m.duplicates.Inc()
			return
		}
	}
	if !a.haveLive {
		a.haveLive, a.lastLive = true, s
		if s == 0 {
			a.process(ctx, m)
			a.last = 0
			return
		}
		a.catchUp(ctx, 0, m)
		return
	}
	a.lastLive = s
	switch {
	case s <= a.last:
		a.m.duplicates.Inc()
	case s == a.last+1:
		a.process(ctx, m)
		a.last = s
	default:
		a.m.gaps.Inc()
		a.catchUp(ctx, a.last+1, m)
	}
}

// engineRestarted starts over: a new registration (which clears the worker
// in the directory), an empty map.
func (a *Agent) engineRestarted(ctx context.Context) {
	a.restartGen.Add(1)
	a.trMu.Lock()
	a.tr.Reset()
	a.trMu.Unlock()
	a.pending, a.pendingBlocks = nil, 0
	a.haveLive, a.last = false, 0
	// The new engine's cache starts empty: nothing to rebuild.
	a.registerEpoch(ctx)
	a.registered = a.registered || a.pub != nil
	a.setPartial(false, "")
}

// limits bound the replay replies as the live stream.
func (a *Agent) limits() kvevents.Limits { return a.lim }

// startupReplay rebuilds, before any live event, what the engine's replay
// buffer still holds: without it, a restarted agent would leave the
// directory's view of a busy engine empty until the engine's next event.
// Blocks stored before the buffer's oldest batch cannot be recovered.
func (a *Agent) startupReplay(ctx context.Context) {
	if a.cfg.ReplayEndpoint == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.ReplayTimeout)
	msgs, err := kvevents.ReplayLimited(rctx, a.cfg.ReplayEndpoint, 0, a.limits())
	cancel()
	if err != nil || len(msgs) == 0 {
		if err != nil {
			a.log.Info("agent: no replay at start-up", "err", err)
		}
		a.m.rebuilds.WithLabelValues("startup_empty").Inc()
		return
	}
	first := msgs[0].Seq
	next := first
	for _, m := range msgs {
		if m.Seq != next {
			break
		}
		a.process(ctx, m)
		next++
	}
	a.haveLive, a.lastLive, a.last = true, next-1, next-1
	if first > 0 {
		// The buffer no longer holds the engine's first batches: what they
		// stored and nothing later removed is missing from the view.
		a.m.replays.WithLabelValues("incomplete").Inc()
		a.m.resyncs.WithLabelValues("startup_replay_incomplete").Inc()
		a.log.Warn("agent: the engine's replay buffer starts after its first batch; blocks stored before it are not in the directory",
			"from", first, "to", next-1)
		a.m.rebuilds.WithLabelValues(rebuildPartial).Inc()
		a.setPartial(true, "the engine's replay buffer starts after its first batch")
		return
	}
	a.m.rebuilds.WithLabelValues(rebuildComplete).Inc()
	a.m.replays.WithLabelValues("startup").Inc()
	a.log.Info("agent: rebuilt from the engine's replay buffer at start-up", "from", first, "to", next-1)
}

// Results of a rebuild (label values of kvdir_agent_rebuilds_total).
const (
	rebuildComplete = "complete"
	rebuildPartial  = "partial"
)

// rebuild, after a registration that replaced an earlier epoch (the
// directory dropped the worker's blocks: an expiry, a lapsed lease, a
// refused batch), republishes the engine's cache by the start-up path: the
// engine's replay buffer from its first batch. Without it the view would
// stay empty while the engine serves those prefixes as hits, which emit
// no event. When the buffer cannot cover the cache (it starts after the
// engine's first batch, it has a hole, the engine has no replay) the
// worker is reported partial: kvdir_agent_view_partial, a warning, and
// view_partial with every heartbeat's load.
func (a *Agent) rebuild(ctx context.Context) {
	// The replay re-stores every block from scratch: what is pending is in
	// it, and the counts start over. The mappings are kept, so that a
	// partial replay still translates children of older blocks.
	a.trMu.Lock()
	a.tr.ForgetHeld()
	stored := a.tr.Len() > 0
	a.trMu.Unlock()
	a.pending, a.pendingBlocks = nil, 0
	if a.pull != nil || a.cfg.ReplayEndpoint == "" {
		if !stored {
			// No store seen yet: the view the directory dropped was empty.
			a.m.rebuilds.WithLabelValues(rebuildComplete).Inc()
			return
		}
		a.m.rebuilds.WithLabelValues(rebuildPartial).Inc()
		a.setPartial(true, "the engine has no replay endpoint; blocks it holds are not in the directory until it stores them again")
		return
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, a.cfg.ReplayTimeout)
	msgs, err := kvevents.ReplayLimited(rctx, a.cfg.ReplayEndpoint, 0, a.limits())
	cancel()
	var first, next uint64
	if len(msgs) > 0 {
		first = msgs[0].Seq
		next = first
		for _, m := range msgs {
			if m.Seq != next {
				break
			}
			a.process(ctx, m)
			next++
		}
	}
	seen := a.haveLive || a.last > 0
	var why string
	switch {
	case err != nil:
		why = "the engine's replay failed: " + err.Error()
	case len(msgs) == 0 && seen:
		why = "the engine's replay buffer is empty"
	case first > 0:
		why = "the engine's replay buffer starts after its first batch"
	case next < uint64(len(msgs))+first:
		why = "the engine's replay buffer has a hole"
	case seen && next-1 < a.last:
		why = "the engine's replay buffer ends before the last batch seen"
	}
	if len(msgs) > 0 && (!a.haveLive || next-1 > a.last) {
		// Live batches up to next-1 were just replayed: drop them.
		a.haveLive, a.lastLive, a.last = true, max(a.lastLive, next-1), next-1
	}
	if why != "" {
		a.m.rebuilds.WithLabelValues(rebuildPartial).Inc()
		a.setPartial(true, why)
		return
	}
	a.m.rebuilds.WithLabelValues(rebuildComplete).Inc()
	a.setPartial(false, "")
	a.log.Info("agent: rebuilt the worker's view from the engine's replay buffer",
		"epoch", a.epoch.Load(), "batches", len(msgs), "took", time.Since(start))
}

// setPartial records whether the directory's view of the worker may miss
// blocks the engine holds, warning when it does.
func (a *Agent) setPartial(partial bool, why string) {
	a.partial.Store(partial)
	if partial {
		a.m.partial.Set(1)
		a.log.Warn("agent: the worker's view in the directory is partial: "+why,
			"worker", a.cfg.WorkerID, "epoch", a.epoch.Load())
		return
	}
	a.m.partial.Set(0)
}

// catchUp replays [from, m.Seq) from the engine, then m; if that is
// impossible it resynchronises and continues from m.
func (a *Agent) catchUp(ctx context.Context, from uint64, m kvevents.Msg) {
	if a.cfg.ReplayEndpoint == "" {
		a.m.replays.WithLabelValues("disabled").Inc()
		a.resync("no_replay")
		a.process(ctx, m)
		a.last = m.Seq
		return
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.ReplayTimeout)
	msgs, err := kvevents.ReplayLimited(rctx, a.cfg.ReplayEndpoint, from, a.limits())
	cancel()
	next := from
	var got []kvevents.Msg
	for _, r := range msgs {
		if r.Seq < next {
			continue
		}
		if r.Seq != next {
			break
		}
		got = append(got, r)
		next++
	}
	if next <= m.Seq {
		a.m.replays.WithLabelValues("incomplete").Inc()
		a.log.Warn("agent: replay could not fill the gap; clearing the worker and rebuilding",
			"from", from, "to", m.Seq, "replayed", len(got), "err", err)
		a.resync("replay_incomplete")
		a.process(ctx, m)
		a.last = m.Seq
		return
	}
	a.m.replays.WithLabelValues("ok").Inc()
	for _, r := range got {
		a.process(ctx, r)
	}
	a.last = next - 1
}

// resync publishes AllCleared before anything else and forgets what the
// engine holds (events were lost, so the counts cannot be trusted).
func (a *Agent) resync(reason string) {
	a.m.resyncs.WithLabelValues(reason).Inc()
	a.trMu.Lock()
	a.tr.ForgetHeld()
	a.trMu.Unlock()
	a.pending, a.pendingBlocks = nil, 0
	a.needClear = true
}

// process decodes and translates one message into the pending batch.
func (a *Agent) process(ctx context.Context, m kvevents.Msg) {
	b, st, err := kvevents.DecodeBatch(m.Payload)
	if err != nil {
		// Skipped, not a reason to clear the worker's view: what the
		// batch held is lost (at worst a few stale or missing blocks in
		// the directory, which later events and evictions correct), while
		// a resynchronisation would drop everything the engine holds.
		a.m.decodeErrors.Inc()
		a.log.Warn("agent: undecodable engine batch skipped", "seq", m.Seq, "err", err)
		return
	}
	if st.Malformed > 0 || st.Unknown > 0 {
		// Skipped events may have been stores or removals; the decoder's
		// problems are counted, and the rest of the batch is used.
		a.m.malformed.Add(float64(st.Malformed + st.Unknown))
	}
	a.translate(ctx, b)
}

// translate translates b into the pending batch, flushing it once full.
func (a *Agent) translate(ctx context.Context, b kvevents.Batch) {
	if len(a.pending) == 0 {
		a.pendingSince = time.Now()
	}
	a.trMu.Lock()
	var n int
	mark := len(a.pending)
	a.pending, n = a.tr.Translate(a.pending, b)
	if le := a.tr.LayoutChange(a.pending[mark:]); le != nil {
		// Before the batch's blocks: the directory must know their size.
		a.pending = slices.Insert(a.pending, mark, le)
	}
	// One engine event may name more blocks than the directory takes in
	// one piece; cut it rather than have the whole batch refused.
	a.pending = append(a.pending[:mark], splitPieces(a.pending[mark:], maxPieceBlocks)...)
	a.trMu.Unlock()
	a.pendingBlocks += n
	if a.pendingBlocks >= a.cfg.BatchBlocks {
		a.flush(ctx)
	}
}

// flush sends the pending events as one batch.
func (a *Agent) flush(ctx context.Context) {
	if len(a.pending) == 0 && !a.needClear {
		return
	}
	if a.pub == nil {
		// Not registered: keep the events unless they grow too large; the
		// registration's AllCleared covers what is dropped.
		if a.pendingBlocks > a.cfg.BatchBlocks*a.cfg.QueueLimit {
			a.m.dropped.Inc()
			a.pending, a.pendingBlocks = nil, 0
		}
		return
	}
	if a.pub.Pending() >= a.cfg.QueueLimit {
		a.m.dropped.Inc()
		a.m.resyncs.WithLabelValues("queue_full").Inc()
		a.pending, a.pendingBlocks = nil, 0
		a.needClear = true
		return
	}
	events := a.pending
	if a.needClear {
		// A new epoch (or a resynchronisation, which may have dropped the
		// pending layout event) starts with the whole layout: the directory
		// clears it at every registration, and must know it before blocks.
		head := []*kvdirv1.Event{{Kind: &kvdirv1.Event_Cleared{Cleared: &kvdirv1.AllCleared{}}}}
		a.trMu.Lock()
		if le := a.tr.LayoutEvent(); le != nil {
			head = append(head, le)
		}
		a.trMu.Unlock()
		events = append(head, events...)
	}
	since := a.pendingSince
	a.pending, a.pendingBlocks = nil, 0
	// Several batches when the events exceed the directory's per-batch
	// bounds (a long prompt); the AllCleared head stays in the first.
	for _, chunk := range chunkBatches(events, maxBatchEvents, maxBatchBlocks) {
		if _, err := a.pub.Send(ctx, chunk); err != nil {
			// The publisher stopped (handled by the main loop) or ctx ended.
			a.log.Warn("agent: send batch", "err", err)
			a.needClear = true
			return
		}
		a.needClear = false
		a.m.batches.Inc()
	}
	if !since.IsZero() {
		a.m.lag.Observe(time.Since(since).Seconds())
	}
}

// heartbeatLoop renews the lease with the engine's load. It also watches
// the engine: when its metrics endpoint has not answered for
// engineDownAfter, it stops heartbeating and has the main loop deregister
// the worker; once the endpoint answers again, the main loop registers
// anew (see engineGone and engineBack).
func (a *Agent) heartbeatLoop(ctx context.Context) {
	interval := a.cfg.HeartbeatInterval
	if interval <= 0 {
		// Until a heartbeat reports the lease: soon, so that the interval
		// (and the engine watch) follow the lease from the start.
		interval = leaseUnknownInterval
	}
	started := time.Now()
	lease := time.Duration(0)
	var failingSince time.Time // first of the probes failing in a row
	fails := 0
	down := false
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		load, reached := a.scrape(ctx, down)
		if reached {
			failingSince, fails = time.Time{}, 0
		} else if fails++; fails == 1 {
			failingSince = time.Now()
		}
		switch {
		case down && reached:
			down = false
			a.log.Info("agent: the engine answers again", "worker", a.cfg.WorkerID)
			select {
			case a.engineUp <- struct{}{}:
			default:
			}
		case down:
		case !reached && fails >= minDownProbes && time.Since(failingSince) >= a.engineDownAfter(lease):
			down = true
			a.engineDown.Store(true)
			a.log.Warn("agent: the engine's metrics endpoint has not answered; taking the worker out of the directory",
				"worker", a.cfg.WorkerID, "probes", fails, "for", time.Since(failingSince).Round(time.Millisecond), "url", a.cfg.MetricsURL)
			select {
			case a.engineGoneC <- struct{}{}:
			default:
			}
		default:
			if ep := a.epoch.Load(); ep != 0 && !a.engineDown.Load() {
				if l := a.heartbeat(ctx, ep, load); l > 0 {
					lease = l
					if a.cfg.HeartbeatInterval <= 0 {
						interval = max(lease/3, 10*time.Millisecond)
					}
				}
			}
		}
		if lease == 0 && a.cfg.HeartbeatInterval <= 0 && time.Since(started) > leaseUnknownFor {
			interval = DefaultHeartbeatInterval // the directory is not answering
		}
		next := interval
		if !reached && !down {
			// Probe a failing engine more often, so that it is taken out
			// soon after engineDownAfter rather than up to an interval
			// later.
			next = max(interval/4, 10*time.Millisecond)
		}
		t.Reset(next)
	}
}

// The heartbeat interval until the directory reports its lease, for at
// most leaseUnknownFor (then DefaultHeartbeatInterval).
const (
	leaseUnknownInterval = 250 * time.Millisecond
	leaseUnknownFor      = 5 * time.Second
)

// minDownProbes is how many probes in a row must fail before the engine
// is taken for gone, however short engineDownAfter is.
const minDownProbes = 3

// engineDownAfter is how long the engine's metrics endpoint may fail to
// answer, from the first failed probe of a run of at least minDownProbes,
// before the worker is taken out: Config.EngineDownAfter, or half the
// directory's lease (the first failure comes at most a heartbeat interval,
// a third of the lease, after the engine died, so routers stop placing
// there within the lease), or half of three default heartbeat intervals
// until the lease is known.
func (a *Agent) engineDownAfter(lease time.Duration) time.Duration {
	switch {
	case a.cfg.EngineDownAfter > 0:
		return a.cfg.EngineDownAfter
	case lease > 0:
		return lease / 2
	}
	return 3 * DefaultHeartbeatInterval / 2
}

// scrape reads the engine's load and reports whether the engine answered
// (always true without a metrics URL). After an outage (wasDown) a drop
// of the counters is not sent as a restart: engineBack handles it.
func (a *Agent) scrape(ctx context.Context, wasDown bool) (*kvdirv1.Load, bool) {
	if a.cfg.MetricsURL == "" {
		return nil, true
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, fresh, err := scrapeLoad(ctx, a.hc, a.cfg.MetricsURL, LoadOptions(a.cfg))
	if err != nil {
		a.log.Debug("agent: scrape engine metrics", "err", err)
		return nil, !errors.Is(err, errEngineUnreachable)
	}
	if fresh {
		// A drained TensorRT-LLM read has zero counters that are not a
		// restart.
		if wasDown {
			a.lastQueries, a.lastGen = float64(l.GetPrefixQueries()), a.restartGen.Load()
		} else {
			a.watchCounters(float64(l.GetPrefixQueries()))
		}
	}
	return l, true
}

// watchCounters notices an engine restart that published nothing yet: its
// cumulative prefix-cache query counter went down.
func (a *Agent) watchCounters(queries float64) {
	gen := a.restartGen.Load()
	if a.lastQueries >= 0 && queries < a.lastQueries {
		select {
		case a.counterReset <- a.lastGen:
		default:
		}
	}
	a.lastQueries, a.lastGen = queries, gen
}

// heartbeat sends one heartbeat with load and returns the lease the
// directory reported (0 if unknown).
func (a *Agent) heartbeat(ctx context.Context, ep uint64, load *kvdirv1.Load) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if a.partial.Load() {
		if load == nil {
			load = &kvdirv1.Load{}
		}
		load.ViewPartial = proto.Bool(true)
	}
	resp, err := a.dir.Heartbeat(ctx, a.cfg.WorkerID, ep, load)
	if err != nil {
		a.m.heartbeats.WithLabelValues("error").Inc()
		a.log.Warn("agent: heartbeat", "err", err)
		return 0
	}
	if !resp.Known {
		a.m.heartbeats.WithLabelValues("unknown").Inc()
		select {
		case a.reregister <- ep:
		default:
		}
		return 0
	}
	a.m.heartbeats.WithLabelValues("ok").Inc()
	return resp.GetLease().AsDuration()
}
