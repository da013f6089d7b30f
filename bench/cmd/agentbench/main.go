// Command agentbench measures kvdir's engine side: how fast the agent's hot
// path decodes, re-hashes and maps engine KV events on one goroutine; the
// lag from an engine finishing a prefill to the prompt's blocks being
// visible in a directory Match (real directory cluster, enginesim and agent
// processes on loopback); and the engine model's own scheduling overhead at
// time scale 0. It writes the figures as JSON.
//
//	go run ./bench/cmd/agentbench -out bench/results/agent.json
//
// With -list it instead prints a running directory's workers and a Match for
// a chat prompt:
//
//	go run ./bench/cmd/agentbench -list -directory 127.0.0.1:7011 -model llama3-8b -prompt 'What does a prefix cache save?'
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
)

func main() {
	var (
		out        = flag.String("out", "bench/results/agent.json", "where to write the JSON figures (- for stdout)")
		decodeFor  = flag.Duration("decode-for", 3*time.Second, "how long the decode+hash+map loop runs")
		e2eReqs    = flag.Int("requests", 300, "chat requests timed end to end")
		e2eConc    = flag.Int("concurrency", 4, "chat requests in flight during the end-to-end phase")
		timeScale  = flag.Float64("time-scale", 1, "enginesim --time-scale during the end-to-end phase")
		engineReqs = flag.Int("engine-requests", 20000, "requests run through the engine model at time scale 0")
		skipE2E    = flag.Bool("skip-e2e", false, "skip the end-to-end phase (no processes started)")
		workDir    = flag.String("dir", "", "directory for binaries and data (default: a temporary one, removed after)")
		list       = flag.Bool("list", false, "print ListWorkers and a Match for -prompt from -directory, then exit")
		directory  = flag.String("directory", "127.0.0.1:7011", "with -list: a directory node's gRPC address")
		model      = flag.String("model", "llama3-8b", "with -list: the served model (namespace)")
		system     = flag.String("system", "", "with -list: optional system message")
		prompt     = flag.String("prompt", "What does a prefix cache save?", "with -list: the user message")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *list {
		if err := listMode(os.Stdout, *directory, *model, *system, *prompt); err != nil {
			log.Error("list failed", "err", err)
			os.Exit(1)
		}
		return
	}
	res, err := run(log, config{decodeFor: *decodeFor, requests: *e2eReqs, concurrency: *e2eConc,
		timeScale: *timeScale, engineRequests: *engineReqs, skipE2E: *skipE2E, dir: *workDir})
	if err != nil {
		log.Error("agentbench failed", "err", err)
		os.Exit(1)
	}
	if err := benchjson.Write(*out, res); err != nil {
		log.Error("write results", "err", err)
		os.Exit(1)
	}
	if *out != "-" {
		log.Info("wrote results", "file", *out)
	}
}

type config struct {
	decodeFor      time.Duration
	requests       int
	concurrency    int
	timeScale      float64
	engineRequests int
	skipE2E        bool
	dir            string
}

// Results is the JSON written to bench/results/agent.json.
type Results struct {
	Machine benchjson.Machine `json:"machine"`

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

	Targets map[string]string `json:"targets"`
}

func run(log *slog.Logger, cfg config) (*Results, error) {
	res := &Results{Machine: benchjson.ThisMachine(), Targets: map[string]string{
		"decode_hash_blocks_per_sec": ">= 1000000", "end_to_end_event_lag_p99_ms": "<= 100",
	}}
	if err := benchDecode(log, cfg.decodeFor, res); err != nil {
		return nil, fmt.Errorf("decode benchmark: %w", err)
	}
	if err := benchEngine(log, cfg.engineRequests, res); err != nil {
		return nil, fmt.Errorf("engine benchmark: %w", err)
	}
	if cfg.skipE2E {
		return res, nil
	}
	dir := cfg.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvdir-agentbench-")
		if err != nil {
			return nil, fmt.Errorf("temp dir: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	if err := benchE2E(log, cfg, dir, res); err != nil {
		return nil, fmt.Errorf("end-to-end benchmark: %w", err)
	}
	return res, nil
}
