package agent

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/kvdir/kvdir/internal/enginemetrics"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// maxMetricsBody bounds the engine's /metrics response read.
const maxMetricsBody = 8 << 20

// ParseLoad reads the engine's load from a Prometheus text exposition (see
// enginemetrics.Parse): running and waiting requests, KV-cache usage and the
// prefix-cache counters. An exposition without the load gauges gives a zero
// load.
func ParseLoad(r io.Reader) *kvdirv1.Load {
	l, _ := enginemetrics.Parse(io.LimitReader(r, maxMetricsBody))
	return &kvdirv1.Load{
		Running: toU32(float64(l.Running)), Waiting: toU32(float64(l.Waiting)), KvUsage: l.KVUsage,
		PrefixQueries: toU64(l.PrefixQueries), PrefixHits: toU64(l.PrefixHits),
	}
}

func toU32(v float64) uint32 {
	if v <= 0 {
		return 0
	}
	if v >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

func toU64(v float64) uint64 {
	if v <= 0 {
		return 0
	}
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(v)
}

// scrapeLoad fetches and parses url.
func scrapeLoad(ctx context.Context, hc *http.Client, url string) (*kvdirv1.Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("agent: scrape %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent: scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent: scrape %s: status %s", url, resp.Status)
	}
	return ParseLoad(resp.Body), nil
}
