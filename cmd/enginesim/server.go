package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// faults are the switches of /admin/faults.
type faults struct {
	DropEventFraction float64 `json:"drop_event_fraction"`
	LossFraction      float64 `json:"loss_fraction"`
	SlowFactor        float64 `json:"slow_factor"`
	FailFraction      float64 `json:"fail_fraction"`
}

// instance is one engine "process": a runner and its driving goroutine.
type instance struct {
	runner *simengine.RealtimeRunner
	cancel context.CancelFunc
	done   chan struct{}
}

// server is the simulator: HTTP handlers, the engine, the event publisher
// and the metrics.
type server struct {
	cfg      config
	engCfg   simengine.Config
	log      *slog.Logger
	tmpl     *tokenize.ChatML
	tok      tokenize.Tokenizer
	pub      *kvevents.Publisher // nil without --kv-events-endpoint
	trt      *trtEvents          // with --kv-events-pull
	trtStats trtStats
	metrics  *metrics
	httpSrv  *http.Server
	listener net.Listener
	baseCtx  context.Context

	mu     sync.Mutex // guards cur and fault; held across a restart
	cur    *instance
	fault  faults
	nextID atomic.Uint64
	start  time.Time

	// ranks are the engines behind this server with --data-parallel-size
	// N > 1 (ranks[0] is s itself); nil for a single engine. See dp.go.
	ranks    []*server
	nextRank atomic.Uint64 // where the least-loaded search starts
}

// newServer validates cfg, builds the engine (one per data-parallel rank)
// and the publisher and binds the HTTP listener.
func newServer(ctx context.Context, cfg config, logger *slog.Logger) (*server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s, err := newEngine(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	if err := s.addRanks(ctx); err != nil {
		s.stopAll()
		s.closePublishers()
		return nil, err
	}
	s.listener, err = net.Listen("tcp", cfg.addr)
	if err != nil {
		s.stopAll()
		s.closePublishers()
		return nil, fmt.Errorf("listen %s: %w", cfg.addr, err)
	}
	// No whole-request read timeout: it would cancel long streamed
	// completions; bodies have their own deadline (readBody).
	s.httpSrv = httpserve.New(s.routes(), httpserve.Timeouts{ReadHeader: 10 * time.Second, Read: -1, Idle: cfg.httpIdle},
		slog.NewLogLogger(logger.Handler(), slog.LevelWarn))
	return s, nil
}

// newEngine builds one engine: its runner, publisher and metrics, without
// the HTTP side.
func newEngine(ctx context.Context, cfg config, logger *slog.Logger) (*server, error) {
	prof, err := loadProfile(cfg.profile)
	if err != nil {
		return nil, err
	}
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	s := &server{
		cfg:  cfg,
		log:  logger,
		tmpl: tmpl,
		tok:  tmpl.Tokenizer(),
		engCfg: simengine.Config{
			Profile:          prof,
			BlockSize:        cfg.blockSize,
			CapacityBlocks:   cfg.kvBlocks,
			MaxBatchedTokens: cfg.maxBatchedTokens,
			MaxRunning:       cfg.maxRunning,
			Seed:             cfg.seed,
			Shape:            cfg.shape,
		},
		fault:   faults{SlowFactor: 1},
		baseCtx: ctx,
		start:   time.Now(),
	}
	s.engCfg.OffloadMedium, s.engCfg.OffloadBlocks = cfg.media.offloadConfig()
	if cfg.kvEventsPull {
		s.trt = newTRTEvents(cfg.trtQueueSize, cfg.maxModelLen, cfg.kvBlocks)
	}
	if cfg.eventsEndpoint != "" {
		if s.pub, err = newPublisher(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if s.cur, err = s.newInstance(); err != nil {
		s.closePublisher()
		return nil, err
	}
	s.metrics = newMetrics(s)
	return s, nil
}

func loadProfile(spec string) (costmodel.Profile, error) {
	p, err := costmodel.ResolveProfile(spec)
	if err != nil {
		return costmodel.Profile{}, fmt.Errorf("--profile: %w", err)
	}
	return p, nil
}

func newPublisher(ctx context.Context, cfg config) (*kvevents.Publisher, error) {
	pc := kvevents.PublisherConfig{
		Bind:        cfg.eventsBind,
		Topic:       cfg.topic,
		BufferSteps: cfg.replayBufferSteps,
		DPRank:      cfg.dpRank,
		Seed:        cfg.seed,

		MaxMessageBytes: cfg.maxMsgBytes,
	}
	switch cfg.eventsForm {
	case "array":
		pc.Form = kvevents.FormArray
	case "map":
		pc.Form = kvevents.FormMap
	case "map-batch":
		pc.Form = kvevents.FormMapBatch
	default:
		return nil, fmt.Errorf("--kv-events-form %q, want array or map", cfg.eventsForm)
	}
	switch cfg.replayLayout {
	case "old":
		pc.ReplayLayout = kvevents.ReplayLayoutOld
	case "new":
		pc.ReplayLayout = kvevents.ReplayLayoutNew
	default:
		return nil, fmt.Errorf("--replay-layout %q, want old or new", cfg.replayLayout)
	}
	var err error
	if pc.Endpoint, err = kvevents.OffsetEndpoint(cfg.eventsEndpoint, cfg.dpRank); err != nil {
		return nil, fmt.Errorf("--kv-events-endpoint: %w", err)
	}
	if pc.ReplayEndpoint, err = kvevents.OffsetEndpoint(cfg.replayEndpoint, cfg.dpRank); err != nil {
		return nil, fmt.Errorf("--kv-events-replay-endpoint: %w", err)
	}
	pub, err := kvevents.NewPublisher(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	return pub, nil
}

// newInstance starts a fresh engine.
func (s *server) newInstance() (*instance, error) {
	r, err := simengine.NewRealtimeRunner(s.engCfg, simengine.SinkFunc(s.publishBatch), s.cfg.timeScale)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	ctx, cancel := context.WithCancel(s.baseCtx)
	in := &instance{runner: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		_ = r.Run(ctx) // returns ctx.Err() once stopped
	}()
	return in, nil
}

// stop aborts the instance's requests and waits for its goroutine.
func (in *instance) stop() {
	in.cancel()
	<-in.done
}

// current returns the running engine instance.
func (s *server) current() *instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *server) faults() faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// restart simulates an engine restart: the requests in flight are aborted,
// the cache starts empty and the event sequence restarts at 0 (with an empty
// replay buffer). As with a real restart, no AllBlocksCleared is published.
func (s *server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.stop()
	if s.pub != nil {
		s.pub.Restart()
	}
	if s.trt != nil {
		s.trt.restart()
	}
	in, err := s.newInstance()
	if err != nil {
		return err
	}
	s.cur = in
	s.log.Info("engine restarted")
	return nil
}

// publishBatch publishes an engine batch as a vLLM KVEventBatch stamped with
// the wall clock. It runs on the runner's goroutine.
func (s *server) publishBatch(b simengine.EventBatch) {
	if s.trt != nil {
		s.trt.push(b.Events)
	}
	if s.pub == nil {
		return
	}
	out := kvevents.Batch{
		TS:     float64(time.Now().UnixNano()) / 1e9,
		Events: b.Events,
	}
	var err error
	switch s.cfg.shape.Dialect {
	case simengine.DialectSGLang:
		err = s.publishSGLang(out)
	case simengine.DialectTRTLLM:
		err = s.publishTRTLLM(out)
	default:
		_, err = s.pub.Publish(out)
	}
	if err != nil && !errors.Is(err, kvevents.ErrClosed) {
		s.log.Warn("publish kv events", "err", err)
	}
}

// publishSGLang publishes b in SGLang's encoding, its attn_dp_rank the
// configured rank (SGLang's publisher fills it in as vLLM's does).
func (s *server) publishSGLang(b kvevents.Batch) error {
	rank := s.cfg.dpRank
	b.DPRank = &rank
	form := kvevents.FormArray
	if s.cfg.eventsForm == "map" {
		form = kvevents.FormMap
	}
	payload, err := simengine.EncodeSGLangBatch(b, form)
	if err != nil {
		return fmt.Errorf("encode sglang batch: %w", err)
	}
	_, err = s.pub.PublishPayload(payload)
	return err
}

// Addr returns the HTTP listener's address.
func (s *server) Addr() string { return s.listener.Addr().String() }

// EventsAddr returns the bound PUB address, or "" if events are off or the
// PUB socket connects.
func (s *server) EventsAddr() string {
	if s.pub == nil || s.pub.Addr() == nil {
		return ""
	}
	return s.pub.Addr().String()
}

// ReplayAddr returns the bound replay address, or "" without replay.
func (s *server) ReplayAddr() string {
	if s.pub == nil || s.pub.ReplayAddr() == nil {
		return ""
	}
	return s.pub.ReplayAddr().String()
}

// serve serves HTTP until ctx is done, then shuts down.
func (s *server) serve(ctx context.Context, ready func(*server)) error {
	attrs := []any{"addr", s.Addr(), "model", s.cfg.model,
		"profile", s.engCfg.Profile.Name, "kv_blocks", s.cfg.kvBlocks, "block_size", s.cfg.blockSize,
		"time_scale", s.cfg.timeScale, "kv_events", s.cfg.eventsEndpoint, "events_addr", s.EventsAddr()}
	if len(s.ranks) > 1 {
		attrs = append(attrs, "data_parallel_size", len(s.ranks))
	}
	if s.cfg.kvEventsPull {
		attrs = append(attrs, "kv_events_pull", "POST /kv_cache_events")
	}
	s.log.Info("enginesim listening", attrs...)
	errc := make(chan error, 1)
	go func() { errc <- httpserve.Serve(s.httpSrv, s.listener) }()
	if ready != nil {
		ready(s)
	}
	var err error
	select {
	case err = <-errc:
		err = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Stop the engines first so streaming handlers end promptly.
		s.stopAll()
		if e := s.httpSrv.Shutdown(shutCtx); e != nil {
			err = fmt.Errorf("shutdown: %w", e)
		}
		cancel()
	}
	s.stopAll()
	s.closePublishers()
	s.log.Info("enginesim stopped")
	return err
}

func (s *server) closePublisher() {
	if s.pub != nil {
		if err := s.pub.Close(); err != nil {
			s.log.Warn("close kv event publisher", "err", err)
		}
	}
}

// engineLabel is the metrics' engine label.
func (s *server) engineLabel() string { return strconv.Itoa(s.cfg.dpRank) }
