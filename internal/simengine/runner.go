package simengine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// Errors returned by a RealtimeRunner.
var (
	ErrClosed         = errors.New("engine: runner closed")
	ErrAlreadyRunning = errors.New("engine: runner already started")
)

// Scale limits of a RealtimeRunner (0 is also allowed).
const (
	MinScale = 1e-6
	MaxScale = 1e6
)

// Stream is the output of a request submitted to a RealtimeRunner.
type Stream struct {
	ID string
	// Tokens receives the generated token ids as their steps complete and is
	// closed after the last one (or on abort). It is buffered to MaxTokens, so
	// a slow reader never blocks the engine.
	Tokens <-chan uint32
	// Done receives the Result once, after Tokens is closed.
	Done <-chan Result
}

type stream struct {
	tokens chan uint32
	done   chan Result
}

func (s *stream) finish(r Result) {
	close(s.tokens)
	s.done <- r
}

// RealtimeRunner drives an Engine on the wall clock: it loops Step, sleeping
// scale × each step's modelled duration (scale 1 is real time, 0 does not
// sleep at all), delivers tokens and results to the submitters' streams and
// forwards the cache events to the sink after each step's sleep, when vLLM
// would publish them. Engine times (Result fields, EventBatch.Time) are
// modelled times: wall time since Run started divided by scale (with scale 0,
// the sum of the step durations). Its methods are safe for concurrent use.
type RealtimeRunner struct {
	scale float64
	sink  EventSink
	wake  chan struct{}

	mu      sync.Mutex
	eng     *Engine
	streams map[string]*stream
	pending []EventBatch
	start   time.Time
	started bool
	closed  bool
}

// NewRealtimeRunner returns a runner for a new engine built from cfg. sink
// may be nil. scale is 0 or in [MinScale, MaxScale].
func NewRealtimeRunner(cfg Config, sink EventSink, scale float64) (*RealtimeRunner, error) {
	if math.IsNaN(scale) || (scale != 0 && (scale < MinScale || scale > MaxScale)) {
		return nil, fmt.Errorf("%w: time scale %v, want 0 or in [%g, %g]", ErrInvalidConfig, scale, MinScale, MaxScale)
	}
	r := &RealtimeRunner{
		scale:   scale,
		sink:    sink,
		wake:    make(chan struct{}, 1),
		streams: make(map[string]*stream),
		start:   time.Now(),
	}
	eng, err := New(cfg, SinkFunc(func(b EventBatch) { r.pending = append(r.pending, b) }))
	if err != nil {
		return nil, err
	}
	r.eng = eng
	return r, nil
}

// Run drives the engine until ctx is done, then aborts the requests in flight
// (their streams end with FinishAbort), closes the runner and returns
// ctx.Err(). It may be called once.
func (r *RealtimeRunner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started || r.closed {
		r.mu.Unlock()
		return ErrAlreadyRunning
	}
	r.started = true
	r.start = time.Now()
	r.mu.Unlock()
	defer r.shutdown()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.mu.Lock()
		pre := r.takePending()
		res := r.eng.Step(r.modelNowLocked())
		post := r.takePending()
		r.mu.Unlock()
		r.forward(pre)
		if res.Idle {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.wake:
			}
			continue
		}
		if r.scale > 0 {
			if d := time.Until(r.start.Add(time.Duration(float64(res.End) * r.scale))); d > 0 {
				timer.Reset(d)
				select {
				case <-ctx.Done():
					timer.Stop()
					return ctx.Err()
				case <-timer.C:
				}
			}
		}
		r.forward(post)
		r.deliver(res)
	}
}

// Submit queues a request and returns its stream.
func (r *RealtimeRunner) Submit(req Request) (*Stream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if err := r.eng.Submit(r.arrivalLocked(), req); err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	st := &stream{tokens: make(chan uint32, req.MaxTokens), done: make(chan Result, 1)}
	r.streams[req.ID] = st
	r.signal()
	return &Stream{ID: req.ID, Tokens: st.tokens, Done: st.done}, nil
}

// Abort aborts a request in flight; its stream ends with FinishAbort. It
// reports false if the request is not in flight.
func (r *RealtimeRunner) Abort(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.eng.Abort(r.modelNowLocked(), id)
	if !ok {
		return false
	}
	if st, ok := r.streams[id]; ok {
		delete(r.streams, id)
		st.finish(res)
	}
	r.signal()
	return true
}

// Reset clears the prefix cache (see Engine.Reset). AllBlocksCleared reaches
// the sink from the runner's goroutine, after the events of earlier steps.
func (r *RealtimeRunner) Reset() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.eng.Reset(r.modelNowLocked()); err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	r.signal()
	return nil
}

// Stats returns the engine's statistics.
func (r *RealtimeRunner) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats()
}

// Profile returns the engine's timing profile.
func (r *RealtimeRunner) Profile() costmodel.Profile { return r.eng.cfg.Profile }

func (r *RealtimeRunner) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// arrivalLocked is the modelled time of a request arriving now.
func (r *RealtimeRunner) arrivalLocked() time.Duration {
	if r.scale == 0 || !r.started {
		return r.eng.Now()
	}
	return r.wallModelLocked()
}

// modelNowLocked is the modelled time at which the next step may start.
func (r *RealtimeRunner) modelNowLocked() time.Duration {
	if r.scale == 0 || !r.started {
		return r.eng.Now()
	}
	return max(r.eng.Now(), r.wallModelLocked())
}

func (r *RealtimeRunner) wallModelLocked() time.Duration {
	return time.Duration(float64(time.Since(r.start)) / r.scale)
}

func (r *RealtimeRunner) takePending() []EventBatch {
	p := r.pending
	r.pending = nil
	return p
}

func (r *RealtimeRunner) forward(batches []EventBatch) {
	if r.sink == nil {
		return
	}
	for _, b := range batches {
		r.sink.Publish(b)
	}
}

// deliver sends a step's tokens and results to their streams. Sends never
// block: a stream's buffer holds all its tokens.
func (r *RealtimeRunner) deliver(res StepResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range res.Tokens {
		if st, ok := r.streams[t.RequestID]; ok {
			st.tokens <- t.ID
		}
	}
	for _, f := range res.Finished {
		if st, ok := r.streams[f.ID]; ok {
			delete(r.streams, f.ID)
			st.finish(f)
		}
	}
}

func (r *RealtimeRunner) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for id, st := range r.streams {
		res, _ := r.eng.Abort(r.eng.Now(), id)
		res.ID, res.FinishReason = id, FinishAbort
		st.finish(res)
	}
	clear(r.streams)
}
