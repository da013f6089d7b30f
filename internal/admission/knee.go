// Package admission decides when a request should wait at the router
// instead of being placed at once (late binding), and holds the waiting
// requests in a bounded queue.
//
// Placing a request commits it to one engine's queue. Under overload every
// engine's queue is long, and a request placed at arrival is bound to a
// worker on information that will be stale by the time it runs; the same
// request held at the router is placed later, on fresh loads and a fresh
// view of the caches. The rule of when to hold is [Knee]; [Queue] is the
// bounded, per-session FIFO of held requests. The router (internal/router)
// and the simulator (bench/sim) both use them, so that the simulated late
// binding is the router's.
package admission

import (
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
)

// DefaultKneeSteps is the knee interval in engine steps (see [Knee]).
const DefaultKneeSteps = 2

// Knee says when a worker is past its knee: when it cannot start a new
// prefill within the knee interval, KneeSteps engine steps.
//
// Why steps, and why two. A chunked-prefill engine (vLLM, SGLang) spends at
// most ChunkTokens prompt tokens per step on prefills, whichever requests
// they belong to, so the prefill work queued on a worker drains at
// ChunkTokens per step and a new request starts its prefill after
// queued/ChunkTokens steps. Sending the request now instead of later only
// pays when it would start before the router learns anything new. The
// router learns at step ends (a first token, a finish, a scrape: each is
// the result of a step), so one step of queued work is what the engine
// needs to stay busy until the router hears from it, and one more covers
// the delay of that news (the scrape interval, the first byte's way back)
// and the placement of the next request. Below two steps of queued work a
// held request would leave the engine idle; above it, the request would
// only wait in the engine's queue, bound to a worker it can no longer
// leave. The cost model prices the interval ([Knee.Interval]): two
// 2,048-token chunks of llama3-70b take about 1 s, two 8,192-token ones 4 s.
//
// Queued prefill work is the larger of two estimates of the same tokens:
// the router's queued uncached prefill (tokens it sent that have not
// produced a first token) and the engine's waiting requests, counted as
// requests of the size of the one being placed (as kvdir's cost model
// counts queued requests). Their sum would count this router's own
// waiting requests twice; the engine's count adds what the router does
// not know of (requests from other routers or clients, preempted
// requests waiting for KV memory).
type Knee struct {
	// ChunkTokens is the engine's prefill token budget per step
	// (vLLM's max_num_batched_tokens; > 0).
	ChunkTokens int
	// Steps is the knee interval in engine steps (0: DefaultKneeSteps).
	Steps int
	// Prefill prices a step for Interval (optional).
	Prefill costmodel.PrefillModel
}

// NewKnee returns the knee of engines with a ChunkTokens budget per step
// (0: 2048, kvdir's default), timed by prof.
func NewKnee(prof costmodel.Profile, chunkTokens int) Knee {
	if chunkTokens <= 0 {
		chunkTokens = 2048
	}
	return Knee{ChunkTokens: chunkTokens, Steps: DefaultKneeSteps, Prefill: prof.Prefill}
}

// Limit is the queued prefill tokens past which a worker is past its knee.
func (k Knee) Limit() int {
	steps := k.Steps
	if steps <= 0 {
		steps = DefaultKneeSteps
	}
	return steps * max(k.ChunkTokens, 1)
}

// Interval is the knee interval as the cost model prices it: Steps full
// chunks of cold prefill.
func (k Knee) Interval() time.Duration {
	steps := k.Steps
	if steps <= 0 {
		steps = DefaultKneeSteps
	}
	return costmodel.MillisToDuration(float64(steps) * k.Prefill.Millis(max(k.ChunkTokens, 1), 0))
}

// Queued is the prefill work queued on a worker of load l, in tokens, as a
// request of promptTokens tokens sees it.
func (k Knee) Queued(l placement.Load, promptTokens int) int {
	return max(l.QueuedPrefillTokens, max(l.Waiting, 0)*max(promptTokens, 1), 0)
}

// Past reports whether a worker of load l is past its knee for a request
// of promptTokens tokens.
func (k Knee) Past(l placement.Load, promptTokens int) bool {
	return k.Queued(l, promptTokens) > k.Limit()
}

// AllPast reports whether every one of cands is past its knee (false for
// none: then there is nothing to wait for).
func (k Knee) AllPast(cands []placement.Candidate, promptTokens int) bool {
	for i := range cands {
		if !k.Past(cands[i].Load, promptTokens) {
			return false
		}
	}
	return len(cands) > 0
}
