package sim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Values of Config.Balance.
const (
	// BalanceRoundRobin sends request i to router i mod Routers.
	BalanceRoundRobin = "round-robin"
	// BalanceRandom sends each request to a router drawn by Seed.
	BalanceRandom = "random"
	// BalanceSession sends every request of a session (SessionKey) to one
	// router, chosen by a hash of the key, as a balancer hashing on
	// X-Session-Id does.
	BalanceSession = "session"
)

// Balances lists the values of Config.Balance.
func Balances() []string { return []string{BalanceRoundRobin, BalanceRandom, BalanceSession} }

// pickRouter returns the router the balancer sends record i to.
func (s *state) pickRouter(i int) *router {
	n := len(s.routers)
	if n == 1 {
		return s.routers[0]
	}
	switch s.cfg.Balance {
	case BalanceRandom:
		return s.routers[s.balance.IntN(n)]
	case BalanceSession:
		h := fnv.New64a()
		h.Write([]byte(SessionKey(&s.recs[i])))
		return s.routers[h.Sum64()%uint64(n)]
	}
	return s.routers[i%n]
}

// Streams of the run's random sources besides the policies' (PCG's second
// word, with Seed as the first).
const (
	balanceStream = 0x62616c616e6365 // "balance"
	jitterStream  = 0x6a6974746572   // "jitter"
)

// router is one router: its policy instance and the directory view it
// matches against. Its speculative entries and accounting are the intents
// of the replicas it counts (see candidate).
type router struct {
	idx int
	pol placement.Policy
	cal *costmodel.Calibrator // with Config.Calibrate
	// view is its directory replica, shared with the routers of the same lag
	// (they would hold the same index).
	view *view
}

// view is one replica of the directory's index, applying each engine batch
// EventLag + the router's view lag after the step that produced it.
type view struct {
	lag   time.Duration
	index *radix.Index
	next  []int // per replica: batches of its log applied
}

// newRouters creates the routers, their policies and their views.
func (s *state) newRouters() error {
	byLag := make(map[time.Duration]*view)
	for k, lag := range ViewLags(s.cfg) {
		var cal *costmodel.Calibrator
		if s.cfg.Calibrate {
			var err error
			cal, err = costmodel.NewCalibrator(s.cfg.PolicyProfile, costmodel.CalibratorConfig{ChunkTokens: s.cfg.MaxBatchedTokens})
			if err != nil {
				return fmt.Errorf("sim: %w", err)
			}
		}
		pol := s.cfg.Impl
		if pol == nil {
			opts := placement.Options{
				Seed: s.cfg.Seed + int64(k), Profile: s.cfg.PolicyProfile, ChunkTokens: s.cfg.MaxBatchedTokens,
			}
			if cal != nil {
				opts.LiveProfile = cal
			}
			var err error
			if pol, err = placement.New(s.cfg.Policy, opts); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
		}
		v := byLag[lag]
		if v == nil {
			v = &view{lag: s.cfg.EventLag + lag, index: radix.New(radix.Options{})}
			byLag[lag] = v
			s.views = append(s.views, v)
		}
		s.routers = append(s.routers, &router{idx: k, pol: pol, cal: cal, view: v})
	}
	return nil
}

// ViewLags returns each router's directory view lag beyond EventLag for
// cfg, as Run draws them.
func ViewLags(cfg Config) []time.Duration {
	n := max(cfg.Routers, 1)
	jitter := rand.New(rand.NewPCG(uint64(cfg.Seed), jitterStream))
	out := make([]time.Duration, n)
	for k := range out {
		out[k] = cfg.RouterViewLag
		if j := cfg.RouterViewJitter; j > 0 {
			out[k] = max(0, out[k]+time.Duration(jitter.Int64N(2*int64(j)+1))-j)
		}
	}
	return out
}

// intentLag returns how long rt takes to learn of a change to x, and
// whether it learns of it at all.
func (s *state) intentLag(rt *router, x *intent) (time.Duration, bool) {
	switch {
	case x.router == rt.idx:
		return 0, true
	case s.cfg.SharedIntents:
		return s.cfg.IntentLag, true
	}
	return 0, false
}

// specExpiry is when x's speculative entry ends for a router that has (or
// has not) learned of its first token: held while the request waits for it
// (at most SpeculativePendingMax), then for SpeculativeTTL; with
// SpeculativeFixedTTL, SpeculativeTTL after the placement.
func (s *state) specExpiry(x *intent, started bool) time.Duration {
	switch {
	case s.cfg.SpeculativeFixedTTL:
		return x.placed + s.cfg.SpeculativeTTL
	case started:
		return x.started + s.cfg.SpeculativeTTL
	}
	return x.placed + SpeculativePendingMax
}

// candidate is replica r as router rt sees it at now: the engine's gauges,
// and from the intents it knows of, its speculative depth for s.chain, the
// requests in flight and the uncached prefill tokens queued.
func (s *state) candidate(rt *router, r *replica, now time.Duration) placement.Candidate {
	l := r.load
	l.InFlight, l.QueuedPrefillTokens = 0, 0
	depth := 0
	for _, x := range r.intents {
		lag, ok := s.intentLag(rt, x)
		if !ok || !seen(x.placed, lag, now) {
			continue
		}
		if !seen(x.finished, lag, now) {
			l.InFlight++
			if !seen(x.started, lag, now) {
				l.QueuedPrefillTokens += x.uncached
			}
		}
		if x.chain != nil && !seen(x.dropped, lag, now) && s.specExpiry(x, seen(x.started, lag, now)) > now {
			depth = max(depth, commonPrefix(s.chain, x.chain))
		}
	}
	l.Busy = r.own[rt.idx].Value(now)
	l.CapacityTokens = s.cfg.KVBlocks * s.cfg.BlockSize
	if s.cfg.SharedIntents {
		l.Busy = placement.CombineBusy(l.Busy, r.peers[rt.idx].Value(now))
	}
	return placement.Candidate{Worker: r.id, MatchedBlocks: depth, Load: l}
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	k := 0
	for k < n && a[k] == b[k] {
		k++
	}
	return k
}

// expire drops, as the placing router does at a placement, the speculative
// entries that ended at or before now, and forgets the intents no router
// counts any more.
func (s *state) expire(now time.Duration) {
	lag := time.Duration(0)
	if s.cfg.SharedIntents {
		lag = s.cfg.IntentLag
	}
	for _, r := range s.reps {
		for _, x := range r.intents {
			if x.chain != nil && x.dropped == never && s.specExpiry(x, seen(x.started, 0, now)) <= now {
				x.dropped = now
			}
		}
		r.intents = slices.DeleteFunc(r.intents, func(x *intent) bool {
			return seen(x.finished, lag, now) && (x.chain == nil || seen(x.dropped, lag, now))
		})
	}
}

// flush applies to every view the event batches visible to it at now.
func (s *state) flush(now time.Duration) error {
	for _, r := range s.reps {
		for _, v := range s.views {
			k := v.next[r.idx]
			for ; k < len(r.log) && r.log[k].batch.Time+v.lag <= now; k++ {
				if err := s.apply(v, r, &r.log[k]); err != nil {
					return err
				}
			}
			v.next[r.idx] = k
		}
		done := len(r.log)
		for _, v := range s.views {
			done = min(done, v.next[r.idx])
		}
		if done > 0 {
			n := copy(r.log, r.log[done:])
			clear(r.log[n:])
			r.log = r.log[:n]
			for _, v := range s.views {
				v.next[r.idx] -= done
			}
		}
	}
	return nil
}

// apply translates one engine batch the agent's way (once, for every view)
// and applies it to v's index the directory's way.
func (s *state) apply(v *view, r *replica, p *published) error {
	if !p.translated {
		p.evs, _ = r.tr.Translate(nil, kvevents.Batch{TS: p.batch.Time.Seconds(), Events: p.batch.Events})
		p.translated, p.batch.Events = true, nil
	}
	for _, ev := range p.evs {
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Stored:
			if err := v.index.Insert(r.id, k.Stored.Parent, k.Stored.Hashes, mediumOf(k.Stored.Medium)); err != nil && !errors.Is(err, radix.ErrParentMismatch) {
				return fmt.Errorf("sim: %s: directory insert: %w", r.id, err)
			}
		case *kvdirv1.Event_Removed:
			if err := v.index.Remove(r.id, k.Removed.Hashes, mediumOf(k.Removed.Medium)); err != nil {
				return fmt.Errorf("sim: %s: directory remove: %w", r.id, err)
			}
		case *kvdirv1.Event_Cleared:
			v.index.ClearWorker(r.id)
		}
	}
	return nil
}

// pending records, at now, delta more requests router k placed on r that
// await their first token: in k's own busy meter, and (with SharedIntents)
// in every other router's meter of its peers' placements. The other routers
// learn of it at once: IntentLag is not applied to the busy fraction.
func (s *state) pending(r *replica, k int, now time.Duration, delta int) {
	r.own[k].Add(now, delta)
	if !s.cfg.SharedIntents {
		return
	}
	for j := range r.peers {
		if j != k {
			r.peers[j].Add(now, delta)
		}
	}
}

// mediumOf maps an event's medium to the index's, as the directory does
// (unspecified is the GPU).
func mediumOf(m kvdirv1.Medium) radix.Medium {
	switch m {
	case kvdirv1.Medium_MEDIUM_CPU:
		return radix.CPU
	case kvdirv1.Medium_MEDIUM_DISK:
		return radix.Disk
	case kvdirv1.Medium_MEDIUM_REMOTE:
		return radix.Remote
	}
	return radix.GPU
}
