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
		f, aerr, cancelled := s.place(r.Context(), req, exclude, attempt == 1, &ticket)
		if cancelled {
			return
		}
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		wk := f.wk
		resp, err := s.send(r.Context(), r.Header, req, wk)
		if err != nil {
			f.abort()
			if r.Context().Err() != nil {
				s.metrics.requests.WithLabelValues(wk.id, f.d.policy, OutcomeCancelled).Inc()
				return
			}
			// Nothing reached the client: exclude the worker and place again.
			wk.downUntil.Store(time.Now().Add(s.cfg.DownFor).UnixNano())
			exclude = append(exclude, wk.id)
			s.metrics.retries.WithLabelValues(retryReason(err)).Inc()
			s.log.Warn("router: worker failed before responding; placing the request again",
				"worker", wk.id, "attempt", attempt, "err", err)
			if attempt >= s.cfg.MaxAttempts {
				s.metrics.requests.WithLabelValues(wk.id, f.d.policy, OutcomeFailed).Inc()
				writeError(w, badGateway("worker %s failed before responding (attempt %d of %d): %v", wk.id, attempt, s.cfg.MaxAttempts, err))
				return
			}
			continue
		}
		s.relay(w, r, f, resp)
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
func (s *Server) relay(w http.ResponseWriter, r *http.Request, f *flight, resp *http.Response) {
	defer resp.Body.Close()
	h := w.Header()
	copyHeaders(h, resp.Header)
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	f.decorate(h, s.explainAllowed(r.Header))
	w.WriteHeader(resp.StatusCode)

	flusher, _ := w.(http.Flusher)
	stream := flusher != nil && isEventStream(resp.Header.Get("Content-Type"))
	if stream && flusher != nil {
		flusher.Flush() // headers now: the client sees the stream open
	}
	u := usageScanner{stream: stream}
	buf := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(buf)
	var readErr, writeErr error
	for {
		n, err := resp.Body.Read(*buf)
		if n > 0 {
			f.firstByte()
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
	if readErr != nil && r.Context().Err() == nil && writeErr == nil {
		s.log.Warn("router: upstream response broke after the first byte", "worker", f.wk.id, "err", readErr)
	}
	f.end(outcomeOf(r.Context().Err() != nil || writeErr != nil, readErr != nil, resp.StatusCode), &u, stream)
}

// isEventStream reports whether a Content-Type is an event stream's.
func isEventStream(contentType string) bool {
	return strings.HasPrefix(contentType, "text/event-stream")
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
