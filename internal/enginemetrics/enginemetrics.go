// Package enginemetrics reads an inference engine's load from its
// Prometheus text exposition: the gauges vLLM exports (and the engine
// simulator with it) for running and waiting requests and KV-cache usage.
// The router scrapes them to place requests; benchmarks to record queues.
package enginemetrics

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Load is what one scrape of an engine's /metrics gives.
type Load struct {
	Running, Waiting int     // requests running and waiting, summed over the engine's series
	KVUsage          float64 // KV-cache usage 0..1, the largest over its series
	// PrefixQueries and PrefixHits are the cumulative prefix-cache counters
	// in tokens, summed over series (0 if the engine exports none).
	PrefixQueries, PrefixHits float64
	Model                     string // the model_name label, if any
}

// Metric names of vLLM (and of the engine simulator) read here; the "old"
// ones are the names vLLM used before v0.10, read when the new ones are
// absent.
const (
	metricRunning    = "vllm:num_requests_running"
	metricWaiting    = "vllm:num_requests_waiting"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc"
)

// Parse reads an engine's load from a Prometheus text exposition. Running
// and waiting requests and the prefix-cache counters are summed over series
// (one per data-parallel engine); KV usage is the largest, clamped to
// [0, 1]. Unknown lines and malformed or non-finite values are ignored. It
// fails when the exposition has none of the load gauges.
func Parse(r io.Reader) (Load, error) {
	var out Load
	var usage, oldUsage, oldQ, oldH float64
	var haveUsage, haveQ bool
	seen := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != 'v' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok || math.IsNaN(value) || math.IsInf(value, 0) {
			continue
		}
		switch string(name) {
		case metricRunning:
			out.Running += int(max(value, 0))
		case metricWaiting:
			out.Waiting += int(max(value, 0))
		case metricKVUsage:
			usage, haveUsage = max(usage, value), true
		case metricKVUsageOld:
			oldUsage = max(oldUsage, value)
		case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries":
			out.PrefixQueries, haveQ = out.PrefixQueries+value, true
			continue
		case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits":
			out.PrefixHits += value
			continue
		case "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries":
			oldQ += value
			continue
		case "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits":
			oldH += value
			continue
		default:
			continue
		}
		seen++
		if out.Model == "" {
			out.Model = labelValue(labels, "model_name")
		}
	}
	if err := sc.Err(); err != nil {
		return Load{}, fmt.Errorf("read metrics: %w", err)
	}
	if !haveUsage {
		usage = oldUsage
	}
	out.KVUsage = min(max(usage, 0), 1)
	if !haveQ {
		out.PrefixQueries, out.PrefixHits = oldQ, oldH
	}
	if seen == 0 {
		return out, fmt.Errorf("no %s, %s or %s series in the metrics", metricRunning, metricWaiting, metricKVUsage)
	}
	return out, nil
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line []byte) (name, labels []byte, value float64, ok bool) {
	i := bytes.IndexAny(line, "{ ")
	if i <= 0 {
		return nil, nil, 0, false
	}
	name, rest := line[:i], line[i:]
	if rest[0] == '{' {
		j := bytes.LastIndexByte(rest, '}')
		if j < 0 {
			return nil, nil, 0, false
		}
		labels, rest = rest[1:j], rest[j+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 {
		return nil, nil, 0, false
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil {
		return nil, nil, 0, false
	}
	return name, labels, v, true
}

// labelValue returns the value of label key in `a="x",b="y"` (unescaped
// values are enough for model names).
func labelValue(labels []byte, key string) string {
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return ""
		}
		k := bytes.TrimSpace(labels[:eq])
		end := eq + 2
		for end < len(labels) && labels[end] != '"' {
			if labels[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(labels) {
			return ""
		}
		if string(k) == key {
			return string(labels[eq+2 : end])
		}
		labels = labels[end+1:]
		if len(labels) > 0 && labels[0] == ',' {
			labels = labels[1:]
		}
	}
	return ""
}
