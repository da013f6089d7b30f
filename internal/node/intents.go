package node

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Bounds of the placement intents a node holds (see "Shared placement
// intents" in DESIGN.md). Past either bound the oldest intents (by last
// update) are dropped and counted in kvdir_intents_dropped_total.
const (
	DefaultIntentMaxCount = 64 << 10
	DefaultIntentMaxBytes = 64 << 20
)

// Bounds of one intent, checked on every intent a node receives.
const (
	// MaxIntentChain is the longest chain an intent may carry, in hashes.
	MaxIntentChain = 8192
	// maxIntentTTL caps an intent's life; a longer one is shortened.
	maxIntentTTL = 15 * time.Minute
	// maxIntentID bounds router and worker ids.
	maxIntentID = 256
)

// Bounds of one message of intents sent to a router or a node.
const (
	shareBatchIntents = 1024
	shareBatchBytes   = 1 << 20
)

// intentKey names an intent: its router and the router's id for it.
type intentKey struct {
	router string
	id     uint64
}

// heldIntent is an intent as a node holds it: the message as received
// (whose ttl and hold are replaced by absolute times here) and where it
// came from.
type heldIntent struct {
	p         *kvdirv1.PlacementIntent
	expires   time.Time // the intent is forgotten then
	holdUntil time.Time // its chain counts as held until then
	relayed   bool      // received from another node (not relayed again)
	size      int       // approximate bytes, for the bound
	elem      *list.Element
}

// intentSize approximates the memory an intent takes.
func intentSize(p *kvdirv1.PlacementIntent) int {
	return 128 + len(p.RouterId) + len(p.WorkerId) + 8*len(p.Chain)
}

// validIntent checks an intent a router or a node sent.
func validIntent(p *kvdirv1.PlacementIntent) error {
	switch {
	case p == nil:
		return fmt.Errorf("empty intent")
	case p.RouterId == "" || len(p.RouterId) > maxIntentID:
		return fmt.Errorf("intent %d: router id %q is empty or longer than %d bytes", p.IntentId, p.RouterId, maxIntentID)
	case p.WorkerId == "" || len(p.WorkerId) > maxIntentID:
		return fmt.Errorf("intent %d of %s: worker id %q is empty or longer than %d bytes", p.IntentId, p.RouterId, p.WorkerId, maxIntentID)
	case len(p.Chain) > MaxIntentChain:
		return fmt.Errorf("intent %d of %s: chain of %d hashes, at most %d allowed (send the first %d)", p.IntentId, p.RouterId, len(p.Chain), MaxIntentChain, MaxIntentChain)
	case p.State < kvdirv1.IntentState_INTENT_STATE_QUEUED || p.State > kvdirv1.IntentState_INTENT_STATE_WITHDRAWN:
		return fmt.Errorf("intent %d of %s: unknown state %v", p.IntentId, p.RouterId, p.State)
	case p.Ttl == nil || p.Ttl.AsDuration() <= 0:
		return fmt.Errorf("intent %d of %s: ttl %v must be positive", p.IntentId, p.RouterId, p.Ttl.AsDuration())
	}
	return nil
}

// intentSub is a reader of the table: a router's Share stream (the other
// routers' intents) or a relay to another node (the intents this node's
// own routers sent). It holds the keys of the intents that changed since
// it last read, each once; reading takes the intents as they are then.
type intentSub struct {
	want    func(*heldIntent) bool
	pending []intentKey
	queued  map[intentKey]struct{}
	// resync: the next read starts over with every intent the reader
	// wants (set at subscription, and when pending grew past its bound).
	resync bool
	wake   chan struct{} // 1-buffered: something to read
}

// intentMetrics are the table's counters (nil-safe: tests leave them out).
type intentMetrics interface {
	intentDropped(reason string, n int)
}

// intentTable holds a node's placement intents: soft state, in memory
// only, bounded in count and bytes, each forgotten at its TTL.
type intentTable struct {
	maxCount, maxBytes int
	metrics            intentMetrics

	mu    sync.Mutex
	byKey map[intentKey]*heldIntent
	order *list.List // of intentKey, least recently updated first
	bytes int
	subs  map[*intentSub]struct{}
}

func newIntentTable(maxCount, maxBytes int, m intentMetrics) *intentTable {
	if maxCount <= 0 {
		maxCount = DefaultIntentMaxCount
	}
	if maxBytes <= 0 {
		maxBytes = DefaultIntentMaxBytes
	}
	return &intentTable{maxCount: maxCount, maxBytes: maxBytes, metrics: m,
		byKey: map[intentKey]*heldIntent{}, order: list.New(), subs: map[*intentSub]struct{}{}}
}

func (t *intentTable) dropped(reason string, n int) {
	if t.metrics != nil && n > 0 {
		t.metrics.intentDropped(reason, n)
	}
}

// put stores a valid intent received at now (relayed: from another node)
// unless the table holds the same or a newer version of it; it reports
// whether it stored it. The readers that want it are told.
func (t *intentTable) put(p *kvdirv1.PlacementIntent, relayed bool, now time.Time) bool {
	k := intentKey{p.RouterId, p.IntentId}
	ttl := min(p.Ttl.AsDuration(), maxIntentTTL)
	hold := min(max(p.Hold.AsDuration(), 0), ttl)
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.byKey[k]
	if old != nil && old.p.Version >= p.Version {
		t.dropped("stale", 1)
		return false
	}
	h := &heldIntent{p: p, expires: now.Add(ttl), holdUntil: now.Add(hold), relayed: relayed, size: intentSize(p)}
	if old != nil {
		t.bytes -= old.size
		t.order.Remove(old.elem)
	}
	h.elem = t.order.PushBack(k)
	t.byKey[k] = h
	t.bytes += h.size
	drops := 0
	for t.order.Len() > 0 && (len(t.byKey) > t.maxCount || t.bytes > t.maxBytes) {
		t.removeLocked(t.order.Front().Value.(intentKey))
		drops++
	}
	t.dropped("bound", drops)
	if _, ok := t.byKey[k]; !ok {
		return false // larger than the bound on its own
	}
	for s := range t.subs {
		if s.want(h) {
			t.notifyLocked(s, k)
		}
	}
	return true
}

func (t *intentTable) removeLocked(k intentKey) {
	h := t.byKey[k]
	if h == nil {
		return
	}
	t.order.Remove(h.elem)
	t.bytes -= h.size
	delete(t.byKey, k)
}

// notifyLocked queues k for s; t.mu is held.
func (t *intentTable) notifyLocked(s *intentSub, k intentKey) {
	if s.resync {
		return // the next read sends everything anyway
	}
	if _, ok := s.queued[k]; !ok {
		if len(s.pending) >= 2*t.maxCount {
			// Keys of intents dropped or expired meanwhile pile up only
			// when the reader does not read: start it over.
			s.pending, s.queued, s.resync = nil, map[intentKey]struct{}{}, true
		} else {
			s.queued[k] = struct{}{}
			s.pending = append(s.pending, k)
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// expire forgets the intents whose TTL has passed at now and returns how
// many it forgot.
func (t *intentTable) expire(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, h := range t.byKey {
		if !h.expires.After(now) {
			t.removeLocked(k)
			n++
		}
	}
	return n
}

// subscribe returns a reader of the intents want accepts; its first read
// returns every such intent the table holds, with reset set.
func (t *intentTable) subscribe(want func(*heldIntent) bool) *intentSub {
	s := &intentSub{want: want, queued: map[intentKey]struct{}{}, resync: true, wake: make(chan struct{}, 1)}
	s.wake <- struct{}{}
	t.mu.Lock()
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	return s
}

func (t *intentTable) unsubscribe(s *intentSub) {
	t.mu.Lock()
	delete(t.subs, s)
	t.mu.Unlock()
}

// read returns up to one message's worth of the intents s is waiting for,
// as they are at now (remaining ttl and hold; the ones that expired
// meanwhile are left out), and whether s must first forget what it was
// sent before (reset). more says that more are waiting.
func (t *intentTable) read(s *intentSub, now time.Time) (out []*kvdirv1.PlacementIntent, reset, more bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.resync {
		s.resync, reset = false, true
		s.pending, s.queued = s.pending[:0], map[intentKey]struct{}{}
		for e := t.order.Front(); e != nil; e = e.Next() {
			k := e.Value.(intentKey)
			if s.want(t.byKey[k]) {
				s.queued[k] = struct{}{}
				s.pending = append(s.pending, k)
			}
		}
	}
	size, i := 0, 0
	for ; i < len(s.pending) && len(out) < shareBatchIntents && size < shareBatchBytes; i++ {
		k := s.pending[i]
		delete(s.queued, k)
		h := t.byKey[k]
		if h == nil || !h.expires.After(now) {
			continue
		}
		out = append(out, h.outgoing(now))
		size += h.size
	}
	s.pending = s.pending[i:]
	if len(s.pending) == 0 {
		s.pending = nil // let the backing array go
	}
	return out, reset, len(s.pending) > 0
}

// outgoing is h as sent on at now: the same intent with its remaining
// ttl and hold.
func (h *heldIntent) outgoing(now time.Time) *kvdirv1.PlacementIntent {
	p := h.p
	return &kvdirv1.PlacementIntent{RouterId: p.RouterId, IntentId: p.IntentId, Version: p.Version, WorkerId: p.WorkerId,
		Chain: p.Chain, BlockSize: p.BlockSize, PromptTokens: p.PromptTokens, UncachedTokens: p.UncachedTokens, State: p.State,
		Ttl: durationpb.New(h.expires.Sub(now)), Hold: durationpb.New(max(h.holdUntil.Sub(now), 0))}
}

// stats returns the number of intents held, in all and by router.
func (t *intentTable) stats() (total int, byRouter map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	byRouter = map[string]int{}
	for k := range t.byKey {
		byRouter[k.router]++
	}
	return len(t.byKey), byRouter
}

// len returns the number of intents held.
func (t *intentTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}
