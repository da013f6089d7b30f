package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// specMaxEntries bounds one worker's speculative set; past it, expired
// entries are swept and, if that is not enough, the set starts over.
const specMaxEntries = 1 << 21

// specPendingMax bounds how long a placed request's chain counts as present
// while the request waits for its first byte.
const specPendingMax = 10 * time.Minute

// specSet holds the block hashes of chains the router placed on one worker:
// while their requests wait there for their prefill, and for ttl after it.
// The engine will hold them as soon as it has run the prefill, before its
// events reach the directory, so a burst of requests sharing a prefix finds
// them at once (the speculative entries of docs/architecture.md, section 4).
type specSet struct {
	ttl time.Duration
	mu  sync.Mutex
	exp map[uint64]int64 // hash -> expiry, unix nanos
	// size is len(exp), set under mu and read without it: a decision asks
	// every candidate's set, and most candidates' sets are empty.
	size atomic.Int64
	// nextSweep is when expired entries are next removed (unix nanos).
	nextSweep int64
}

func newSpecSet(ttl time.Duration) *specSet {
	return &specSet{ttl: ttl, exp: make(map[uint64]int64)}
}

// add records chain as present from now until now+ttl.
func (s *specSet) add(chain []uint64, now time.Time) { s.put(chain, now, now.Add(s.ttl)) }

// pending records chain as present until further notice (at most
// specPendingMax): its request is queued on the worker, and a request that
// shares its prefix should queue behind it rather than recompute elsewhere,
// however long the queue. add shortens it to the TTL once the request's
// prefill is done.
func (s *specSet) pending(chain []uint64, now time.Time) { s.put(chain, now, now.Add(specPendingMax)) }

// put records chain as present from now until until.
func (s *specSet) put(chain []uint64, now, untilT time.Time) {
	if s.ttl <= 0 || len(chain) == 0 {
		return
	}
	n := now.UnixNano()
	until := untilT.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if n >= s.nextSweep || len(s.exp)+len(chain) > specMaxEntries {
		for h, e := range s.exp {
			if e <= n {
				delete(s.exp, h)
			}
		}
		if len(s.exp)+len(chain) > specMaxEntries {
			clear(s.exp)
		}
		s.nextSweep = n + int64(s.ttl)
	}
	for _, h := range chain {
		s.exp[h] = until
	}
	s.size.Store(int64(len(s.exp)))
}

// matched returns how many leading blocks of chain are present at now.
func (s *specSet) matched(chain []uint64, now time.Time) int {
	if s.ttl <= 0 || len(chain) == 0 || s.size.Load() == 0 {
		return 0
	}
	n := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.exp) == 0 {
		return 0
	}
	i := 0
	for ; i < len(chain); i++ {
		if e, ok := s.exp[chain[i]]; !ok || e <= n {
			break
		}
	}
	return i
}

func loadFloat(a *atomic.Uint64) float64     { return math.Float64frombits(a.Load()) }
func storeFloat(a *atomic.Uint64, v float64) { a.Store(math.Float64bits(v)) }
