// Package memreturn gives a process's garbage back to the operating system
// when a burst of work ends.
//
// Go's collector lets the heap grow to twice its live size between cycles,
// and once the work stops nothing allocates, so no cycle runs: the garbage
// of the last burst stays in the process's resident memory until the
// runtime's periodic forced collection (two minutes) and its background
// scavenger return it, slowly. For a directory node whose live heap is
// hundreds of megabytes, that is a resident size that depends on when the
// last burst happened to stop rather than on what the node holds. A Watcher
// notices the end of a burst (an activity counter that stopped moving after
// enough allocation) and then collects and returns the freed memory once
// (runtime/debug.FreeOSMemory), at most once per interval.
package memreturn

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Defaults of Config.
const (
	DefaultIdle       = time.Second
	DefaultMinGarbage = 64 << 20
	DefaultEvery      = 5 * time.Second
)

// Config shapes a Watcher. Activity is required; a zero field otherwise
// means its default.
type Config struct {
	// Activity is a counter that moves while the process works (a
	// directory node's applied log index).
	Activity func() uint64
	// Idle is how long Activity must stand still to end a burst.
	Idle time.Duration
	// MinGarbage is how many bytes the process must have allocated since
	// the last return for a burst to be worth returning.
	MinGarbage uint64
	// Every is the least time between two returns.
	Every time.Duration
	// OnReturn, if set, is called after each return with the bytes
	// allocated since the one before (for a metric or a log line).
	OnReturn func(allocated uint64)

	// Test hooks: the clock, the cumulative bytes allocated, the return.
	now       func() time.Time
	allocated func() uint64
	free      func()
}

// Watcher returns memory at the end of bursts; see the package comment.
type Watcher struct {
	cfg Config

	lastActivity uint64
	activeAt     time.Time // when Activity last moved
	returnedAt   time.Time // when memory was last returned
	allocAtRet   uint64    // bytes allocated at the last return
}

// New returns a Watcher for cfg.
func New(cfg Config) *Watcher {
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.MinGarbage == 0 {
		cfg.MinGarbage = DefaultMinGarbage
	}
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.allocated == nil {
		cfg.allocated = heapAllocated
	}
	if cfg.free == nil {
		cfg.free = debug.FreeOSMemory
	}
	w := &Watcher{cfg: cfg}
	now := cfg.now()
	w.lastActivity, w.activeAt, w.allocAtRet = cfg.Activity(), now, cfg.allocated()
	return w
}

// Run checks for the end of a burst every quarter of Idle until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.cfg.Idle / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Step()
		}
	}
}

// Step looks once: it returns memory, and reports true, when Activity has
// not moved for Idle, the process allocated MinGarbage since the last
// return and the last return is at least Every ago.
func (w *Watcher) Step() bool {
	now := w.cfg.now()
	if a := w.cfg.Activity(); a != w.lastActivity {
		w.lastActivity, w.activeAt = a, now
		return false
	}
	if now.Sub(w.activeAt) < w.cfg.Idle || (!w.returnedAt.IsZero() && now.Sub(w.returnedAt) < w.cfg.Every) {
		return false
	}
	alloc := w.cfg.allocated()
	if alloc-w.allocAtRet < w.cfg.MinGarbage {
		return false
	}
	w.cfg.free()
	if w.cfg.OnReturn != nil {
		w.cfg.OnReturn(alloc - w.allocAtRet)
	}
	w.returnedAt, w.allocAtRet = now, alloc
	return true
}

// heapAllocated is the bytes the process has allocated on the heap since
// it started.
func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
