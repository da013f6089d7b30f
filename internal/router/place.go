package router

import (
	"context"
	"net/http"
	"time"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// flight is one request placed on a worker, from its placement to its
// end: the accounting both front ends share, the HTTP proxy (proxy.go),
// which sends the request itself, and the endpoint picker (epp.go), whose
// data plane sends it. Placing counts the request on its worker (in
// flight, queued uncached prefill, busy), holds its chain there as a
// pending speculative entry and publishes its intent to the other
// routers; the first response byte, the end of the response, or a
// failure before any byte moves each of them on. Its methods are not
// safe for concurrent use.
type flight struct {
	s        *Server
	req      *request
	d        *decision
	wk       *worker
	uncached int64
	sent     time.Time // when the request was placed (handed to the worker or the data plane)
	it       *intentHandle

	prefilled bool // the first response byte (or the end) was accounted
	over      bool // end or abort was called
}

// place decides where req goes among its eligible workers minus exclude,
// holding it in the admission queue first when late binding says so (on
// the first attempt only: a request placed again after a failed worker
// does not queue twice), and accounts it on the chosen worker. ticket
// keeps the admission grant across attempts; the caller releases it when
// the request is done with (releasing twice is harmless). cancelled says
// the client went away while the request was held; the request is then
// counted as cancelled.
func (s *Server) place(ctx context.Context, req *request, exclude []string, first bool, ticket **admitTicket) (f *flight, aerr *apiError, cancelled bool) {
	start := time.Now()
	d, aerr := s.decide(ctx, req, exclude)
	if aerr == nil && first && s.adm != nil {
		// Late binding: wait while every worker is past its knee, then
		// decide again on the loads of that moment.
		var t *admitTicket
		t, aerr, cancelled = s.adm.admit(ctx, req, d)
		if cancelled {
			s.metrics.requests.WithLabelValues("none", s.policy.Name(), OutcomeCancelled).Inc()
			return nil, nil, true
		}
		if t != nil {
			*ticket = t
			start = time.Now()
			d.recycle(s)
			d, aerr = s.decide(ctx, req, exclude)
		}
	}
	if aerr != nil {
		s.countRefused(aerr)
		return nil, aerr, false
	}
	s.metrics.decision.Observe(time.Since(start).Seconds())
	if d.fallback != "" && first {
		s.metrics.fallbacks.WithLabelValues(groupName(d.group), d.fallback).Inc()
	}
	wk := d.workers[d.pick.Index]
	f = &flight{s: s, req: req, d: d, wk: wk, uncached: int64(max(d.tokens-d.pick.PredictedCachedTokens, 0))}
	wk.inFlight.Add(1)
	wk.queuedPrefill.Add(f.uncached)
	wk.busy.add(1)
	s.metrics.inflight.WithLabelValues(wk.id).Inc()
	(*ticket).release() // accounted: the next held request sees this one
	f.sent = time.Now()
	// The chosen worker will hold the prompt's blocks once it has run the
	// prefill: count them there now (speculative entry), until the first
	// byte and for the TTL after it ...
	wk.spec.pending(d.chain, f.sent)
	// ... and tell the other routers (shared intents).
	f.it = d.group.share.placed(wk, d, f.uncached, f.sent)
	d.compact(s) // the flight needs only the pick's entries
	return f, nil, false
}

// countRefused counts a request the router answered itself with aerr.
func (s *Server) countRefused(aerr *apiError) {
	outcome := OutcomeRejected
	if aerr.status >= 500 {
		outcome = OutcomeFailed
	}
	s.metrics.requests.WithLabelValues("none", s.policy.Name(), outcome).Inc()
}

// firstByte accounts the response's first byte: the prefill is done, so
// the prompt's blocks are on the worker for the speculative TTL from now
// and its uncached tokens no longer wait there.
func (f *flight) firstByte() {
	if f.prefilled || f.over {
		return
	}
	f.settle()
	f.it.prefilled()
	f.s.adm.wake()
	f.s.metrics.ttft.WithLabelValues(f.wk.id).Observe(time.Since(f.sent).Seconds())
}

// settle ends the request's wait for its prefill on the worker.
func (f *flight) settle() {
	f.prefilled = true
	f.wk.queuedPrefill.Add(-f.uncached)
	f.wk.busy.add(-1)
	f.wk.spec.add(f.d.chain, time.Now())
}

// release ends the request's stay on the worker.
func (f *flight) release() {
	f.over = true
	f.wk.inFlight.Add(-1)
	f.s.metrics.inflight.WithLabelValues(f.wk.id).Dec()
	f.s.adm.wake()
}

// abort undoes the placement of a request that never reached the worker
// (its connection failed, or the client left before any response): the
// intent is withdrawn; the speculative entry keeps its TTL, as the worker
// may have started the prefill.
func (f *flight) abort() {
	if f.over {
		return
	}
	if !f.prefilled {
		f.settle()
	}
	f.it.withdraw()
	f.release()
}

// outcomeOf classifies a response that reached its end (or broke):
// cancelled when the client left, broken when the engine's response broke
// after its first byte, else by the engine's status.
func outcomeOf(cancelled bool, broken bool, status int) string {
	switch {
	case cancelled:
		return OutcomeCancelled
	case broken:
		return OutcomeBroken
	case status >= 500:
		return OutcomeUpstream5xx
	case status >= 400:
		return OutcomeUpstream4xx
	}
	return OutcomeOK
}

// end accounts the end of the response with outcome, and what the usage
// scanner u read in it (stream: the response was an event stream): the
// request metrics, the cache observation for the policy, the
// misconfiguration check, the session record and the calibration.
func (f *flight) end(outcome string, u *usageScanner, stream bool) {
	if f.over {
		return
	}
	if !f.prefilled {
		f.settle()
	}
	s, d, wk, req := f.s, f.d, f.wk, f.req
	s.metrics.requests.WithLabelValues(wk.id, d.policy, outcome).Inc()
	s.metrics.promptTokens.WithLabelValues(wk.id).Add(float64(d.tokens))
	s.metrics.predicted.WithLabelValues(wk.id).Add(float64(d.pick.PredictedCachedTokens))
	cached, known := u.result()
	if known {
		s.metrics.engineCached.WithLabelValues(wk.id).Add(float64(cached))
		if o, ok := s.policy.(placement.CacheObserver); ok && outcome == OutcomeOK && d.fallback == "" {
			c := &d.cands[d.pick.Index]
			o.ObserveCache(placement.CacheOutcome{
				MatchedTokens: min(c.MatchedBlocks*d.bs[d.pick.Index], d.tokens-1), KVUsage: c.Load.KVUsage, CachedTokens: cached,
				OutputTokens: u.completion})
		}
	}
	// A turn placed with the directory's answer and reported by the engine
	// compares a prediction with the truth: the misconfiguration check
	// counts it, here and (through the session record) in the directory.
	comparable := known && outcome == OutcomeOK && d.group.matcher != nil && d.fallback == "" && needsDirectory(d.policy) && len(d.chain) > 0
	var turn cachecheck.Turn
	if comparable {
		turn = s.observeTurn(req, d, cached)
	}
	if d.group.rec != nil && req.session != "" && len(d.chain) > 0 && outcome == OutcomeOK {
		if !known {
			cached = d.pick.PredictedCachedTokens
		}
		rec := &kvdirv1.SessionRecord{SessionId: req.session, Tail: d.chain[len(d.chain)-1], Blocks: uint32(len(d.chain)),
			PromptTokens: uint32(d.tokens), CachedTokens: uint32(cached), WorkerId: wk.id, BlockSize: uint32(d.blockSize)}
		if comparable {
			p := uint32(d.pick.PredictedCachedTokens)
			rec.PredictedCachedTokens, rec.ModelDiffers, rec.Salted = &p, turn.ModelDiffers, turn.Salted
		}
		d.group.rec.add(rec)
	}
	if s.calib != nil {
		var ttft time.Duration
		if !u.firstToken.IsZero() {
			ttft = u.firstToken.Sub(f.sent)
		}
		s.calib.observe(d, stream, u, ttft, outcome)
	}
	f.it.done()
	f.release()
}

// decorate adds the router's response headers for the flight (decorate).
func (f *flight) decorate(h http.Header, predicted bool) { f.s.decorate(h, f.d, predicted) }
