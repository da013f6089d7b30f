package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// maxMetricsBody bounds the engine's /metrics response read.
const maxMetricsBody = 8 << 20

// ParseLoad reads the engine's load from a Prometheus text exposition:
// vllm:num_requests_running and _waiting (summed over series),
// vllm:kv_cache_usage_perc (or the deprecated vllm:gpu_cache_usage_perc;
// the maximum over series) and the prefix-cache counters (summed). Unknown
// lines and malformed values are ignored.
func ParseLoad(r io.Reader) *kvdirv1.Load {
	var (
		running, waiting, usage, oldUsage float64
		queries, hits, oldQ, oldH         float64
		haveUsage, haveQ                  bool
	)
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBody))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, v, ok := sample(line)
		if !ok {
			continue
		}
		switch name {
		case "vllm:num_requests_running":
			running += v
		case "vllm:num_requests_waiting":
			waiting += v
		case "vllm:kv_cache_usage_perc":
			usage, haveUsage = math.Max(usage, v), true
		case "vllm:gpu_cache_usage_perc":
			oldUsage = math.Max(oldUsage, v)
		case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries":
			queries, haveQ = queries+v, true
		case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits":
			hits += v
		case "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries":
			oldQ += v
		case "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits":
			oldH += v
		}
	}
	if !haveUsage {
		usage = oldUsage
	}
	if !haveQ {
		queries, hits = oldQ, oldH
	}
	return &kvdirv1.Load{
		Running: toU32(running), Waiting: toU32(waiting),
		KvUsage:       math.Min(math.Max(usage, 0), 1),
		PrefixQueries: toU64(queries), PrefixHits: toU64(hits),
	}
}

// sample splits "name{labels} value [timestamp]".
func sample(line string) (string, float64, bool) {
	var name, rest string
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", 0, false
		}
		name, rest = line[:i], line[j+1:]
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return "", 0, false
		}
		name, rest = f[0], strings.Join(f[1:], " ")
	}
	f := strings.Fields(rest)
	if len(f) < 1 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return "", 0, false
	}
	return strings.TrimSpace(name), v, true
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
