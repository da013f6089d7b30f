// Command enginesim is a simulated vLLM engine: an OpenAI-compatible HTTP
// server in front of one kvdir engine model (paged prefix cache, continuous
// batching, step times from a calibrated profile) that publishes vLLM KV
// cache events over ZeroMQ and exposes vLLM's Prometheus metrics. Fault
// switches under /admin let tests drop events, slow the engine down, fail
// requests and restart the engine.
//
// Run "enginesim --help" for the flags; every flag can also be set through
// the environment as KVDIR_ENGINESIM_<FLAG>, e.g. KVDIR_ENGINESIM_KV_BLOCKS
// (see internal/cli). SIGTERM or SIGINT stops it; a second signal exits 130
// at once. A usage error exits 2, a failure 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
)

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
	maxMsgBytes      int64
	httpIdle         time.Duration

	eventsEndpoint    string
	eventsBind        bool
	replayEndpoint    string
	topic             string
	eventsForm        string
	replayLayout      string
	replayBufferSteps int
	dpRank            int
	dpSize            int

	kvCacheGroups      string
	eventsDialect      string
	speculativeBigrams bool
	kvReportMode       string
	metricsFormat      string
	shape              simengine.Shape // parsed from the four above (and media) by check
	media              mediaFlags      // media.go

	loraModules []loraModule

	kvEventsPull bool // trtllm-serve's POST /kv_cache_events (trtllm.go)
	trtQueueSize int
}

const summary = `enginesim is a simulated vLLM engine for kvdir tests, benchmarks and demos.

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
As trtllm-serve: --kv-events-pull serves POST /kv_cache_events, draining the
queued KV events as JSON (event_id from 0), and --metrics-format trtllm
answers GET /metrics with JSON iteration stats (drained on read too).`

const examples = `  # Ten times faster than real time, with KV events and replay as vLLM publishes them,
  # bound on loopback (the events carry the prompts' token ids):
  enginesim --addr 127.0.0.1:8000 --time-scale 0.1 \
    --kv-events-endpoint tcp://127.0.0.1:5557 --kv-events-bind --kv-events-replay-endpoint tcp://127.0.0.1:5558

  # A 70B model with a small cache, from the environment:
  KVDIR_ENGINESIM_PROFILE=llama3-70b KVDIR_ENGINESIM_KV_BLOCKS=4096 enginesim

  # Then:
  curl -s 127.0.0.1:8000/v1/chat/completions -d '{"model":"llama3-8b","messages":[{"role":"user","content":"hi"}]}'`

const notes = `SIGTERM or SIGINT stops the server; a second signal, a second or more
later, exits 130 at once. Exit status: 0 after a clean stop, 1 on an
error, 2 on a usage error.`

// newProgram declares the flags into cfg.
func newProgram(cfg *config, getenv func(string) string, stdout, stderr io.Writer) *cli.Program {
	p := &cli.Program{Name: "enginesim", Env: "ENGINESIM", Summary: summary, Examples: examples, Notes: notes,
		Getenv: getenv, Stdout: stdout, Stderr: stderr}
	fs := p.Flags()
	p.Group("Server")
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8000", "HTTP listen `address` (port 0 picks a free port)")
	fs.StringVar(&cfg.model, "model", "llama3-8b", "model `name` served; requests naming another model get 404")
	fs.Var(loraFlag{&cfg.loraModules}, "lora-modules", "LoRA adapters served beside --model, as vLLM's flag: name=path items (comma-separated or the flag repeated) or a JSON object {\"name\",\"path\",\"base_model_name\"}; requests naming an adapter are cached in its own namespace and their KV events carry lora_id and lora_name")
	fs.IntVar(&cfg.defaultMaxTokens, "default-max-tokens", 16, "completion length when a request sets neither max_tokens nor max_completion_tokens")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", 8<<20, "largest accepted request body in `bytes`")
	fs.DurationVar(&cfg.httpIdle, "http-idle-timeout", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection is kept (request headers must arrive within 10s, bodies within 30s)")
	p.Group("Engine model")
	fs.StringVar(&cfg.profile, "profile", costmodel.DefaultProfileName, "timing profile: a built-in `name` ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON profile file path")
	fs.IntVar(&cfg.blockSize, "block-size", simengine.DefaultBlockSize, "tokens per KV block")
	fs.IntVar(&cfg.kvBlocks, "kv-blocks", 32768, "KV-cache capacity in `blocks`")
	fs.IntVar(&cfg.maxBatchedTokens, "max-batched-tokens", simengine.DefaultMaxBatchedTokens, "token budget per engine step (vLLM max_num_batched_tokens)")
	fs.IntVar(&cfg.maxRunning, "max-running", simengine.DefaultMaxRunning, "most running requests (vLLM max_num_seqs)")
	fs.IntVar(&cfg.maxModelLen, "max-model-len", 131072, "longest prompt + completion in `tokens` (capped at the KV capacity)")
	fs.Float64Var(&cfg.timeScale, "time-scale", 1, "wall time per modelled time: 1 real time, 0.1 ten times faster, 0 never sleeps")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seeds block hashes and generated tokens")
	p.Group("KV events")
	fs.StringVar(&cfg.eventsEndpoint, "kv-events-endpoint", "", "ZMQ PUB `endpoint` for KV events, e.g. tcp://127.0.0.1:5557 (binds if it contains * or ::, else connects, as vLLM; see --kv-events-bind); empty disables events")
	fs.BoolVar(&cfg.eventsBind, "kv-events-bind", false, "bind --kv-events-endpoint even without * or :: (e.g. tcp://127.0.0.1:5557: the events, which carry the prompts' token ids, stay on loopback and the agent connects)")
	fs.StringVar(&cfg.replayEndpoint, "kv-events-replay-endpoint", "", "ZMQ ROUTER `endpoint` for replay requests, always bound, e.g. tcp://127.0.0.1:5558; empty disables replay")
	fs.StringVar(&cfg.topic, "kv-events-topic", "", "topic frame of every event message")
	fs.Int64Var(&cfg.maxMsgBytes, "kv-events-max-message-bytes", kvevents.DefaultMaxMessageBytes, "largest inbound ZMQ message (subscriptions, replay requests) in `bytes`; a peer declaring a larger one is disconnected and counted")
	fs.StringVar(&cfg.eventsForm, "kv-events-form", "array", "event encoding: array (vLLM <= v0.25) or map (v0.26+)")
	fs.StringVar(&cfg.replayLayout, "replay-layout", "old", "replay reply framing: old (vLLM <= v0.25) or new (v0.26+)")
	fs.IntVar(&cfg.replayBufferSteps, "replay-buffer-steps", 10000, "event batches kept for replay")
	fs.BoolVar(&cfg.kvEventsPull, "kv-events-pull", false, "serve KV events as trtllm-serve does: JSON drained from POST /kv_cache_events, event_id from 0; --block-size 32 (TensorRT-LLM's tokens_per_block) unless given")
	fs.IntVar(&cfg.trtQueueSize, "kv-events-queue-size", 10000, "with --kv-events-pull: events kept until read (TensorRT-LLM event_buffer_max_size); beyond it the oldest are dropped")
	fs.IntVar(&cfg.dpRank, "data-parallel-rank", 0, "data-parallel rank: offsets the event ports as vLLM does, written into every batch and used as the metrics' engine label")
	fs.IntVar(&cfg.dpSize, "data-parallel-size", 1, "data-parallel ranks behind this one server, as vLLM's --data-parallel-size: each rank has its own cache, events on the ports + rank and metrics (engine label); a request goes to the rank its X-data-parallel-rank header names, else to the least loaded")
	fs.StringVar(&cfg.kvCacheGroups, "kv-cache-groups", "", "KV-cache groups the events report, in group_idx order: `SPEC` kinds full_attention, mla_attention, sink_full_attention, sliding_window:WINDOW, sliding_window_mla:WINDOW, mamba, comma-separated (e.g. sliding_window:1024,full_attention or mamba,full_attention); empty: one group without group_idx (vllm dialect only)")
	fs.StringVar(&cfg.kvReportMode, "kv-report-mode", "incremental", "vLLM's kv_cache_report_mode for every request: incremental, or full (a request's prefix-cache hits are announced again as BlockStored, identical to the first store, with no removal; vllm dialect only)")
	fs.StringVar(&cfg.eventsDialect, "kv-events-dialect", "vllm", "event encoding of `ENGINE`: vllm, or sglang (one page per BlockStored, no lora_name, cache_salt in BlockStoredWithMetadata with --kv-events-form array, top-level with map), or trtllm (TensorRT-LLM's ZMQ publisher: tagged maps, no lora_name, locality, mm_keys)")
	fs.BoolVar(&cfg.speculativeBigrams, "speculative-bigrams", false, "token_ids as SGLang's EAGLE/NEXTN/MTP bigram pairs [[t0,t1],[t1,t2],...] (sglang dialect only)")
	declareMediaFlags(fs, &cfg.media)
	p.Group("Metrics")
	fs.StringVar(&cfg.metricsFormat, "metrics-format", "vllm", "/metrics names of `ENGINE`: vllm (vllm:*), sglang (sglang:*) or trtllm (trtllm-serve's JSON iteration stats, drained on read)")
	return p
}

// check refuses settings the engine cannot run with, and caps
// --max-model-len at the KV capacity.
func (c *config) check() error {
	if c.model == "" {
		return errors.New("--model must not be empty")
	}
	if c.defaultMaxTokens < 1 {
		return fmt.Errorf("--default-max-tokens %d, want >= 1", c.defaultMaxTokens)
	}
	if c.maxMsgBytes < 1 {
		return fmt.Errorf("--kv-events-max-message-bytes %d: want at least 1", c.maxMsgBytes)
	}
	if c.maxBodyBytes < 1 {
		return fmt.Errorf("--max-body-bytes %d, want >= 1", c.maxBodyBytes)
	}
	if c.dpRank < 0 {
		return fmt.Errorf("--data-parallel-rank %d, want >= 0", c.dpRank)
	}
	if c.dpSize < 1 || c.dpSize > maxDataParallelSize {
		return fmt.Errorf("--data-parallel-size %d, want 1 to %d", c.dpSize, maxDataParallelSize)
	}
	if c.dpSize > 1 && c.dpRank != 0 {
		return fmt.Errorf("--data-parallel-rank %d with --data-parallel-size %d: the server runs ranks 0 to %d itself; give one or the other", c.dpRank, c.dpSize, c.dpSize-1)
	}
	if c.blockSize < 1 || c.kvBlocks < 1 || c.maxBatchedTokens < 1 || c.maxRunning < 1 {
		return errors.New("--block-size, --kv-blocks, --max-batched-tokens and --max-running must be positive")
	}
	if math.IsNaN(c.timeScale) || c.timeScale < 0 {
		return fmt.Errorf("--time-scale %v, want >= 0", c.timeScale)
	}
	if capTokens := c.kvBlocks * c.blockSize; c.maxModelLen < 1 || c.maxModelLen > capTokens {
		if c.maxModelLen < 1 {
			return fmt.Errorf("--max-model-len %d, want >= 1", c.maxModelLen)
		}
		c.maxModelLen = capTokens
	}
	if c.eventsBind && c.eventsEndpoint == "" {
		return errors.New("--kv-events-bind needs --kv-events-endpoint")
	}
	if err := c.checkLoRA(); err != nil {
		return err
	}
	if c.eventsForm != "array" && c.eventsForm != "map" {
		return fmt.Errorf("--kv-events-form %q, want array or map", c.eventsForm)
	}
	if c.replayLayout != "old" && c.replayLayout != "new" {
		return fmt.Errorf("--replay-layout %q, want old or new", c.replayLayout)
	}
	if c.metricsFormat != "vllm" && c.metricsFormat != "sglang" && c.metricsFormat != metricsTRTLLM {
		return fmt.Errorf("--metrics-format %q, want vllm, sglang or trtllm", c.metricsFormat)
	}
	if c.dpSize > 1 && c.metricsFormat != "vllm" {
		// SGLang's tokenizer series carry no rank: one server's ranks
		// would export the same series.
		return fmt.Errorf("--data-parallel-size %d needs --metrics-format vllm (per-rank series with the engine label)", c.dpSize)
	}
	if err := c.checkShape(); err != nil {
		return err
	}
	if err := c.checkMedia(); err != nil {
		return err
	}
	return c.checkPull()
}

// checkShape parses --kv-cache-groups, --kv-events-dialect,
// --speculative-bigrams and --kv-report-mode into c.shape.
func (c *config) checkShape() error {
	groups, err := simengine.ParseKVGroups(c.kvCacheGroups)
	if err != nil {
		return fmt.Errorf("--kv-cache-groups: %w", err)
	}
	dialect, err := simengine.ParseDialect(c.eventsDialect)
	if err != nil {
		return fmt.Errorf("--kv-events-dialect: %w", err)
	}
	mode, err := simengine.ParseReportMode(c.kvReportMode)
	if err != nil {
		return fmt.Errorf("--kv-report-mode: %w", err)
	}
	if mode == simengine.ReportFull && c.kvEventsPull {
		return errors.New("--kv-report-mode full is vLLM's; --kv-events-pull writes TensorRT-LLM's events")
	}
	c.shape = simengine.Shape{Groups: groups, Dialect: dialect, Bigrams: c.speculativeBigrams, ReportMode: mode,
		RemoteEvery: c.media.remoteEvery, MMEvery: c.media.mmEvery}
	if err := c.shape.Validate(); err != nil {
		return fmt.Errorf("--kv-cache-groups, --kv-events-dialect, --speculative-bigrams, --kv-report-mode, --trtllm-remote-every, --trtllm-mm-tokens: %w", err)
	}
	medium, blocks := c.media.offloadConfig()
	probe := simengine.Config{BlockSize: c.blockSize, Shape: c.shape, OffloadMedium: medium, OffloadBlocks: blocks}
	if err := probe.CheckOffload(); err != nil {
		return fmt.Errorf("--kv-offload-medium, --kv-offload-blocks: %w", err)
	}
	return nil
}

// parseConfig parses args, then sets from the environment what they did
// not set, and checks the result; its errors are usage errors (or
// cli.ErrHelp, cli.ErrVersion).
func parseConfig(args []string, getenv func(string) string, out io.Writer) (config, error) {
	cfg, _, err := parse(args, getenv, out, out)
	return cfg, err
}

func parse(args []string, getenv func(string) string, stdout, stderr io.Writer) (config, *cli.Program, error) {
	var cfg config
	p := newProgram(&cfg, getenv, stdout, stderr)
	if err := p.Parse(args); err != nil {
		return cfg, p, err
	}
	if cfg.kvEventsPull && p.Source("block-size") == cli.FromDefault {
		cfg.blockSize = trtBlockSize
	}
	if err := cfg.check(); err != nil {
		return cfg, p, cli.Usage(err)
	}
	if _, err := loadProfile(cfg.profile); err != nil {
		return cfg, p, cli.Usage(err)
	}
	return cfg, p, nil
}

func main() {
	ctx, stop := cli.SignalContext(context.Background(), "enginesim", os.Stderr)
	code := runMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain runs the command and returns its exit status.
func runMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, p, err := parse(args, getenv, stdout, stderr)
	if err != nil {
		return p.Exit(err)
	}
	return p.Exit(start(ctx, cfg, p.Logger(), nil))
}

// run parses args, serves until ctx is done and shuts down; help goes
// nowhere. ready, if not nil, is called with the running server once it
// listens.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(*server)) error {
	cfg, p, err := parse(args, getenv, io.Discard, stderr)
	if err != nil {
		return err
	}
	return start(ctx, cfg, p.Logger(), ready)
}

func start(ctx context.Context, cfg config, logger *slog.Logger, ready func(*server)) error {
	s, err := newServer(ctx, cfg, logger)
	if err != nil {
		return err
	}
	return s.serve(ctx, ready)
}
