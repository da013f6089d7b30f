package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Shared placement intents (Config.ShareIntents): each request this router
// places is published to the directory's Share stream at once, without
// Raft, and the other routers' intents come back. Another router's intent
// counts here exactly as this router's own request would: its chain as a
// speculative entry on its worker (while it waits for its first byte and
// for the speculative TTL after it), its uncached tokens as queued prefill
// there until its first byte, and the request as in flight until it ends.
// So N routers place a burst as one router that saw every request would.
const (
	// intentLife is how long a queued or running request's intent lives
	// without a refresh; intentRefresh is how often it is refreshed.
	// A router that dies leaves its intents behind for at most intentLife.
	intentLife    = 30 * time.Second
	intentRefresh = 10 * time.Second
	// intentTombstone is the life of a withdrawn intent (and the least
	// life of an ended one): long enough to reach every router.
	intentTombstone = 2 * time.Second
	// intentMaxChain is the longest chain an intent carries (the
	// directory's bound): a longer prompt sends its first blocks.
	intentMaxChain = 8192
	// intentMaxOwn bounds this router's live intents (oldest dropped).
	intentMaxOwn = 64 << 10
	// intentReport is how often the router reports its view.
	intentReport = time.Second
	// intentBatch bounds the intents of one message.
	intentBatch = 1024
	// intentSweep is how often expired intents are forgotten.
	intentSweep = 250 * time.Millisecond
	// shareRetryMin and shareRetryMax bound the pause between Share
	// streams; shareRetryRefused is the pause after a refusal that would
	// repeat (an older directory without Share, a token without the role).
	shareRetryMin     = 50 * time.Millisecond
	shareRetryMax     = 2 * time.Second
	shareRetryRefused = 30 * time.Second
)

// DefaultRouterID is the router id used when Config.RouterID is empty:
// the host name and the process id, stable for the process.
func DefaultRouterID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "router"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// intentKey names another router's intent.
type intentKey struct {
	router string
	id     uint64
}

// ownIntent is one of this router's intents.
type ownIntent struct {
	p         *kvdirv1.PlacementIntent // ttl and hold are filled in when sent
	expires   time.Time
	holdUntil time.Time
	sentAt    time.Time // last sent (for refreshes); zero: not sent on this stream
}

// sharer publishes this router's placement intents and keeps the other
// routers' (peers).
type sharer struct {
	s       *Server
	g       *group // the directory group it shares in
	id      string
	dir     *dirclient.Client
	publish bool // send and use intents (Config.ShareIntents); else only report the view
	specTTL time.Duration
	peers   *peerIntents

	nextID, version atomic.Uint64
	connected       atomic.Bool

	mu      sync.Mutex
	own     map[uint64]*ownIntent
	order   []uint64            // own ids, oldest first (for the bound)
	pending map[uint64]struct{} // own ids changed since last sent
	wake    chan struct{}       // 1-buffered
}

func newSharer(s *Server, g *group) *sharer {
	sh := &sharer{s: s, g: g, id: s.cfg.RouterID, dir: g.dir, publish: s.cfg.ShareIntents, specTTL: s.cfg.SpecTTL,
		peers: newPeerIntents(), own: map[uint64]*ownIntent{}, pending: map[uint64]struct{}{}, wake: make(chan struct{}, 1)}
	start := uint64(time.Now().UnixNano()) // ids and versions grow across restarts
	sh.nextID.Store(start)
	sh.version.Store(start)
	return sh
}

// intentHandle is one placed request's intent; nil when intents are off
// (every method is then a no-op).
type intentHandle struct {
	sh *sharer
	id uint64
}

// placed publishes the intent of a request just sent to wk: queued, its
// chain counted as held there until further notice.
func (sh *sharer) placed(wk *worker, d *decision, uncached int64, now time.Time) *intentHandle {
	if sh == nil || !sh.publish {
		return nil
	}
	chain := d.pickChain
	if len(chain) > intentMaxChain {
		chain = chain[:intentMaxChain]
	}
	bs := d.blockSize
	if d.pick.Index < len(d.bs) {
		bs = d.bs[d.pick.Index]
	}
	id := sh.nextID.Add(1)
	p := &kvdirv1.PlacementIntent{RouterId: sh.id, IntentId: id, WorkerId: wk.id, Chain: chain, BlockSize: uint32(bs),
		PromptTokens: uint32(d.tokens), UncachedTokens: uint32(uncached), State: kvdirv1.IntentState_INTENT_STATE_QUEUED}
	o := &ownIntent{p: p, expires: now.Add(intentLife)}
	if sh.specTTL > 0 {
		o.holdUntil = o.expires
	}
	sh.mu.Lock()
	sh.own[id] = o
	sh.order = append(sh.order, id)
	if len(sh.own) > intentMaxOwn {
		sh.dropOldestLocked()
	}
	sh.changedLocked(id)
	sh.mu.Unlock()
	return &intentHandle{sh: sh, id: id}
}

// dropOldestLocked forgets the oldest own intents over the bound.
func (sh *sharer) dropOldestLocked() {
	for len(sh.own) > intentMaxOwn && len(sh.order) > 0 {
		id := sh.order[0]
		sh.order = sh.order[1:]
		if _, ok := sh.own[id]; ok {
			delete(sh.own, id)
			delete(sh.pending, id)
			sh.s.metrics.intentsDropped.Inc()
		}
	}
}

// changedLocked queues own intent id to be sent; sh.mu is held.
func (sh *sharer) changedLocked(id uint64) {
	sh.pending[id] = struct{}{}
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// update changes the intent and queues it.
func (h *intentHandle) update(f func(o *ownIntent, now time.Time)) {
	if h == nil {
		return
	}
	now := time.Now()
	sh := h.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	o := sh.own[h.id]
	if o == nil {
		return // dropped over the bound
	}
	f(o, now)
	sh.changedLocked(h.id)
}

// prefilled marks the first response byte: the worker holds the chain
// for the speculative TTL, nothing is queued any more, the request runs.
func (h *intentHandle) prefilled() {
	h.update(func(o *ownIntent, now time.Time) {
		o.p.State = kvdirv1.IntentState_INTENT_STATE_PREFILLED
		o.holdUntil = now.Add(max(h.sh.specTTL, 0))
		o.expires = later(o.holdUntil, now.Add(intentLife))
	})
}

// done marks the end of the request: the chain stays held for what is
// left of the TTL after the first byte (the TTL from now when there was
// none, as the router's own speculative entries do).
func (h *intentHandle) done() {
	h.update(func(o *ownIntent, now time.Time) {
		if o.p.State == kvdirv1.IntentState_INTENT_STATE_QUEUED {
			o.holdUntil = now.Add(max(h.sh.specTTL, 0))
		}
		o.p.State = kvdirv1.IntentState_INTENT_STATE_DONE
		o.expires = later(o.holdUntil, now.Add(intentTombstone))
	})
}

// withdraw marks a request that never reached the engine (it failed
// before its first byte and is placed again): it holds and counts nothing.
func (h *intentHandle) withdraw() {
	h.update(func(o *ownIntent, now time.Time) {
		o.p.State = kvdirv1.IntentState_INTENT_STATE_WITHDRAWN
		o.holdUntil = now
		o.expires = now.Add(intentTombstone)
	})
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// outgoingLocked is o as sent at now, with a new version.
func (sh *sharer) outgoingLocked(o *ownIntent, now time.Time) *kvdirv1.PlacementIntent {
	p := o.p
	o.sentAt = now
	return &kvdirv1.PlacementIntent{RouterId: p.RouterId, IntentId: p.IntentId, Version: sh.version.Add(1), WorkerId: p.WorkerId,
		Chain: p.Chain, BlockSize: p.BlockSize, PromptTokens: p.PromptTokens, UncachedTokens: p.UncachedTokens, State: p.State,
		Ttl: durationpb.New(o.expires.Sub(now)), Hold: durationpb.New(max(o.holdUntil.Sub(now), 0))}
}

// takePending returns up to one message of own intents to send at now:
// the changed ones, and the running ones due for a refresh; all of them
// (a new stream) when all is set. more says that more are waiting.
func (sh *sharer) takePending(now time.Time, all bool) (out []*kvdirv1.PlacementIntent, more bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweepOwnLocked(now)
	if all {
		for _, id := range sh.order {
			sh.pending[id] = struct{}{}
		}
	}
	for id, o := range sh.own {
		running := o.p.State == kvdirv1.IntentState_INTENT_STATE_QUEUED || o.p.State == kvdirv1.IntentState_INTENT_STATE_PREFILLED
		if running && now.Sub(o.sentAt) >= intentRefresh {
			o.expires = later(o.expires, now.Add(intentLife))
			if o.p.State == kvdirv1.IntentState_INTENT_STATE_QUEUED && sh.specTTL > 0 {
				o.holdUntil = o.expires
			}
			sh.pending[id] = struct{}{}
		}
	}
	for _, id := range sh.order {
		if len(out) >= intentBatch {
			return out, true
		}
		if _, ok := sh.pending[id]; !ok {
			continue
		}
		delete(sh.pending, id)
		if o := sh.own[id]; o != nil {
			out = append(out, sh.outgoingLocked(o, now))
		}
	}
	return out, false
}

// sweepOwnLocked forgets own intents past their life.
func (sh *sharer) sweepOwnLocked(now time.Time) {
	keep := sh.order[:0]
	for _, id := range sh.order {
		if o := sh.own[id]; o != nil && o.expires.After(now) {
			keep = append(keep, id)
		} else {
			delete(sh.own, id)
			delete(sh.pending, id)
		}
	}
	clear(sh.order[len(keep):])
	sh.order = keep
}

// report is the router's view for its Share stream.
func (sh *sharer) report() *kvdirv1.RouterView {
	l := sh.g.local
	if l == nil {
		return &kvdirv1.RouterView{}
	}
	r := l.View() // the digests read together with the index they describe
	return &kvdirv1.RouterView{Follows: true, Synced: r.Synced, AppliedIndex: r.AppliedIndex, Digest: r.Digest,
		IndexDigest: r.IndexDigest, LagEntries: r.LagEntries, HeardAge: durationpb.New(r.Staleness)}
}

// run keeps a Share stream open until ctx ends.
func (sh *sharer) run(ctx context.Context) {
	pause := shareRetryMin
	for {
		progressed, err := sh.stream(ctx)
		sh.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			pause = shareRetryMin
		}
		wait := pause
		switch status.Code(err) {
		case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
			wait = shareRetryRefused
			sh.s.log.Warn("router: the directory refused to share placement intents; placing with this router's own accounting only",
				"err", err, "retry_in", wait)
		default:
			sh.s.log.Debug("router: share stream ended; reconnecting", "err", err, "retry_in", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !progressed {
			pause = min(2*pause, shareRetryMax)
		}
	}
}

// stream runs one Share stream: every live own intent first, then each
// change, the view every intentReport, and the peers' intents coming
// back. progressed says the node answered.
func (sh *sharer) stream(ctx context.Context) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := sh.dir.OpenShare(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			st.Broke()
		}
	}()
	now := time.Now()
	var first []*kvdirv1.PlacementIntent
	more := false
	if sh.publish {
		first, more = sh.takePending(now, true)
	}
	if err := st.Send(&kvdirv1.ShareRequest{RouterId: sh.id, Intents: first, View: sh.report(), NoIntents: !sh.publish}); err != nil {
		return false, sh.recvErr(st, err)
	}
	sh.s.metrics.intentsSent.Add(float64(len(first)))
	recvDone := make(chan error, 1)
	answered := make(chan struct{})
	go func() {
		var once sync.Once
		for {
			resp, err := st.Recv()
			if err != nil {
				recvDone <- err
				cancel()
				return
			}
			once.Do(func() { close(answered); st.Answered(); sh.connected.Store(true) })
			if resp.Replace {
				sh.peers.reset()
			}
			sh.peers.apply(resp.Intents, time.Now())
			sh.s.metrics.intentsReceived.Add(float64(len(resp.Intents)))
		}
	}()
	if !sh.publish {
		// A node sends nothing to a router that wants no intents: the
		// stream counts as answered once it is open.
		sh.connected.Store(true)
		progressed = true
	}
	report := time.NewTicker(intentReport)
	defer report.Stop()
	sweep := time.NewTicker(intentSweep)
	defer sweep.Stop()
	for {
		if !more {
			select {
			case <-ctx.Done():
				select {
				case err := <-recvDone:
					return progressed, err
				default:
					return progressed, ctx.Err()
				}
			case <-answered:
				progressed, answered = true, nil
				continue
			case <-report.C:
				if err := st.Send(&kvdirv1.ShareRequest{View: sh.report()}); err != nil {
					return progressed, sh.recvErr(st, err)
				}
				continue
			case now := <-sweep.C:
				sh.peers.sweep(now)
				// Also sends the refreshes that came due.
			case <-sh.wake:
			}
		}
		if !sh.publish {
			continue
		}
		var out []*kvdirv1.PlacementIntent
		out, more = sh.takePending(time.Now(), false)
		if len(out) == 0 {
			continue
		}
		if err := st.Send(&kvdirv1.ShareRequest{Intents: out}); err != nil {
			return progressed, sh.recvErr(st, err)
		}
		sh.s.metrics.intentsSent.Add(float64(len(out)))
	}
}

// recvErr returns the stream's own error after a failed Send (gRPC
// reports io.EOF on Send and the status on Recv).
func (sh *sharer) recvErr(st *dirclient.ShareStream, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if _, rerr := st.Recv(); rerr != nil {
		return rerr
	}
	return err
}

// chainOf returns the chain d's pick is published with: the prompt's
// chain in the picked worker's namespace and block size.
func (sh *sharer) chainOf(d *decision, chainFor func(blockhash.Namespace) ([]uint64, error)) []uint64 {
	if sh == nil || !sh.publish || d.pick.Index >= len(d.ns.of) {
		return nil
	}
	ns := d.ns.at(d.pick.Index)
	ns.BlockSize = d.bs[d.pick.Index]
	c, err := chainFor(ns)
	if err != nil {
		return d.chain
	}
	return c
}

// matched returns how many leading blocks of chain other routers' intents
// hold on worker (0 when intents are off).
func (sh *sharer) matched(worker string, chain []uint64) int {
	if sh == nil || !sh.publish {
		return 0
	}
	return sh.peers.matched(worker, chain)
}

// addLoad adds the other routers' queued prefill and requests in flight
// on candidate i's worker to its load, and records them in d.
func (sh *sharer) addLoad(d *decision, i int) {
	if sh == nil || !sh.publish {
		return
	}
	q, n := sh.peers.load(d.cands[i].Worker)
	if d.peerQueued == nil {
		d.peerQueued, d.peerInFlight, d.peerSpec = make([]int, len(d.cands)), make([]int, len(d.cands)), make([]int, len(d.cands))
	}
	d.peerQueued[i], d.peerInFlight[i] = q, n
	l := &d.cands[i].Load
	l.QueuedPrefillTokens += q
	l.InFlight += n
	l.Busy = placement.CombineBusy(l.Busy, sh.peers.busyOf(d.cands[i].Worker))
}

// peerIntent is another router's intent as this router counts it.
type peerIntent struct {
	version   uint64
	worker    string
	chain     []uint64 // counted in the worker's hashes while held
	held      bool
	holdUntil time.Time
	expires   time.Time
	queued    int // uncached tokens, while queued
	inFlight  bool
	pending   bool // queued: counted in its worker's busy meter
}

// peerWorker sums the other routers' intents on one worker.
type peerWorker struct {
	hashes   map[uint64]int // held chains' hashes, with the number of intents holding each
	queued   int
	inFlight int
}

// peerIntents are the other routers' intents, by worker.
type peerIntents struct {
	mu       sync.RWMutex
	byKey    map[intentKey]*peerIntent
	byWorker map[string]*peerWorker
	// busy measures, per worker, how much of the recent past some peer
	// intent there was queued (kept when the worker's counts reach zero:
	// the fraction decays).
	busy map[string]*busyMeter
}

func newPeerIntents() *peerIntents {
	return &peerIntents{byKey: map[intentKey]*peerIntent{}, byWorker: map[string]*peerWorker{}, busy: map[string]*busyMeter{}}
}

// busyLocked returns worker's meter of peers' queued intents.
func (pi *peerIntents) busyLocked(worker string) *busyMeter {
	b := pi.busy[worker]
	if b == nil {
		b = &busyMeter{}
		pi.busy[worker] = b
	}
	return b
}

// busyOf returns how busy the peers' queued intents kept worker.
func (pi *peerIntents) busyOf(worker string) float64 {
	pi.mu.RLock()
	b := pi.busy[worker]
	pi.mu.RUnlock()
	if b == nil {
		return 0
	}
	return b.value()
}

// apply records intents received at now.
func (pi *peerIntents) apply(intents []*kvdirv1.PlacementIntent, now time.Time) {
	pi.mu.Lock()
	defer pi.mu.Unlock()
	for _, p := range intents {
		k := intentKey{p.RouterId, p.IntentId}
		if old := pi.byKey[k]; old != nil {
			if old.version >= p.Version {
				continue
			}
			pi.removeLocked(k, old)
		}
		ttl := p.Ttl.AsDuration()
		if ttl <= 0 || p.WorkerId == "" {
			continue
		}
		e := &peerIntent{version: p.Version, worker: p.WorkerId, chain: p.Chain,
			expires: now.Add(ttl), holdUntil: now.Add(min(max(p.Hold.AsDuration(), 0), ttl))}
		switch p.State {
		case kvdirv1.IntentState_INTENT_STATE_QUEUED:
			e.queued, e.inFlight, e.pending = int(p.UncachedTokens), true, true
			pi.busyLocked(e.worker).add(1)
		case kvdirv1.IntentState_INTENT_STATE_PREFILLED:
			e.inFlight = true
		}
		e.held = len(e.chain) > 0 && e.holdUntil.After(now)
		pi.byKey[k] = e
		w := pi.byWorker[e.worker]
		if w == nil {
			w = &peerWorker{hashes: map[uint64]int{}}
			pi.byWorker[e.worker] = w
		}
		if e.held {
			for _, h := range e.chain {
				w.hashes[h]++
			}
		}
		w.queued += e.queued
		if e.inFlight {
			w.inFlight++
		}
	}
}

// removeLocked takes e's counts out of its worker and forgets it.
func (pi *peerIntents) removeLocked(k intentKey, e *peerIntent) {
	pi.unholdLocked(e)
	if e.pending {
		pi.busyLocked(e.worker).add(-1)
	}
	if w := pi.byWorker[e.worker]; w != nil {
		w.queued -= e.queued
		if e.inFlight {
			w.inFlight--
		}
		if len(w.hashes) == 0 && w.queued == 0 && w.inFlight == 0 {
			delete(pi.byWorker, e.worker)
		}
	}
	delete(pi.byKey, k)
}

// unholdLocked stops counting e's chain.
func (pi *peerIntents) unholdLocked(e *peerIntent) {
	if !e.held {
		return
	}
	e.held = false
	w := pi.byWorker[e.worker]
	if w == nil {
		return
	}
	for _, h := range e.chain {
		if w.hashes[h]--; w.hashes[h] <= 0 {
			delete(w.hashes, h)
		}
	}
}

// sweep forgets what expired at now: intents past their life, chains
// past their hold.
func (pi *peerIntents) sweep(now time.Time) {
	pi.mu.Lock()
	defer pi.mu.Unlock()
	for k, e := range pi.byKey {
		switch {
		case !e.expires.After(now):
			pi.removeLocked(k, e)
		case e.held && !e.holdUntil.After(now):
			pi.unholdLocked(e)
		}
	}
}

// reset forgets every intent (a new stream sends the current set).
func (pi *peerIntents) reset() {
	pi.mu.Lock()
	defer pi.mu.Unlock()
	clear(pi.byKey)
	clear(pi.byWorker)
	clear(pi.busy)
}

// matched returns how many leading blocks of chain the intents on worker
// hold. A hash names its whole prefix, so an intent holding a chain's
// block i holds every block before it.
func (pi *peerIntents) matched(worker string, chain []uint64) int {
	pi.mu.RLock()
	defer pi.mu.RUnlock()
	w := pi.byWorker[worker]
	if w == nil || len(w.hashes) == 0 {
		return 0
	}
	i := 0
	for ; i < len(chain); i++ {
		if w.hashes[chain[i]] == 0 {
			break
		}
	}
	return i
}

// load returns the uncached tokens queued and the requests in flight on
// worker by the other routers.
func (pi *peerIntents) load(worker string) (queued, inFlight int) {
	pi.mu.RLock()
	defer pi.mu.RUnlock()
	if w := pi.byWorker[worker]; w != nil {
		return w.queued, w.inFlight
	}
	return 0, 0
}

// workers returns the workers with peers' load, sorted, with their load.
func (pi *peerIntents) workers() (ids []string, queued, inFlight []int) {
	pi.mu.RLock()
	defer pi.mu.RUnlock()
	for id := range pi.byWorker {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		w := pi.byWorker[id]
		queued = append(queued, w.queued)
		inFlight = append(inFlight, w.inFlight)
	}
	return ids, queued, inFlight
}

// peerCollector exports the other routers' load per worker at scrape time.
type peerCollector struct {
	s              *Server
	queued, flight *prometheus.Desc
	connected      *prometheus.Desc
}

func newPeerCollector(s *Server) *peerCollector {
	return &peerCollector{s: s,
		queued: prometheus.NewDesc("kvdir_router_peer_queued_prefill_tokens",
			"Uncached prompt tokens other routers sent to the worker and have not seen past their first byte (their shared intents).", []string{"worker"}, nil),
		flight: prometheus.NewDesc("kvdir_router_peer_inflight",
			"Requests other routers sent to the worker and have not seen finish (their shared intents).", []string{"worker"}, nil),
		connected: prometheus.NewDesc("kvdir_router_share_connected",
			"1 while the router's Share stream to the directory group is open.", []string{"group"}, nil)}
}

func (c *peerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queued
	ch <- c.flight
	ch <- c.connected
}

func (c *peerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.s.groups {
		sh := g.share
		if sh == nil {
			continue
		}
		ids, q, n := sh.peers.workers()
		for i, id := range ids {
			ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(q[i]), id)
			ch <- prometheus.MustNewConstMetric(c.flight, prometheus.GaugeValue, float64(n[i]), id)
		}
		v := 0.0
		if sh.connected.Load() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, v, g.name)
	}
}
