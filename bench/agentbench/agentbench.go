// Package agentbench measures kvdir's engine side (kvbench agent, make
// bench-agent): how fast the agent's hot path decodes, re-hashes and maps
// engine KV events on one goroutine (decode.go); the lag from an engine
// finishing a prefill to the prompt's blocks being visible in a directory
// Match, with real directory cluster, enginesim and agent processes on
// loopback (e2e.go); and the engine model's own scheduling overhead at time
// scale 0 (decode.go).
//
// List (list.go) prints a running directory's workers and a Match for a
// chat prompt instead (kvbench agent list).
package agentbench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
)

// Tool is the name the results carry.
const Tool = "agent"

// Options shape a run. A zero field means its default (see Defaults); Log
// may be nil.
type Options struct {
	// DecodeFor is how long the decode+hash+map loop runs.
	DecodeFor time.Duration
	// Requests is the chat requests timed end to end, Concurrency of them
	// in flight, against an enginesim at TimeScale.
	Requests    int
	Concurrency int
	TimeScale   float64
	// EngineRequests is the requests run through the engine model at time
	// scale 0.
	EngineRequests int
	// SkipE2E skips the end-to-end phase (no processes started).
	SkipE2E bool
	// Dir holds the binaries and data; empty: a temporary directory,
	// removed after.
	Dir string
	Log *slog.Logger
}

// Defaults are the options of the committed figures.
var Defaults = Options{DecodeFor: 3 * time.Second, Requests: 300, Concurrency: 4, TimeScale: 1, EngineRequests: 20000}

func (o Options) withDefaults() Options {
	d := o
	benchopt.Default(&d.DecodeFor, Defaults.DecodeFor)
	benchopt.Default(&d.Requests, Defaults.Requests)
	benchopt.Default(&d.Concurrency, Defaults.Concurrency)
	benchopt.Default(&d.TimeScale, Defaults.TimeScale)
	benchopt.Default(&d.EngineRequests, Defaults.EngineRequests)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// Measures are a run's numbers as the tool measured them; their JSON names
// are the figure and detail names.
type Measures struct {
	DecodeHashBlocksPerSec float64 `json:"decode_hash_blocks_per_sec"`
	DecodeBatches          int     `json:"decode_corpus_batches"`
	DecodeBlocks           int     `json:"decode_corpus_stored_blocks"`
	DecodeCorpusBytes      int     `json:"decode_corpus_bytes"`
	DecodeMethod           string  `json:"decode_method"`

	E2ERequests     int     `json:"end_to_end_requests"`
	E2EConcurrency  int     `json:"end_to_end_concurrency"`
	E2ETimeScale    float64 `json:"end_to_end_time_scale"`
	E2EPromptTokens float64 `json:"end_to_end_mean_prompt_tokens"`
	E2ELagP50ms     float64 `json:"end_to_end_event_lag_p50_ms"`
	E2ELagP99ms     float64 `json:"end_to_end_event_lag_p99_ms"`
	E2ELagMaxms     float64 `json:"end_to_end_event_lag_max_ms"`
	E2ETimeouts     int     `json:"end_to_end_timeouts"`
	E2EMethod       string  `json:"end_to_end_method"`

	EngineRequestsPerSec float64 `json:"enginesim_requests_per_sec"`
	EngineModelledRPS    float64 `json:"enginesim_modelled_requests_per_sec"`
	EngineRequests       int     `json:"enginesim_requests"`
	EngineMethod         string  `json:"enginesim_method"`
}

// Details are the envelope's details: the corpus, the end-to-end run's
// shape and how each figure was measured.
type Details struct {
	DecodeBatches     int    `json:"decode_corpus_batches"`
	DecodeBlocks      int    `json:"decode_corpus_stored_blocks"`
	DecodeCorpusBytes int    `json:"decode_corpus_bytes"`
	DecodeMethod      string `json:"decode_method"`

	E2ERequests     int     `json:"end_to_end_requests,omitempty"`
	E2EConcurrency  int     `json:"end_to_end_concurrency,omitempty"`
	E2ETimeScale    float64 `json:"end_to_end_time_scale,omitempty"`
	E2EPromptTokens float64 `json:"end_to_end_mean_prompt_tokens,omitempty"`
	// E2ETimeouts counts requests whose blocks were not visible within 5 s
	// (not in the lag figures).
	E2ETimeouts int    `json:"end_to_end_timeouts"`
	E2EMethod   string `json:"end_to_end_method,omitempty"`

	EngineRequests int    `json:"enginesim_requests"`
	EngineMethod   string `json:"enginesim_method"`
}

// Results fills res (from benchjson.New) with m's figures and details. The
// end-to-end figures are there only if that phase ran.
func (m *Measures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "decode_hash_blocks_per_sec", Unit: "blocks/s", Target: benchjson.Min(1_000_000), Measured: m.DecodeHashBlocksPerSec,
			Note: "KV-event decode + content hash + engine-hash map, one goroutine"})
	if m.E2ERequests > 0 {
		res.Figures = append(res.Figures,
			fig{Name: "end_to_end_event_lag_p50_ms", Unit: "ms", Measured: m.E2ELagP50ms,
				Note: "from an engine's first streamed token until a Match on a follower shows the prompt's blocks, p50"},
			fig{Name: "end_to_end_event_lag_p99_ms", Unit: "ms", Target: benchjson.Max(100), Measured: m.E2ELagP99ms, Note: "same, p99"},
			fig{Name: "end_to_end_event_lag_max_ms", Unit: "ms", Measured: m.E2ELagMaxms, Note: "same, slowest"})
	}
	res.Figures = append(res.Figures,
		fig{Name: "enginesim_requests_per_sec", Unit: "requests/s", Measured: m.EngineRequestsPerSec,
			Note: "the engine model's scheduler at time scale 0, wall clock"},
		fig{Name: "enginesim_modelled_requests_per_sec", Unit: "requests/s", Measured: m.EngineModelledRPS,
			Note: "the same requests on the model's own clock"})
	return res.SetDetails(Details{DecodeBatches: m.DecodeBatches, DecodeBlocks: m.DecodeBlocks, DecodeCorpusBytes: m.DecodeCorpusBytes,
		DecodeMethod: m.DecodeMethod, E2ERequests: m.E2ERequests, E2EConcurrency: m.E2EConcurrency, E2ETimeScale: m.E2ETimeScale,
		E2EPromptTokens: m.E2EPromptTokens, E2ETimeouts: m.E2ETimeouts, E2EMethod: m.E2EMethod,
		EngineRequests: m.EngineRequests, EngineMethod: m.EngineMethod})
}

// Run measures and returns the results (without their command, which the
// caller knows). Every process it starts is stopped before it returns.
func Run(ctx context.Context, opts Options) (*benchjson.Results, error) {
	return benchjson.Measure(Tool, func() (*Measures, error) { return measure(ctx, opts.withDefaults()) })
}

func measure(ctx context.Context, cfg Options) (*Measures, error) {
	log := cfg.Log
	res := &Measures{}
	if err := benchDecode(log, cfg.DecodeFor, res); err != nil {
		return nil, fmt.Errorf("decode benchmark: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := benchEngine(log, cfg.EngineRequests, res); err != nil {
		return nil, fmt.Errorf("engine benchmark: %w", err)
	}
	if cfg.SkipE2E {
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvdir-agentbench-")
		if err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if err := benchE2E(ctx, log, cfg, dir, res); err != nil {
		return nil, fmt.Errorf("end-to-end benchmark: %w", err)
	}
	return res, nil
}
