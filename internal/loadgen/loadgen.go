// Package loadgen sends a trace's requests to a live OpenAI-compatible
// endpoint (kvdir routers, HAProxy, or any URL) open-loop at the trace's
// timestamps, and observes each one as a Sample: which replica served
// it (the X-Kvdir-Worker response header), when its first token and its end
// arrived, and how many prompt tokens the engine served from its prefix cache
// (usage.prompt_tokens_details.cached_tokens, the engine's own accounting).
//
// Prompts are sent as token ids (POST /v1/completions with "prompt": [ids]),
// built from the trace's hash ids by workload.Prompt, so the engines' prefix
// caches see exactly the sharing the trace describes. Times are reported on
// the trace's clock: wall time divided by the time scale, which is also the
// engines' --time-scale, so that a compressed replay reports the latencies
// the modelled engines would have had.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/enginemetrics"
	"github.com/kvdir/kvdir/internal/workload"
)

// QueueSeries is the largest engine queue of each replica in consecutive
// intervals of IntervalSec, starting at time 0.
type QueueSeries struct {
	IntervalSec float64 `json:"interval_sec"`
	Replicas    [][]int `json:"replicas"` // [replica][interval]
}

// Sample is one request as a run observed it.
type Sample struct {
	Replica      int           // index of the replica that served it
	PromptTokens int           // prompt length
	CachedTokens int           // prompt tokens served from the replica's prefix cache
	IdealCached  int           // what one unlimited cache would have served (workload.IdealHits)
	OutputTokens int           // generated tokens
	Arrival      time.Duration // since the run's epoch
	FirstToken   time.Duration
	Finish       time.Duration
	Rejected     bool // refused; only Replica and the token counts are meaningful
}

// Engine is one replica behind the endpoint.
type Engine struct {
	ID  string // worker id, as the X-Kvdir-Worker header names it
	URL string // base URL, for reading its queue from /metrics
}

// Config describes one replay run.
type Config struct {
	Records         []workload.Record
	TraceBlockSize  int // tokens per trace block (512 for Mooncake traces)
	EngineBlockSize int // the engines' KV block size, for the ideal-hit count
	Model           string
	// URLs are the endpoints; request i goes to URLs[i % len(URLs)], so
	// consecutive turns of a session may go through different routers.
	URLs []string
	// TimeScale multiplies trace time into wall time (0.1: ten times faster).
	TimeScale float64
	Engines   []Engine
	// SessionHeader carries the record's session id, or "h<first hash
	// id>" for records without one (default X-Session-Id).
	SessionHeader string
	// MaxInFlight bounds concurrent requests (default 4096); a request that
	// would exceed it waits, and the delay shows in its TTFT.
	MaxInFlight int
	// QueueEvery is the wall interval of queue sampling (default 200 ms).
	QueueEvery time.Duration
	// Progress, if set, is called after each request with done and total.
	Progress func(done, total int)
	// Unattributed, for an endpoint that does not name the worker that
	// served a request (any OpenAI server): every response counts for
	// Engines[0].
	Unattributed bool
}

// Result is what a run observed.
type Result struct {
	Samples   []Sample
	Queue     *QueueSeries // per replica, trace-time intervals
	PeakQueue []int        // per replica
	Errors    int          // requests that failed at the transport or with an unexpected status
	FirstErr  string
	WallSec   float64
	// SendLagMax is the latest a request left after its scheduled time (wall
	// clock); it counts in that request's latencies.
	SendLagMax time.Duration
	// Fallbacks counts the routers' requests placed without the directory,
	// by reason (kvdir_router_fallbacks_total; nil for HAProxy).
	Fallbacks map[string]int
	// LookupP50Ms and LookupP99Ms bound the routers' directory look-up
	// latency (histogram bucket upper bounds; 0 for HAProxy).
	LookupP50Ms, LookupP99Ms float64
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, DisableCompression: true}}

// Run replays cfg.Records and returns one sample per record, in order.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.URLs) == 0 || cfg.TimeScale <= 0 || cfg.TraceBlockSize <= 0 || cfg.EngineBlockSize <= 0 || cfg.Model == "" {
		return nil, errors.New("loadgen: Config needs URLs, Model, a positive TimeScale and block sizes")
	}
	if cfg.SessionHeader == "" {
		cfg.SessionHeader = "X-Session-Id"
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4096
	}
	if cfg.QueueEvery <= 0 {
		cfg.QueueEvery = 200 * time.Millisecond
	}
	replica := make(map[string]int, len(cfg.Engines))
	for i, e := range cfg.Engines {
		replica[e.ID] = i
	}
	ideal := workload.IdealHits(cfg.Records, cfg.TraceBlockSize, cfg.EngineBlockSize)
	res := &Result{Samples: make([]Sample, len(cfg.Records))}

	qctx, stopQueue := context.WithCancel(ctx)
	queueDone := make(chan struct{})
	go func() { defer close(queueDone); sampleQueues(qctx, cfg, res) }()

	sem := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	// stop waits for the requests sent and ends the queue sampling.
	stop := func() {
		wg.Wait()
		stopQueue()
		<-queueDone
	}
	var done atomic.Int64
	var mu sync.Mutex
	start := time.Now()
	for i := range cfg.Records {
		rec := &cfg.Records[i]
		// Build the body before the request is due, so that its cost does
		// not count as latency.
		body, err := requestBody(cfg, rec)
		if err != nil {
			stop()
			return nil, err
		}
		at := start.Add(time.Duration(rec.Timestamp * cfg.TimeScale * float64(time.Millisecond)))
		if d := time.Until(at); d > 0 {
			select {
			case <-ctx.Done():
				stop()
				return nil, ctx.Err()
			case <-time.After(d):
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			lag := time.Since(at)
			s, err := send(ctx, cfg, rec, body, cfg.URLs[i%len(cfg.URLs)], start, replica)
			s.IdealCached = ideal[i]
			s.Arrival = time.Duration(rec.Timestamp * float64(time.Millisecond))
			res.Samples[i] = s
			mu.Lock()
			res.SendLagMax = max(res.SendLagMax, lag)
			mu.Unlock()
			if err != nil {
				mu.Lock()
				res.Errors++
				if res.FirstErr == "" {
					res.FirstErr = err.Error()
				}
				mu.Unlock()
			}
			n := done.Add(1)
			if cfg.Progress != nil {
				cfg.Progress(int(n), len(cfg.Records))
			}
		}()
	}
	wg.Wait()
	res.WallSec = time.Since(start).Seconds()
	stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// completion is the request body.
type completion struct {
	Model         string   `json:"model"`
	Prompt        []uint32 `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Stream        bool     `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// requestBody is rec's completion request.
func requestBody(cfg Config, rec *workload.Record) ([]byte, error) {
	body := completion{Model: cfg.Model, Prompt: workload.Prompt(nil, rec, cfg.TraceBlockSize), MaxTokens: max(rec.OutputLength, 1), Stream: true}
	body.StreamOptions.IncludeUsage = true
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("replay: encode the request at %.0f ms: %w", rec.Timestamp, err)
	}
	return b, nil
}

// send runs one request and observes it. Times in the sample are on the
// trace clock relative to the request's scheduled arrival.
func send(ctx context.Context, cfg Config, rec *workload.Record, b []byte, url string, start time.Time, replica map[string]int) (Sample, error) {
	s := Sample{Replica: -1, PromptTokens: rec.InputLength, OutputTokens: rec.OutputLength, Rejected: true}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return s, err
	}
	req.Header.Set("Content-Type", "application/json")
	sess := rec.SessionID
	if sess == "" && len(rec.HashIDs) > 0 {
		sess = "h" + strconv.FormatInt(rec.HashIDs[0], 10)
	}
	req.Header.Set(cfg.SessionHeader, sess)
	arrival := start.Add(time.Duration(rec.Timestamp * cfg.TimeScale * float64(time.Millisecond)))
	traceTime := func(t time.Time) time.Duration {
		return time.Duration(float64(t.Sub(arrival))/cfg.TimeScale) + time.Duration(rec.Timestamp*float64(time.Millisecond))
	}
	resp, err := client.Do(req)
	if err != nil {
		return s, fmt.Errorf("request at %.0f ms: %w", rec.Timestamp, err)
	}
	defer resp.Body.Close()
	if r, ok := replica[resp.Header.Get("X-Kvdir-Worker")]; ok {
		s.Replica = r
	} else if cfg.Unattributed {
		s.Replica = 0
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode == http.StatusBadRequest {
			return s, nil // refused by the engine (e.g. longer than its cache): a rejection, not an error
		}
		return s, fmt.Errorf("request at %.0f ms: %s: %s", rec.Timestamp, resp.Status, bytes.TrimSpace(msg))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var first bool
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if bytes.Equal(data, []byte("[DONE]")) {
			break
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
				Details    *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return s, fmt.Errorf("request at %.0f ms: bad stream chunk %q: %w", rec.Timestamp, data, err)
		}
		if !first && len(chunk.Choices) > 0 {
			first = true
			s.FirstToken = traceTime(time.Now())
		}
		if chunk.Usage != nil {
			s.PromptTokens, s.OutputTokens = chunk.Usage.Prompt, chunk.Usage.Completion
			if chunk.Usage.Details != nil {
				s.CachedTokens = chunk.Usage.Details.Cached
			}
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("request at %.0f ms: reading the stream: %w", rec.Timestamp, err)
	}
	s.Finish = traceTime(time.Now())
	if !first {
		s.FirstToken = s.Finish
	}
	s.Rejected = false
	if s.Replica < 0 {
		return s, fmt.Errorf("request at %.0f ms: response names no known worker (X-Kvdir-Worker %q)", rec.Timestamp, resp.Header.Get("X-Kvdir-Worker"))
	}
	return s, nil
}

// sampleQueues records each engine's waiting requests every QueueEvery
// until ctx ends.
func sampleQueues(ctx context.Context, cfg Config, res *Result) {
	n := len(cfg.Engines)
	res.PeakQueue = make([]int, n)
	if n == 0 {
		return
	}
	series := &QueueSeries{IntervalSec: cfg.QueueEvery.Seconds() / cfg.TimeScale, Replicas: make([][]int, n)}
	res.Queue = series
	t := time.NewTicker(cfg.QueueEvery)
	defer t.Stop()
	hc := &http.Client{Timeout: time.Second}
	for {
		for i, e := range cfg.Engines {
			w := 0
			if e.URL == "" {
				continue // nothing to read (an endpoint given by URL)
			}
			if resp, err := hc.Get(e.URL + "/metrics"); err == nil {
				if l, err := enginemetrics.Parse(resp.Body); err == nil {
					w = l.Waiting
				}
				resp.Body.Close()
			}
			series.Replicas[i] = append(series.Replicas[i], w)
			res.PeakQueue[i] = max(res.PeakQueue[i], w)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
