package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Data parallelism behind one API server, as vLLM runs it with
// --data-parallel-size N: one HTTP server in front of N engines (ranks),
// each with its own prefix cache, its own KV-event stream on the endpoint
// ports offset by its rank, and its own metric series (engine="<rank>").
// A request names its rank in the X-data-parallel-rank header, or goes to
// the least loaded rank.

// HeaderDataParallelRank is the request header naming the rank, as vLLM's
// OpenAI server reads it (header names are case-insensitive).
const HeaderDataParallelRank = "X-data-parallel-rank"

// maxDataParallelSize bounds --data-parallel-size.
const maxDataParallelSize = 256

// addRanks starts ranks 1 to N-1 beside s (rank 0) when
// --data-parallel-size is above 1, and makes s's /metrics export every
// rank's series.
func (s *server) addRanks(ctx context.Context) error {
	if s.cfg.dpSize <= 1 {
		return nil
	}
	s.ranks = []*server{s}
	gatherers := prometheus.Gatherers{s.metrics.reg}
	for r := 1; r < s.cfg.dpSize; r++ {
		cfg := s.cfg
		cfg.dpRank = r
		rs, err := newEngine(ctx, cfg, s.log.With("rank", r))
		if err != nil {
			return fmt.Errorf("data-parallel rank %d: %w", r, err)
		}
		s.ranks = append(s.ranks, rs)
		rs.metrics.reg.Unregister(rs.metrics.oversized) // rank 0 exports the process's count
		gatherers = append(gatherers, rs.metrics.reg)
	}
	s.metrics.handler = promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{})
	return nil
}

// all returns the engines behind the server: its ranks, or s alone.
func (s *server) all() []*server {
	if s.ranks == nil {
		return []*server{s}
	}
	return s.ranks
}

// stopAll stops every rank's engine.
func (s *server) stopAll() {
	for _, rs := range s.all() {
		if rs.cur != nil {
			rs.current().stop()
		}
	}
}

// closePublishers closes every rank's KV-event publisher.
func (s *server) closePublishers() {
	for _, rs := range s.all() {
		rs.closePublisher()
	}
}

// pickRank returns the engine a request goes to: the rank its
// X-data-parallel-rank header names (a rank out of range is refused with
// 400, as vLLM refuses it; a value that is not an integer is ignored, as
// vLLM ignores it), else the least loaded rank. It writes the error itself.
func (s *server) pickRank(w http.ResponseWriter, r *http.Request) (*server, bool) {
	all := s.all()
	if v := r.Header.Get(HeaderDataParallelRank); v != "" {
		if rank, err := strconv.Atoi(v); err == nil {
			if rank < 0 || rank >= len(all) {
				badRequest(w, "data_parallel_rank %d is out of range [0, %d).", rank, len(all))
				return nil, false
			}
			return all[rank], true
		}
	}
	if len(all) == 1 {
		return s, true
	}
	// vLLM's balancer: the lowest 4 x waiting + running, the search
	// starting one rank further each time so that idle ranks share the
	// requests.
	start := int(s.nextRank.Add(1) % uint64(len(all)))
	best, bestScore := all[start], -1
	for i := range all {
		rs := all[(start+i)%len(all)]
		st := rs.current().runner.Stats()
		if score := 4*st.Waiting + st.Running; bestScore < 0 || score < bestScore {
			best, bestScore = rs, score
		}
	}
	return best, true
}

// onRank serves a completion request with the engine of its rank.
func (s *server) onRank(h func(*server, http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if rs, ok := s.pickRank(w, r); ok {
			h(rs, w, r)
		}
	}
}
