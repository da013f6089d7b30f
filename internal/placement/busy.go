package placement

import (
	"math"
	"time"
)

// BusyMeter measures how busy a worker's prefill pipeline has recently been:
// the fraction of time, exponentially weighted with time constant Window,
// during which at least one request routed to it had not yet produced its
// first token. It is the router's own accounting (placements and first
// tokens), so it needs no engine metric. The zero BusyMeter is ready, with
// DefaultBusyWindow. A BusyMeter is not safe for concurrent use; its owner
// serialises calls, with non-decreasing times.
type BusyMeter struct {
	window  time.Duration
	pending int
	last    time.Duration // time of the last update
	value   float64       // busy fraction as of last
}

// DefaultBusyWindow is the time constant of a BusyMeter: a few prefills
// long, so that the fraction says whether the worker is busy now and has
// been for a while, not over a whole session's life (kvbench sim, agent
// sessions: 30 s and 120 s let a busy period's effect linger after it
// ended, and placed worse near capacity).
const DefaultBusyWindow = 10 * time.Second

// NewBusyMeter returns a meter with time constant window (0:
// DefaultBusyWindow).
func NewBusyMeter(window time.Duration) *BusyMeter {
	if window <= 0 {
		window = DefaultBusyWindow
	}
	return &BusyMeter{window: window}
}

// advance integrates the state since the last update up to now.
func (m *BusyMeter) advance(now time.Duration) {
	if now <= m.last {
		return
	}
	if m.pending == 0 && m.value == 0 {
		// Idle and fully decayed: the value stays 0 (no exponential to
		// compute, which a router does for every candidate it scores).
		m.last = now
		return
	}
	w := m.window
	if w <= 0 {
		w = DefaultBusyWindow
	}
	decay := math.Exp(-float64(now-m.last) / float64(w))
	busy := 0.0
	if m.pending > 0 {
		busy = 1
	}
	m.value = busy + (m.value-busy)*decay
	m.last = now
}

// Add records, at now, delta more (or, negative, fewer) requests awaiting
// their first token.
func (m *BusyMeter) Add(now time.Duration, delta int) {
	m.advance(now)
	m.pending = max(m.pending+delta, 0)
}

// Value returns the busy fraction as of now, in [0, 1].
func (m *BusyMeter) Value(now time.Duration) float64 {
	m.advance(now)
	return min(max(m.value, 0), 1)
}

// CombineBusy is the busy fraction of a worker that two independent
// sources of requests keep busy a and b of the time: the router's own
// placements and the other routers' (shared intents).
func CombineBusy(a, b float64) float64 {
	a, b = min(max(a, 0), 1), min(max(b, 0), 1)
	return a + b - a*b
}

// Pending returns the requests awaiting their first token.
func (m *BusyMeter) Pending() int { return m.pending }
