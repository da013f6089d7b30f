package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"

	"github.com/kvdir/kvdir/internal/enginemetrics"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// maxMetricsBody bounds the engine's /metrics response read.
const maxMetricsBody = 8 << 20

// ParseLoad reads the engine's load from its /metrics body (see
// enginemetrics.Parse, which detects vLLM, SGLang and TensorRT-LLM):
// running and waiting requests, KV-cache usage and the prefix-cache
// counters. An exposition without the load metrics gives a zero load.
func ParseLoad(r io.Reader) *kvdirv1.Load {
	l, _ := ParseLoadWith(r, enginemetrics.Options{})
	if l == nil {
		return &kvdirv1.Load{}
	}
	return l
}

// ParseLoadWith reads the engine's load as o says (a forced kind, one
// data-parallel rank); it fails on an exposition without the load metrics.
// A TensorRT-LLM engine with no iteration since the last read is idle: a
// heartbeat every few seconds has no fresher load to keep.
func ParseLoadWith(r io.Reader, o enginemetrics.Options) (*kvdirv1.Load, error) {
	l, _, err := parseLoadFresh(r, o)
	return l, err
}

// parseLoadFresh is ParseLoadWith that also says whether the load is
// fresh: false for a TensorRT-LLM read with no new iteration, whose zero
// counters say nothing about the engine's.
func parseLoadFresh(r io.Reader, o enginemetrics.Options) (*kvdirv1.Load, bool, error) {
	l, err := enginemetrics.ParseWith(io.LimitReader(r, maxMetricsBody), o)
	if err != nil && !errors.Is(err, enginemetrics.ErrNoNewStats) {
		return nil, false, err
	}
	return toLoad(l), err == nil, nil
}

func toLoad(l enginemetrics.Load) *kvdirv1.Load {
	return &kvdirv1.Load{
		Running: toU32(float64(l.Running)), Waiting: toU32(float64(l.Waiting)), KvUsage: l.KVUsage,
		PrefixQueries: toU64(l.PrefixQueries), PrefixHits: toU64(l.PrefixHits),
	}
}

// LoadOptions are how c's engine metrics are read: an SGLang or
// TensorRT-LLM engine's shape is forced, any other (vLLM, enginesim,
// unspecified) detected; MetricsRank selects one data-parallel rank.
func LoadOptions(c Config) enginemetrics.Options {
	o := enginemetrics.Options{Rank: c.MetricsRank, ByRank: c.MetricsByRank}
	switch c.Engine {
	case kvdirv1.EngineKind_ENGINE_KIND_SGLANG:
		o.Kind, o.Force = enginemetrics.KindSGLang, true
	case kvdirv1.EngineKind_ENGINE_KIND_TRTLLM:
		o.Kind, o.Force = enginemetrics.KindTRTLLM, true
	}
	return o
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

// scrapeLoad fetches and parses url as o says; fresh is false when the
// engine reported no iteration since the last read (see parseLoadFresh).
// errEngineUnreachable is wrapped by scrape errors that say the engine is
// not there (no HTTP answer, or a gateway's 502, 503 or 504), as opposed to
// an engine that answers with something unexpected.
var errEngineUnreachable = errors.New("engine unreachable")

func scrapeLoad(ctx context.Context, hc *http.Client, url string, o enginemetrics.Options) (load *kvdirv1.Load, fresh bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, false, fmt.Errorf("agent: scrape %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("agent: scrape %s: %w: %w", url, errEngineUnreachable, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return nil, false, fmt.Errorf("agent: scrape %s: %w: status %s", url, errEngineUnreachable, resp.Status)
	default:
		return nil, false, fmt.Errorf("agent: scrape %s: status %s", url, resp.Status)
	}
	l, fresh, err := parseLoadFresh(resp.Body, o)
	if err != nil {
		return nil, false, fmt.Errorf("agent: scrape %s: %w", url, err)
	}
	return l, fresh, nil
}
