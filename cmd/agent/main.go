// Command agent runs kvdir's engine-side agent beside one engine replica: it
// follows the engine's KV-cache events and keeps the directory's view of the
// worker up to date (see internal/agent).
//
// Every flag can also be set by an environment variable KVDIR_AGENT_<NAME>,
// the flag name upper-cased with dashes as underscores (a flag given on the
// command line wins). SIGTERM or SIGINT flushes, deregisters and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/envflag"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	directory, workerID, workerAddress, model, engineKind string
	endpoint, replayEndpoint, topic, metricsURL, httpAddr string
	token, logLevel                                       string
	bind                                                  bool
	blockSize, batchBlocks, mapCapacity, queueLimit       int
	dpSize                                                int
	batchInterval, heartbeat                              time.Duration
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.directory, "directory", "", "comma-separated gRPC addresses of directory nodes (required)")
	fs.StringVar(&o.workerID, "worker-id", "", "worker id, unique in the directory (required)")
	fs.StringVar(&o.workerAddress, "worker-address", "", "the engine's HTTP base URL, e.g. http://10.0.0.7:8000")
	fs.StringVar(&o.model, "model", "", "served model name (part of the content-hash namespace)")
	fs.IntVar(&o.blockSize, "block-size", 16, "engine block size, for registration only (events carry their own)")
	fs.StringVar(&o.engineKind, "engine-kind", "vllm", "engine kind: vllm, sglang, trtllm, enginesim")
	fs.StringVar(&o.endpoint, "kv-events-endpoint", "tcp://127.0.0.1:5557", "engine KV-events address")
	fs.BoolVar(&o.bind, "kv-events-bind", false, "bind the KV-events address (the engine's PUB connects)")
	fs.StringVar(&o.replayEndpoint, "kv-events-replay-endpoint", "", "engine replay (ROUTER) address; empty disables replay")
	fs.StringVar(&o.topic, "topic", "", "KV-events topic prefix")
	fs.IntVar(&o.dpSize, "data-parallel-size", 1, "data-parallel ranks of the engine: one event stream (port + rank, as vLLM offsets them) and one worker (<worker-id>-dp<rank>) per rank")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "engine Prometheus URL (default worker-address + /metrics)")
	fs.StringVar(&o.httpAddr, "http-addr", ":9400", "address of the agent's /metrics and /healthz")
	fs.DurationVar(&o.batchInterval, "batch-interval", agent.DefaultBatchInterval, "longest wait before a batch is sent")
	fs.IntVar(&o.batchBlocks, "batch-blocks", agent.DefaultBatchBlocks, "blocks that make a batch full")
	fs.StringVar(&o.token, "token", "", "agent bearer token for the directory")
	fs.IntVar(&o.mapCapacity, "map-capacity", agent.DefaultMapCapacity, "engine-hash map capacity (about 2x the engine's KV blocks)")
	fs.IntVar(&o.queueLimit, "queue-limit", dirclient.DefaultQueueLimit, "unacknowledged batches buffered before dropping and resynchronising")
	fs.DurationVar(&o.heartbeat, "heartbeat-interval", 0, "fixed heartbeat interval (default lease/3)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("parse flags: %w", err)
	}
	if err := envflag.Apply(fs, "KVDIR_AGENT_", getenv); err != nil {
		return nil, err
	}
	if o.directory == "" || o.workerID == "" {
		return nil, errors.New("--directory and --worker-id are required")
	}
	if o.dpSize < 1 || o.dpSize > 256 {
		return nil, fmt.Errorf("--data-parallel-size %d: must be 1 to 256", o.dpSize)
	}
	if o.metricsURL == "" && o.workerAddress != "" {
		o.metricsURL = strings.TrimRight(o.workerAddress, "/") + "/metrics"
	}
	return o, nil
}

func engineKind(s string) (kvdirv1.EngineKind, error) {
	switch strings.ToLower(s) {
	case "vllm":
		return kvdirv1.EngineKind_ENGINE_KIND_VLLM, nil
	case "sglang":
		return kvdirv1.EngineKind_ENGINE_KIND_SGLANG, nil
	case "trtllm", "tensorrt-llm":
		return kvdirv1.EngineKind_ENGINE_KIND_TRTLLM, nil
	case "enginesim", "sim":
		return kvdirv1.EngineKind_ENGINE_KIND_ENGINESIM, nil
	case "":
		return kvdirv1.EngineKind_ENGINE_KIND_UNSPECIFIED, nil
	}
	return 0, fmt.Errorf("unknown --engine-kind %q", s)
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	kind, err := engineKind(o.engineKind)
	if err != nil {
		return err
	}
	dir, err := dirclient.New(dirclient.Config{Addrs: strings.Split(o.directory, ","), Token: o.token, Logger: log})
	if err != nil {
		return fmt.Errorf("directory client: %w", err)
	}
	defer dir.Close()
	// One agent per data-parallel rank: rank r's events come from the
	// endpoints offset by r, and it is its own worker.
	var agents []*agent.Agent
	var gatherers prometheus.Gatherers
	for r := range o.dpSize {
		cfg := agent.Config{
			WorkerID: o.workerID, WorkerAddress: o.workerAddress, Model: o.model, BlockSize: o.blockSize, Engine: kind,
			Endpoint: o.endpoint, Bind: o.bind, ReplayEndpoint: o.replayEndpoint, Topic: o.topic,
			MetricsURL: o.metricsURL, BatchInterval: o.batchInterval, BatchBlocks: o.batchBlocks,
			MapCapacity: o.mapCapacity, QueueLimit: o.queueLimit, HeartbeatInterval: o.heartbeat, Logger: log,
		}
		if o.dpSize > 1 {
			cfg.WorkerID = fmt.Sprintf("%s-dp%d", o.workerID, r)
			if cfg.Endpoint, err = kvevents.OffsetEndpoint(o.endpoint, r); err != nil {
				return fmt.Errorf("--kv-events-endpoint for rank %d: %w", r, err)
			}
			if o.replayEndpoint != "" {
				if cfg.ReplayEndpoint, err = kvevents.OffsetEndpoint(o.replayEndpoint, r); err != nil {
					return fmt.Errorf("--kv-events-replay-endpoint for rank %d: %w", r, err)
				}
			}
			cfg.Logger = log.With("rank", r)
		}
		a, err := agent.New(cfg, dir)
		if err != nil {
			return fmt.Errorf("agent for rank %d: %w", r, err)
		}
		agents = append(agents, a)
		gatherers = append(gatherers, a.Gatherer())
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	lis, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.httpAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		for _, a := range agents {
			if !a.Healthy() {
				http.Error(w, "not healthy", http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("agent: http server", "err", err)
		}
	}()
	log.Info("agent: starting", "worker", o.workerID, "ranks", o.dpSize, "events", o.endpoint, "http", lis.Addr().String())
	errs := make(chan error, len(agents))
	for _, a := range agents {
		go func() { errs <- a.Run(ctx) }()
	}
	var runErr error
	for range agents {
		if err := <-errs; err != nil && runErr == nil {
			runErr = err
			stop() // one rank failing stops the others
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if runErr != nil {
		return fmt.Errorf("run: %w", runErr)
	}
	log.Info("agent: stopped")
	return nil
}
