package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvdir/kvdir/internal/enginemetrics"
)

// maxRank bounds a worker's data-parallel rank.
const maxRank = 1 << 16

// DefaultNoStatsHold is how long a TensorRT-LLM worker keeps its last load
// while its reads find no new iteration. trtllm-serve drains its stats on
// every read, so with the agent (or another router) reading too, a busy
// engine's stats can be empty for one read; an engine with requests runs
// many iterations a second, so a second without one means it is idle.
const DefaultNoStatsHold = time.Second

// scraper polls each worker's /metrics.
type scraper struct {
	client   *http.Client
	interval time.Duration
	failures int // consecutive failures after which a worker is considered down
	// noStatsHold is how long the last load holds while reads find no new
	// TensorRT-LLM iteration (DefaultNoStatsHold).
	noStatsHold time.Duration
	// kind, with force, is the only metrics shape accepted; without force
	// each scrape's shape is detected.
	kind      enginemetrics.Kind
	force     bool
	onFailure func(w *worker, reason string) // every failed scrape
	onLoad    func(w *worker)                // every successful scrape
	onError   func(w *worker, err error)     // the failure that makes w down
	// reads, when set, shares each read among the workers at one address
	// (the data-parallel ranks behind one API server).
	reads *sharedReads
}

// engineKind reads Config.EngineKind.
func engineKind(s string) (enginemetrics.Kind, bool, error) {
	k, auto, err := enginemetrics.ParseKind(s)
	if err != nil {
		return 0, false, fmt.Errorf("router: %w", err)
	}
	return k, !auto, nil
}

// scrapeError is a failed scrape with its reason, the reason label of
// kvdir_router_engine_scrape_failures_total.
type scrapeError struct {
	reason string
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }
func (e *scrapeError) Unwrap() error { return e.err }

// scrapeReason returns the reason of a failed scrape.
func scrapeReason(err error) string {
	var se *scrapeError
	if errors.As(err, &se) {
		return se.reason
	}
	return "read"
}

// run scrapes w every interval until w.stop closes or ctx ends.
func (s *scraper) run(ctx context.Context, w *worker) { w.every(ctx, s.interval, s.once) }

// every calls fn for w at once and then every interval, until w leaves
// the pool (w.stop closes) or ctx ends.
func (w *worker) every(ctx context.Context, interval time.Duration, fn func(context.Context, *worker)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn(ctx, w)
		select {
		case <-ctx.Done():
			return
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// once scrapes w one time and stores the result.
func (s *scraper) once(ctx context.Context, w *worker) {
	l, err := s.fetch(ctx, w)
	if errors.Is(err, enginemetrics.ErrNoNewStats) {
		w.scrapeKO.Store(0)
		if last := w.scrapeAt.Load(); last != 0 && time.Since(time.Unix(0, last)) < s.noStatsHold {
			return // the last iteration's load still holds
		}
		err = nil // no iteration for a while: idle, l is the zero load
	}
	if err != nil {
		if s.onFailure != nil && ctx.Err() == nil {
			s.onFailure(w, scrapeReason(err))
		}
		if w.scrapeKO.Add(1) == int32(s.failures) && s.onError != nil {
			s.onError(w, err)
		}
		return
	}
	w.scrapeKO.Store(0)
	w.running.Store(int32(l.Running))
	w.waiting.Store(int32(l.Waiting))
	storeFloat(&w.kvUsage, l.KVUsage)
	w.capacityTokens.Store(l.CapacityTokens)
	if l.Model != "" && w.model() == "" {
		w.setModel(l.Model)
	}
	w.scrapeAt.Store(time.Now().UnixNano())
	if s.onLoad != nil {
		s.onLoad(w)
	}
}

// fetch reads w's /metrics: the engine's load, or that of w's rank.
func (s *scraper) fetch(ctx context.Context, w *worker) (enginemetrics.Load, error) {
	url := w.address + "/metrics"
	ctx, cancel := context.WithTimeout(ctx, max(s.interval*5, time.Second))
	defer cancel()
	read := func() ([]byte, error) { return s.read(ctx, url) }
	var body []byte
	var err error
	if s.reads != nil {
		body, err = s.reads.get(ctx, w.address, read)
	} else {
		body, err = read()
	}
	if err != nil {
		return enginemetrics.Load{}, err
	}
	o := enginemetrics.Options{Kind: s.kind, Force: s.force, Rank: w.rank, ByRank: w.hasRank}
	l, err := enginemetrics.ParseWith(bytes.NewReader(body), o)
	switch {
	case errors.Is(err, enginemetrics.ErrNoNewStats):
		return l, err
	case errors.Is(err, enginemetrics.ErrUnknownExposition):
		return l, &scrapeError{"unknown-exposition", fmt.Errorf("GET %s: %w", url, err)}
	case err != nil:
		return l, &scrapeError{"read", fmt.Errorf("GET %s: %w", url, err)}
	}
	return l, nil
}

// maxMetricsBytes bounds one read of an engine's /metrics.
const maxMetricsBytes = 16 << 20

// read GETs url and returns its body (at most maxMetricsBytes).
func (s *scraper) read(ctx context.Context, url string) ([]byte, error) {
	return getBody(ctx, s.client, url, maxMetricsBytes)
}

// getBody GETs an engine's url and returns its body, read up to limit
// bytes; failures are scrapeErrors naming the reason for the metrics.
func getBody(ctx context.Context, c *http.Client, url string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, &scrapeError{"unreachable", fmt.Errorf("GET %s: %w", url, err)}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, &scrapeError{"unreachable", err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return nil, &scrapeError{"status", fmt.Errorf("GET %s: %s", url, resp.Status)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, &scrapeError{"read", fmt.Errorf("GET %s: %w", url, err)}
	}
	return body, nil
}
