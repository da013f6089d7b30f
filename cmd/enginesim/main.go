// Command enginesim is a simulated vLLM engine: an OpenAI-compatible HTTP
// server in front of one kvdir engine model (paged prefix cache, continuous
// batching, step times from a calibrated profile) that publishes vLLM KV
// cache events over ZeroMQ and exposes vLLM's Prometheus metrics. Fault
// switches under /admin let tests drop events, slow the engine down, fail
// requests and restart the engine.
//
// Run "enginesim --help" for the flags; every flag can also be set through
// the environment as KVDIR_ENGINESIM_<FLAG>, e.g. KVDIR_ENGINESIM_KV_BLOCKS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/envflag"
	"github.com/kvdir/kvdir/internal/simengine"
)

// envPrefix prefixes the environment equivalents of the flags.
const envPrefix = "KVDIR_ENGINESIM_"

// config is the parsed command line.
type config struct {
	addr             string
	model            string
	profile          string
	blockSize        int
	kvBlocks         int
	maxBatchedTokens int
	maxRunning       int
	maxModelLen      int
	timeScale        float64
	seed             uint64
	defaultMaxTokens int
	maxBodyBytes     int64

	eventsEndpoint    string
	replayEndpoint    string
	topic             string
	eventsForm        string
	replayLayout      string
	replayBufferSteps int
	dpRank            int

	logLevel string
}

const usageHeader = `enginesim: a simulated vLLM engine for kvdir tests, benchmarks and demos.

It serves an OpenAI-compatible API for one model on top of kvdir's engine
model (paged KV cache with prefix caching and LRU eviction, continuous
batching with chunked prefill, step times from a calibrated H200 profile),
publishes vLLM KV-cache events (KVEventBatch, msgpack) on a ZeroMQ PUB socket
with an optional replay ROUTER socket, and exports vLLM's metrics.

Endpoints:
  POST /v1/chat/completions, POST /v1/completions   (stream or not)
  GET  /v1/models, GET /health, POST /tokenize, GET /metrics
  POST /reset_prefix_cache   clear the prefix cache (emits AllBlocksCleared)
  POST /admin/faults         {"drop_event_fraction","loss_fraction",
                              "slow_factor","fail_fraction"}; GET shows them
  POST /admin/restart        simulate an engine restart: empty cache, event
                              sequence back to 0, no AllBlocksCleared

Every flag can also be set as an environment variable KVDIR_ENGINESIM_<NAME>
(upper case, dashes as underscores); command-line flags win.

Flags:
`

// newFlagSet defines the flags into cfg.
func newFlagSet(cfg *config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHeader)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8000", "HTTP listen `address` (port 0 picks a free port)")
	fs.StringVar(&cfg.model, "model", "llama3-8b", "model `name` served; requests naming another model get 404")
	fs.StringVar(&cfg.profile, "profile", costmodel.DefaultProfileName, "timing profile: a built-in `name` ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON profile file path")
	fs.IntVar(&cfg.blockSize, "block-size", simengine.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&cfg.kvBlocks, "kv-blocks", 32768, "KV-cache capacity in `blocks`")
	fs.IntVar(&cfg.maxBatchedTokens, "max-batched-tokens", simengine.DefaultMaxBatchedTokens, "token budget per engine step (vLLM max_num_batched_tokens)")
	fs.IntVar(&cfg.maxRunning, "max-running", simengine.DefaultMaxRunning, "most running requests (vLLM max_num_seqs)")
	fs.IntVar(&cfg.maxModelLen, "max-model-len", 131072, "longest prompt + completion in `tokens` (capped at the KV capacity)")
	fs.Float64Var(&cfg.timeScale, "time-scale", 1, "wall time per modelled time: 1 real time, 0.1 ten times faster, 0 never sleeps")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seeds block hashes and generated tokens")
	fs.IntVar(&cfg.defaultMaxTokens, "default-max-tokens", 16, "completion length when a request sets neither max_tokens nor max_completion_tokens")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", 8<<20, "largest accepted request body in `bytes`")
	fs.StringVar(&cfg.eventsEndpoint, "kv-events-endpoint", "", "ZMQ PUB `endpoint` for KV events, e.g. tcp://*:5557 (binds if it contains * or ::, else connects, as vLLM); empty disables events")
	fs.StringVar(&cfg.replayEndpoint, "kv-events-replay-endpoint", "", "ZMQ ROUTER `endpoint` for replay requests, e.g. tcp://*:5558; empty disables replay")
	fs.StringVar(&cfg.topic, "kv-events-topic", "", "topic frame of every event message")
	fs.StringVar(&cfg.eventsForm, "kv-events-form", "array", "event encoding: array (vLLM <= v0.25) or map (v0.26+)")
	fs.StringVar(&cfg.replayLayout, "replay-layout", "old", "replay reply framing: old (vLLM <= v0.25) or new (v0.26+)")
	fs.IntVar(&cfg.replayBufferSteps, "replay-buffer-steps", 10000, "event batches kept for replay")
	fs.IntVar(&cfg.dpRank, "data-parallel-rank", 0, "data-parallel rank: offsets the event ports as vLLM does, written into every batch and used as the metrics' engine label")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	return fs
}

// parseConfig parses args, then sets from the environment what they did
// not set.
func parseConfig(args []string, getenv func(string) string, out io.Writer) (config, error) {
	var cfg config
	fs := newFlagSet(&cfg, out)
	if err := fs.Parse(args); err != nil {
		return cfg, fmt.Errorf("flags: %w", err)
	}
	if err := envflag.Apply(fs, envPrefix, getenv); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return cfg, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

// run parses args, serves until ctx is done and shuts down. ready, if not
// nil, is called with the running server once it listens.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(*server)) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	s, err := newServer(ctx, cfg, logger)
	if err != nil {
		return err
	}
	return s.serve(ctx, ready)
}
