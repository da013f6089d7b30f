package simengine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// syncSink is a goroutine-safe EventSink.
type syncSink struct {
	mu     sync.Mutex
	events []kvevents.Event
	signal chan struct{}
}

func newSyncSink() *syncSink { return &syncSink{signal: make(chan struct{}, 1)} }

func (s *syncSink) Publish(b EventBatch) {
	s.mu.Lock()
	s.events = append(s.events, b.Events...)
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *syncSink) snapshot() []kvevents.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

func startRunner(t *testing.T, cfg Config, sink EventSink, scale float64) (*RealtimeRunner, func() error) {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = mustProfile(t, "llama3-8b")
	}
	r, err := NewRealtimeRunner(cfg, sink, scale)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return r, stop
}

// collect reads a stream to its end.
func collect(s *Stream) ([]uint32, Result, error) {
	var toks []uint32
	timeout := time.After(20 * time.Second)
	for {
		select {
		case tok, ok := <-s.Tokens:
			if !ok {
				select {
				case res := <-s.Done:
					return toks, res, nil
				case <-timeout:
					return nil, Result{}, fmt.Errorf("%s: no result", s.ID)
				}
			}
			toks = append(toks, tok)
		case <-timeout:
			return nil, Result{}, fmt.Errorf("%s: stream stalled after %d tokens", s.ID, len(toks))
		}
	}
}

func mustCollect(t *testing.T, s *Stream) ([]uint32, Result) {
	t.Helper()
	toks, res, err := collect(s)
	if err != nil {
		t.Fatal(err)
	}
	return toks, res
}

// TestRunnerScaleZero runs 10,000 short requests through a runner that never
// sleeps, submitted concurrently.
func TestRunnerScaleZero(t *testing.T) {
	r, stop := startRunner(t, Config{CapacityBlocks: 8192}, nil, 0)
	const n, workers = 10000, 8
	system := randTokens(rand.New(rand.NewPCG(1, 1)), 48, 128000)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			var streams []*Stream
			for i := w; i < n; i += workers {
				p := append(slices.Clone(system), randTokens(rng, 16, 128000)...)
				s, err := r.Submit(Request{ID: fmt.Sprint(i), Tokens: p, MaxTokens: 4})
				if err != nil {
					errs <- err
					return
				}
				streams = append(streams, s)
			}
			for _, s := range streams {
				toks, res, err := collect(s)
				if err != nil {
					errs <- err
					return
				}
				if len(toks) != 4 || !slices.Equal(toks, res.Output) || res.FinishReason != FinishLength || res.CachedTokens != 48 && res.CachedTokens != 0 {
					errs <- fmt.Errorf("%s: tokens %v, result %+v", s.ID, toks, res)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	st := r.Stats()
	t.Logf("10,000 requests in %v wall, %v modelled; %+v", elapsed, st.Now, st)
	if st.Finished != n || st.PrefixHits < int64(n-workers)*32 {
		t.Fatalf("stats %+v", st)
	}
	if elapsed > 20*time.Second {
		t.Fatalf("too slow: %v", elapsed)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if _, err := r.Submit(Request{ID: "late", Tokens: []uint32{1}, MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
}

// TestRunnerRealtime checks sleeping, modelled times and event forwarding.
func TestRunnerRealtime(t *testing.T) {
	sink := newSyncSink()
	const scale = 0.5
	r, stop := startRunner(t, Config{CapacityBlocks: 4096}, sink, scale)
	_, turn2 := twoTurns()
	start := time.Now()
	s, err := r.Submit(Request{ID: "a", Tokens: turn2, MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	toks, res := mustCollect(t, s)
	wall := time.Since(start)
	p := r.Profile()
	prefill := costmodel.MillisToDuration(p.Prefill.Millis(5100, 0))
	if len(toks) != 3 || res.TTFT() < prefill || res.TTFT() > prefill+25*time.Millisecond {
		t.Fatalf("tokens %d, TTFT %v, want about %v", len(toks), res.TTFT(), prefill)
	}
	modelled := res.Finish - res.Arrival
	if min := time.Duration(float64(modelled) * scale * 0.95); wall < min {
		t.Fatalf("finished after %v wall, want >= %v (scale %v × %v)", wall, min, scale, modelled)
	}
	t.Logf("TTFT %v, %v modelled, %v wall", res.TTFT(), modelled, wall)
	// 5,100 + 2 fed-back tokens: 318 full blocks, announced in one event.
	evs := sink.snapshot()
	if len(evs) != 1 || len(evs[0].(*kvevents.BlockStored).BlockHashes) != 318 {
		t.Fatalf("events: %d", len(evs))
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
}

// TestRunnerAbortResetShutdown checks aborts, resets and shutdown.
func TestRunnerAbortResetShutdown(t *testing.T) {
	sink := newSyncSink()
	r, stop := startRunner(t, Config{CapacityBlocks: 4096}, sink, 1)
	long, err := r.Submit(Request{ID: "long", Tokens: fill(64, 5), MaxTokens: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Submit(Request{ID: "long", Tokens: fill(64, 5), MaxTokens: 1}); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("duplicate: %v", err)
	}
	<-long.Tokens // first token
	if err := r.Reset(); !errors.Is(err, ErrCacheBusy) {
		t.Fatalf("reset while running: %v", err)
	}
	if !r.Abort("long") || r.Abort("long") {
		t.Fatal("abort")
	}
	toks, res := mustCollect(t, long)
	if res.FinishReason != FinishAbort || len(res.Output) < 1 || len(toks) > len(res.Output) {
		t.Fatalf("aborted: %d tokens, %+v", len(toks), res)
	}
	if err := r.Reset(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		evs := sink.snapshot()
		if len(evs) > 0 {
			if _, ok := evs[len(evs)-1].(*kvevents.AllBlocksCleared); ok {
				break
			}
		}
		select {
		case <-sink.signal:
		case <-deadline:
			t.Fatal("AllBlocksCleared not forwarded")
		}
	}
	if st := r.Stats(); st.Running != 0 || st.UsedBlocks != 0 {
		t.Fatalf("stats %+v", st)
	}

	pending, err := r.Submit(Request{ID: "pending", Tokens: fill(64, 6), MaxTokens: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, res := mustCollect(t, pending); res.FinishReason != FinishAbort || res.ID != "pending" {
		t.Fatalf("shutdown: %+v", res)
	}
}

func TestRunnerConfigErrors(t *testing.T) {
	p := mustProfile(t, "llama3-8b")
	for _, scale := range []float64{-1, 1e-9, 1e9} {
		if _, err := NewRealtimeRunner(Config{Profile: p, CapacityBlocks: 1}, nil, scale); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("scale %v: %v", scale, err)
		}
	}
	if _, err := NewRealtimeRunner(Config{Profile: p}, nil, 0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no capacity: %v", err)
	}
}
