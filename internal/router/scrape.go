package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvdir/kvdir/internal/enginemetrics"
)

// scraper polls each worker's /metrics.
type scraper struct {
	client   *http.Client
	interval time.Duration
	failures int // consecutive failures after which a worker is considered down
	onError  func(w *worker, err error)
}

// run scrapes w every interval until w.stop closes or ctx ends.
func (s *scraper) run(ctx context.Context, w *worker) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.once(ctx, w)
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
	l, err := s.fetch(ctx, w.address+"/metrics")
	if err != nil {
		if w.scrapeKO.Add(1) == int32(s.failures) && s.onError != nil {
			s.onError(w, err)
		}
		return
	}
	w.scrapeKO.Store(0)
	w.running.Store(int32(l.Running))
	w.waiting.Store(int32(l.Waiting))
	storeFloat(&w.kvUsage, l.KVUsage)
	if l.Model != "" && w.model() == "" {
		w.setModel(l.Model)
	}
	w.scrapeAt.Store(time.Now().UnixNano())
}

func (s *scraper) fetch(ctx context.Context, url string) (enginemetrics.Load, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.interval*5, time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return enginemetrics.Load{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return enginemetrics.Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return enginemetrics.Load{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return enginemetrics.Parse(io.LimitReader(resp.Body, 16<<20))
}
