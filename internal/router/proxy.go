package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Response headers the router adds.
const (
	HeaderWorker    = "X-Kvdir-Worker"
	HeaderPredicted = "X-Kvdir-Predicted-Cached-Tokens"
	HeaderPolicy    = "X-Kvdir-Policy"
	HeaderFallback  = "X-Kvdir-Fallback"
	// HeaderDataParallelRank pins a proxied request to one data-parallel
	// rank of the engine; vLLM's OpenAI server reads it
	// (X-data-parallel-rank; header names are case-insensitive).
	HeaderDataParallelRank = "X-Data-Parallel-Rank"
)

// hopHeaders are connection-level headers a proxy must not forward
// (RFC 9110 section 7.6.1), plus those the router sets itself.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Host": true,
	// The operator's explain token is for the router, never an engine.
	HeaderExplainToken: true,
	// The router reads usage from the response, so it asks for it uncompressed.
	"Accept-Encoding": true,
}

// serveProxy handles POST /v1/chat/completions and /v1/completions.
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request, chat bool) {
	req, aerr := s.readRequest(w, r, chat)
	if aerr != nil {
		s.metrics.requests.WithLabelValues("none", s.policy.Name(), OutcomeRejected).Inc()
		writeError(w, aerr)
		return
	}
	var exclude []string
	var ticket *admitTicket // granted by the admission queue: released once placed
	defer func() { ticket.release() }()
	for attempt := 1; ; attempt++ {
		start := time.Now()
		d, aerr := s.decide(r.Context(), req, exclude)
		if aerr == nil && attempt == 1 && s.adm != nil {
			// Late binding: wait while every worker is past its knee,
			// then decide again on the loads of that moment.
			var cancelled bool
			ticket, aerr, cancelled = s.adm.admit(r.Context(), req, d)
			if cancelled {
				s.metrics.requests.WithLabelValues("none", s.policy.Name(), OutcomeCancelled).Inc()
				return
			}
			if ticket != nil {
				start = time.Now()
				d, aerr = s.decide(r.Context(), req, exclude)
			}
		}
		if aerr != nil {
			outcome := OutcomeRejected
			if aerr.status >= 500 {
				outcome = OutcomeFailed
			}
			s.metrics.requests.WithLabelValues("none", s.policy.Name(), outcome).Inc()
			writeError(w, aerr)
			return
		}
		s.metrics.decision.Observe(time.Since(start).Seconds())
		if d.fallback != "" && attempt == 1 {
			s.metrics.fallbacks.WithLabelValues(d.fallback).Inc()
		}
		wk := d.workers[d.pick.Index]
		uncached := int64(max(d.tokens-d.pick.PredictedCachedTokens, 0))
		wk.inFlight.Add(1)
		wk.queuedPrefill.Add(uncached)
		wk.busy.add(1)
		s.metrics.inflight.WithLabelValues(wk.id).Inc()
		ticket.release() // accounted: the next held request sees this one
		done := func() {
			wk.inFlight.Add(-1)
			s.metrics.inflight.WithLabelValues(wk.id).Dec()
			s.adm.wake()
		}
		sent := time.Now()
		// The chosen worker will hold the prompt's blocks once it has run the
		// prefill: count them there now (speculative entry), until the first
		// byte and for the TTL after it.
		wk.spec.pending(d.chain, sent)
		// ... and tell the other routers (shared intents).
		it := s.share.placed(wk, d, uncached, sent)
		resp, err := s.send(r.Context(), r.Header, req, wk)
		if err != nil {
			wk.queuedPrefill.Add(-uncached)
			wk.busy.add(-1)
			wk.spec.add(d.chain, time.Now())
			it.withdraw()
			done()
			if r.Context().Err() != nil {
				s.metrics.requests.WithLabelValues(wk.id, d.policy, OutcomeCancelled).Inc()
				return
			}
			// Nothing reached the client: exclude the worker and place again.
			wk.downUntil.Store(time.Now().Add(s.cfg.DownFor).UnixNano())
			exclude = append(exclude, wk.id)
			s.metrics.retries.WithLabelValues(retryReason(err)).Inc()
			s.log.Warn("router: worker failed before responding; placing the request again",
				"worker", wk.id, "attempt", attempt, "err", err)
			if attempt >= s.cfg.MaxAttempts {
				s.metrics.requests.WithLabelValues(wk.id, d.policy, OutcomeFailed).Inc()
				writeError(w, badGateway("worker %s failed before responding (attempt %d of %d): %v", wk.id, attempt, s.cfg.MaxAttempts, err))
				return
			}
			continue
		}
		s.relay(w, r, req, d, wk, resp, sent, uncached, it)
		it.done()
		done()
		return
	}
}

// readRequest reads, parses and checks the client's request.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, chat bool) (*request, *apiError) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		return nil, aerr
	}
	req, aerr := parseRequest(body, chat)
	if aerr != nil {
		return nil, aerr
	}
	req.session = r.Header.Get(s.cfg.SessionHeader)
	if len(req.session) > 1024 {
		return nil, badRequest("%s is longer than 1024 bytes", s.cfg.SessionHeader)
	}
	return req, nil
}

// copyHeaders copies the end-to-end headers of src into dst: not the
// hop-by-hop ones, nor those the Connection header names.
func copyHeaders(dst, src http.Header) {
	for k, v := range src {
		if !hopHeaders[k] {
			dst[k] = v
		}
	}
	for _, c := range src.Values("Connection") {
		for _, name := range strings.Split(c, ",") {
			dst.Del(strings.TrimSpace(name))
		}
	}
}

// isConnRefused reports whether err is a refused connection.
func isConnRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// retryReason classifies a failed attempt for the retries metric.
func retryReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case isConnRefused(err):
		return "connection-refused"
	}
	return "transport-error"
}

// send posts req to wk and returns the response once its headers arrived.
func (s *Server) send(ctx context.Context, in http.Header, req *request, wk *worker) (*http.Response, error) {
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, wk.address+req.path, bytes.NewReader(req.body))
	if err != nil {
		return nil, err
	}
	copyHeaders(up.Header, in)
	if wk.hasRank {
		up.Header.Set(HeaderDataParallelRank, strconv.Itoa(wk.rank))
	}
	if up.Header.Get("Content-Type") == "" {
		up.Header.Set("Content-Type", "application/json")
	}
	return s.transport.RoundTrip(up)
}

// relay streams resp to the client, flushing each read when the response is
// an event stream, and does the accounting when it ends.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, req *request, d *decision, wk *worker, resp *http.Response, sent time.Time, uncached int64, it *intentHandle) {
	defer resp.Body.Close()
	h := w.Header()
	copyHeaders(h, resp.Header)
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	s.decorate(h, d, s.explainAllowed(r))
	w.WriteHeader(resp.StatusCode)

	flusher, _ := w.(http.Flusher)
	stream := flusher != nil && bytes.HasPrefix([]byte(resp.Header.Get("Content-Type")), []byte("text/event-stream"))
	if stream && flusher != nil {
		flusher.Flush() // headers now: the client sees the stream open
	}
	u := usageScanner{stream: stream}
	buf := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(buf)
	first := true
	var readErr, writeErr error
	for {
		n, err := resp.Body.Read(*buf)
		if n > 0 {
			if first {
				first = false
				wk.queuedPrefill.Add(-uncached)
				wk.busy.add(-1)
				wk.spec.add(d.chain, time.Now())
				it.prefilled()
				s.adm.wake()
				s.metrics.ttft.WithLabelValues(wk.id).Observe(time.Since(sent).Seconds())
			}
			u.feed((*buf)[:n])
			if _, writeErr = w.Write((*buf)[:n]); writeErr != nil {
				break
			}
			if stream {
				flusher.Flush()
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if first {
		wk.queuedPrefill.Add(-uncached)
		wk.busy.add(-1)
		wk.spec.add(d.chain, time.Now())
	}
	outcome := OutcomeOK
	switch {
	case r.Context().Err() != nil || writeErr != nil:
		outcome = OutcomeCancelled
	case readErr != nil:
		outcome = OutcomeBroken
		s.log.Warn("router: upstream response broke after the first byte", "worker", wk.id, "err", readErr)
	case resp.StatusCode >= 500:
		outcome = OutcomeUpstream5xx
	case resp.StatusCode >= 400:
		outcome = OutcomeUpstream4xx
	}
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
	comparable := known && outcome == OutcomeOK && s.dir != nil && d.fallback == "" && needsDirectory(d.policy) && len(d.chain) > 0
	var turn cachecheck.Turn
	if comparable {
		turn = s.observeTurn(req, d, cached)
	}
	if s.rec != nil && req.session != "" && len(d.chain) > 0 && outcome == OutcomeOK {
		if !known {
			cached = d.pick.PredictedCachedTokens
		}
		rec := &kvdirv1.SessionRecord{SessionId: req.session, Tail: d.chain[len(d.chain)-1], Blocks: uint32(len(d.chain)),
			PromptTokens: uint32(d.tokens), CachedTokens: uint32(cached), WorkerId: wk.id, BlockSize: uint32(d.blockSize)}
		if comparable {
			p := uint32(d.pick.PredictedCachedTokens)
			rec.PredictedCachedTokens, rec.ModelDiffers, rec.Salted = &p, turn.ModelDiffers, turn.Salted
		}
		s.rec.add(rec)
	}
	if s.calib != nil {
		var ttft time.Duration
		if !u.firstToken.IsZero() {
			ttft = u.firstToken.Sub(sent)
		}
		s.calib.observe(d, stream, &u, ttft, outcome)
	}
}

// decorate adds the router's headers for decision d; the predicted cached
// tokens only when predicted is set (explainAllowed).
func (s *Server) decorate(h http.Header, d *decision, predicted bool) {
	h.Set(HeaderWorker, d.pick.Worker)
	if predicted {
		h.Set(HeaderPredicted, strconv.Itoa(d.pick.PredictedCachedTokens))
	}
	h.Set(HeaderPolicy, d.policy)
	if d.fallback != "" {
		h.Set(HeaderFallback, d.fallback)
	}
}

// usageScanner finds usage.prompt_tokens_details.cached_tokens in a
// response as it passes: the whole body of a plain response (up to a
// bound), or the data lines of an event stream.
type usageScanner struct {
	stream bool
	buf    []byte // plain: the body so far; stream: the current partial line
	over   bool   // plain body exceeded the bound
	cached int
	known  bool
	// prompt is usage.prompt_tokens, if promptKnown.
	prompt      int
	promptKnown bool
	// completion is usage.completion_tokens (0 if not reported).
	completion int
	// firstToken is when the stream's first data line with generated text
	// passed (zero if none did; streams only).
	firstToken time.Time
}

const usageScanLimit = 4 << 20

var usageKey = []byte(`"prompt_tokens_details"`)

func (u *usageScanner) feed(p []byte) {
	if !u.stream {
		if u.over || len(u.buf)+len(p) > usageScanLimit {
			u.over, u.buf = true, nil
			return
		}
		u.buf = append(u.buf, p...)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(u.buf)+len(p) <= usageScanLimit {
				u.buf = append(u.buf, p...)
			}
			return
		}
		line := p[:i]
		if len(u.buf) > 0 {
			line = append(u.buf, line...)
			u.buf = u.buf[:0]
		}
		p = p[i+1:]
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		if u.firstToken.IsZero() && hasToken(line) {
			u.firstToken = time.Now()
		}
		if bytes.Contains(line, usageKey) {
			u.parse(bytes.TrimSpace(line[len("data:"):]))
		}
	}
}

func (u *usageScanner) parse(data []byte) {
	var v struct {
		Usage *struct {
			Prompt     *int `json:"prompt_tokens"`
			Completion *int `json:"completion_tokens"`
			Details    *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &v) == nil && v.Usage != nil && v.Usage.Details != nil {
		u.cached, u.known = v.Usage.Details.Cached, true
		if v.Usage.Prompt != nil {
			u.prompt, u.promptKnown = *v.Usage.Prompt, true
		}
		if v.Usage.Completion != nil {
			u.completion = *v.Usage.Completion
		}
	}
}

// result returns the engine-reported cached tokens, if the response had them.
func (u *usageScanner) result() (int, bool) {
	if !u.stream && !u.over && bytes.Contains(u.buf, usageKey) {
		u.parse(u.buf)
	}
	return u.cached, u.known
}
