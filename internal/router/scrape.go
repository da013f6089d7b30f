package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// engineLoad is what one scrape of an engine's /metrics gives.
type engineLoad struct {
	running, waiting int
	kvUsage          float64
	model            string // the model_name label, if any
}

// Metric names of vLLM (and of the engine simulator) the router reads.
const (
	metricRunning    = "vllm:num_requests_running"
	metricWaiting    = "vllm:num_requests_waiting"
	metricKVUsage    = "vllm:kv_cache_usage_perc"
	metricKVUsageOld = "vllm:gpu_cache_usage_perc" // vLLM before v0.10
)

// parseEngineMetrics reads the gauges the router needs from a Prometheus
// text exposition. Running and waiting requests are summed over series
// (one per data-parallel engine); KV usage is their mean.
func parseEngineMetrics(r io.Reader) (engineLoad, error) {
	var out engineLoad
	var kvSum float64
	var kvN, seen int
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' || line[0] != 'v' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch string(name) {
		case metricRunning:
			out.running += int(value)
		case metricWaiting:
			out.waiting += int(value)
		case metricKVUsage, metricKVUsageOld:
			kvSum += value
			kvN++
		default:
			continue
		}
		seen++
		if out.model == "" {
			out.model = labelValue(labels, "model_name")
		}
	}
	if err := sc.Err(); err != nil {
		return engineLoad{}, fmt.Errorf("read metrics: %w", err)
	}
	if seen == 0 {
		return engineLoad{}, fmt.Errorf("no %s, %s or %s series in the metrics", metricRunning, metricWaiting, metricKVUsage)
	}
	if kvN > 0 {
		out.kvUsage = kvSum / float64(kvN)
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
	w.running.Store(int32(l.running))
	w.waiting.Store(int32(l.waiting))
	storeFloat(&w.kvUsage, l.kvUsage)
	if l.model != "" && w.model() == "" {
		w.setModel(l.model)
	}
	w.scrapeAt.Store(time.Now().UnixNano())
}

func (s *scraper) fetch(ctx context.Context, url string) (engineLoad, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.interval*5, time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return engineLoad{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return engineLoad{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return engineLoad{}, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseEngineMetrics(io.LimitReader(resp.Body, 16<<20))
}
