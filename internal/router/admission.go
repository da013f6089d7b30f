package router

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/admission"
)

// Late binding (Config.AdmissionQueue): when every candidate worker is past
// its knee (admission.Knee: it cannot start a new prefill within two engine
// steps), a request waits at the router instead of being bound to an
// engine queue on information that will be stale when it runs. A held
// request is placed, by the normal policy on the loads of that moment, as
// soon as a worker drops below its knee: every first byte, finish and
// scrape wakes the queue. While requests are held, new ones queue behind
// them (first come, first placed), and a session's request never overtakes
// its earlier one.
const (
	// DefaultAdmissionQueue bounds the held requests. Max wait, not this
	// bound, is meant to end waits: the queue holds at most a max wait's
	// worth of arrivals, so 1024 refuses nothing below 34 requests/s
	// (1024 / 30 s; the Mooncake trace arrives at 3.9/s) and only stops a
	// flood. A held request costs its body (tens of kB for a 10k-token
	// prompt) and a goroutine.
	DefaultAdmissionQueue = 1024
	// DefaultAdmissionMaxWait bounds a request's wait at the router: the
	// time after which a client is better told to come back (503 with
	// Retry-After) than kept waiting for a first token it will likely
	// time out on anyway.
	DefaultAdmissionMaxWait = 30 * time.Second
)

// Admission results, the result label of kvdir_router_admission_wait_seconds,
// and reasons, that of kvdir_router_admission_rejections_total.
const (
	AdmissionPlaced    = "placed"     // the request left the queue to be placed
	AdmissionCancelled = "cancelled"  // the client went away while queued
	AdmissionFull      = "queue-full" // refused on arrival: 429
	AdmissionMaxWait   = "max-wait"   // waited --admission-max-wait: 503
)

// admitter is the router's admission queue.
type admitter struct {
	s     *Server
	knee  admission.Knee
	epoch time.Time

	n       atomic.Int64 // queued entries, read without the lock
	mu      sync.Mutex
	q       *admission.Queue[*held]
	placing bool // a granted request is being placed: the next grant waits for its accounting

	depth    prometheus.GaugeFunc
	wait     *prometheus.HistogramVec
	rejected *prometheus.CounterVec
}

// held is one request waiting at the router.
type held struct {
	model  string
	tokens int
	ready  chan struct{} // closed when granted
}

// admitTicket is a granted request; release must be called once its
// placement is accounted (or failed).
type admitTicket struct {
	a    *admitter
	e    *admission.Entry[*held]
	once sync.Once
}

func newAdmitter(s *Server) *admitter {
	a := &admitter{s: s, knee: s.cfg.AdmissionKnee, epoch: time.Now(),
		q: admission.NewQueue[*held](s.cfg.AdmissionQueue, s.cfg.AdmissionMaxWait)}
	if a.knee.ChunkTokens <= 0 {
		a.knee.ChunkTokens = 2048
	}
	a.depth = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvdir_router_admission_queue_depth",
		Help: "Requests held at the router because every worker is past its knee (late binding)."},
		func() float64 { return float64(a.n.Load()) })
	a.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvdir_router_admission_wait_seconds",
		Help:    "Time requests were held at the router, by result (placed, cancelled, max-wait).",
		Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16)}, []string{"result"})
	a.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_admission_rejections_total",
		Help: "Requests the admission queue refused, by reason: queue-full (429) or max-wait (503)."}, []string{"reason"})
	s.metrics.reg.MustRegister(a.depth, a.wait, a.rejected)
	return a
}

// now is the queue's clock.
func (a *admitter) now() time.Duration { return time.Since(a.epoch) }

// admit holds the request decided as d while it must wait, and returns
// nil, nil when it need not (the caller places d as it is), a ticket once
// it may be placed (the caller decides again, on fresh loads), or the
// error to answer. cancelled says the client went away while it waited.
func (a *admitter) admit(ctx context.Context, req *request, d *decision) (t *admitTicket, aerr *apiError, cancelled bool) {
	key := admissionKey(req, d)
	a.mu.Lock()
	if a.q.Len() == 0 && !a.q.Busy(key) && !a.knee.AllPast(d.cands, d.tokens) {
		a.mu.Unlock()
		return nil, nil, false
	}
	h := &held{model: req.model, tokens: d.tokens, ready: make(chan struct{})}
	e, err := a.q.Push(a.now(), key, h)
	if err != nil {
		after := a.q.RetryAfter(a.now())
		a.mu.Unlock()
		a.rejected.WithLabelValues(AdmissionFull).Inc()
		return nil, rateLimited(after, "the router holds %d requests, its limit (--admission-queue), while every worker serving model %q is past its knee; retry after %s",
			a.q.Cap(), req.model, after), false
	}
	a.n.Add(1)
	a.wakeLocked()
	a.mu.Unlock()

	t = &admitTicket{a: a, e: e}
	timer := time.NewTimer(a.q.MaxWait())
	defer timer.Stop()
	select {
	case <-h.ready:
		return t, nil, false
	case <-ctx.Done():
		if a.remove(e, AdmissionCancelled) {
			return nil, nil, true
		}
		t.release() // granted as it gave up
		return nil, nil, true
	case <-timer.C:
		if a.remove(e, AdmissionMaxWait) {
			a.mu.Lock()
			after := a.q.RetryAfter(a.now())
			a.mu.Unlock()
			a.rejected.WithLabelValues(AdmissionMaxWait).Inc()
			return nil, unavailableRetry(after, "waited %s (--admission-max-wait) at the router for a worker serving model %q to drop below its knee; retry after %s",
				a.q.MaxWait(), req.model, after), false
		}
		return t, nil, false // granted as the wait ended
	}
}

// remove takes a waiting entry out of the queue; false if it was granted.
func (a *admitter) remove(e *admission.Entry[*held], result string) bool {
	a.mu.Lock()
	ok := a.q.Remove(e)
	if ok {
		a.n.Add(-1)
		a.wakeLocked() // it may have blocked its session's next request
	}
	a.mu.Unlock()
	if ok {
		a.wait.WithLabelValues(result).Observe((a.now() - e.Enqueued).Seconds())
	}
	return ok
}

// wake grants the oldest held request that some worker can take now.
func (a *admitter) wake() {
	if a == nil || a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	a.wakeLocked()
	a.mu.Unlock()
}

func (a *admitter) wakeLocked() {
	if a.placing || a.q.Len() == 0 {
		return
	}
	now := a.now()
	e := a.q.Next(now, a.fits)
	if e == nil {
		return
	}
	a.n.Add(-1)
	a.placing = true
	a.wait.WithLabelValues(AdmissionPlaced).Observe((now - e.Enqueued).Seconds())
	close(e.Value.ready)
}

// fits reports whether some worker serving e's model is below its knee
// for it, as the router sees the worker now (its own accounting plus the
// other routers' shared intents). With no worker to ask it says yes: the
// placement then answers the client why not.
func (a *admitter) fits(e *admission.Entry[*held]) bool {
	g := a.s.groupFor(e.Value.model)
	cs, aerr := a.s.candidates(nil, g, e.Value.model, nil, nil, time.Now())
	if aerr != nil {
		return true
	}
	for _, c := range cs {
		l := c.w.load()
		if sh := g.share; sh != nil && sh.publish {
			q, _ := sh.peers.load(c.w.id)
			l.QueuedPrefillTokens += q
		}
		if !a.knee.Past(l, e.Value.tokens) {
			return true
		}
	}
	return false
}

// release ends a granted request's turn: the next one may be granted.
func (t *admitTicket) release() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		a := t.a
		a.mu.Lock()
		a.q.Done(t.e)
		a.placing = false
		a.wakeLocked()
		a.mu.Unlock()
	})
}

// admissionKey is the request's session for the queue's order: its
// session header, else the first block of its prompt (the request's
// conversation, as session-hash keys it without a header); "" when the
// prompt is shorter than a block.
func admissionKey(req *request, d *decision) string {
	if req.session != "" {
		return "s:" + req.session
	}
	if len(d.chain) > 0 {
		return "c:" + strconv.FormatUint(d.chain[0], 16)
	}
	return ""
}

// rateLimited is a 429 with a Retry-After of after.
func rateLimited(after time.Duration, format string, args ...any) *apiError {
	e := &apiError{status: http.StatusTooManyRequests, kind: "RateLimitError", retryAfter: after}
	e.msg = fmt.Sprintf(format, args...)
	return e
}

// unavailableRetry is a 503 with a Retry-After of after.
func unavailableRetry(after time.Duration, format string, args ...any) *apiError {
	e := unavailable(format, args...)
	e.retryAfter = after
	return e
}
