package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// repeatWindow is how soon after the first signal another one counts as
// the same stop: a terminal's Ctrl-C reaches the whole process group, so
// under `go run` or `timeout` the same stop arrives twice at once.
const repeatWindow = time.Second

// Signals applies the stop rule of every kvdir binary to a channel of
// signals: the first one cancels Context (stop cleanly); one received a
// second or more later closes Forced (stop now).
type Signals struct {
	ctx    context.Context
	cancel context.CancelFunc
	forced chan struct{}
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	first os.Signal
	last  os.Signal
}

// Notify returns a channel that receives SIGINT and SIGTERM, and a
// function that stops that.
func Notify() (<-chan os.Signal, func()) {
	c := make(chan os.Signal, 2)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	return c, func() { signal.Stop(c) }
}

// WatchSignals follows sigs until Stop or parent ends.
func WatchSignals(parent context.Context, sigs <-chan os.Signal) *Signals {
	ctx, cancel := context.WithCancel(parent)
	s := &Signals{ctx: ctx, cancel: cancel, forced: make(chan struct{}), done: make(chan struct{})}
	go s.watch(sigs)
	return s
}

func (s *Signals) watch(sigs <-chan os.Signal) {
	var first time.Time
	for {
		select {
		case <-s.done:
			return
		case sig, ok := <-sigs:
			if !ok {
				return
			}
			s.mu.Lock()
			if s.first == nil {
				s.first, first = sig, time.Now()
				s.mu.Unlock()
				s.cancel()
				continue
			}
			if time.Since(first) < repeatWindow {
				s.mu.Unlock()
				continue
			}
			s.last = sig
			s.mu.Unlock()
			close(s.forced)
			return
		}
	}
}

// Context is cancelled by the first signal (or when the parent ends).
func (s *Signals) Context() context.Context { return s.ctx }

// Forced is closed by a second signal, one second or more after the first.
func (s *Signals) Forced() <-chan struct{} { return s.forced }

// First returns the first signal received, nil if none.
func (s *Signals) First() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// Second returns the signal that closed Forced, nil if none.
func (s *Signals) Second() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Stop stops following the signals and cancels Context.
func (s *Signals) Stop() {
	s.once.Do(func() { close(s.done) })
	s.cancel()
}

// exit ends the process; tests replace it.
var exit = os.Exit

// SignalContext returns a context cancelled on the first SIGINT or
// SIGTERM the process receives. A second one, a second or more later,
// ends the process at once with ExitInterrupted (130), after the line
// "<name>: second signal (...): exiting without finishing the shutdown"
// on stderr. Call stop when done.
func SignalContext(parent context.Context, name string, stderr io.Writer) (ctx context.Context, stop func()) {
	sigs, unnotify := Notify()
	s := WatchSignals(parent, sigs)
	go func() {
		select {
		case <-s.Forced():
			fmt.Fprintf(stderr, "%s: second signal (%v): exiting without finishing the shutdown\n", name, s.Second())
			exit(ExitInterrupted)
		case <-s.done:
		}
	}()
	return s.Context(), func() { unnotify(); s.Stop() }
}
