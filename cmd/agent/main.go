// Command agent runs kvdir's engine-side agent beside one engine replica: it
// follows the engine's KV-cache events and keeps the directory's view of the
// worker up to date (see internal/agent).
//
// Every flag can also be set by an environment variable KVDIR_AGENT_<FLAG>,
// the flag name upper-cased with dashes as underscores (a flag given on the
// command line wins; see internal/cli). The defaults and checks of the
// agent's settings are internal/agent's (agent.DefaultConfig,
// agent.Config.Validate). SIGTERM or SIGINT flushes, deregisters and exits
// 0; a second signal exits 130 at once. A usage error exits 2, a failure 1.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background(), "agent", os.Stderr)
	code := runMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// defaultHTTPAddr is where the agent serves /metrics and /healthz.
const defaultHTTPAddr = ":9400"

// options are the parsed flags: the agent's config (one rank's; run
// derives the others) and what only the command knows.
type options struct {
	cfg        agent.Config
	directory  []string
	engineKind string
	reportMode string
	httpAddr   string
	httpIdle   time.Duration
	token      string
	tokenFile  string
	tlsCA      string
	tlsServer  string
	dirTLS     *tls.Config
	dpSize     int
	log        *slog.Logger
}

const summary = `agent runs beside one engine replica (vLLM, SGLang, TensorRT-LLM or
enginesim): it follows the engine's KV-cache events over ZeroMQ (or polls
trtllm-serve's POST /kv_cache_events, --kv-events-pull-url), translates
them into the directory's block hashes, publishes them in batches, registers
the worker and heartbeats its load (read from the engine's /metrics), so that
the kvdir directory always knows which prefixes this replica holds.

It serves its own /metrics and /healthz on --http-addr. An engine with
data-parallel ranks gets one worker per rank (<worker-id>-dp<rank>).`

const examples = `  # Beside a vLLM started with --kv-events-config '{"enable_kv_cache_events": true,
  # "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}'
  # (the events carry prompts' token ids: keep them on loopback): the agent binds 5557,
  # vLLM's PUB connects to it, and the agent connects to vLLM's replay socket:
  agent --directory dir-0:7001,dir-1:7001,dir-2:7001 --worker-id vllm-0 \
    --worker-address http://10.0.0.7:8000 --model llama3-8b --kv-events-bind \
    --kv-events-endpoint tcp://127.0.0.1:5557 --kv-events-replay-endpoint tcp://127.0.0.1:5558

  # The same from the environment, as the Kubernetes manifests do:
  KVDIR_AGENT_DIRECTORY=dir-0:7001 KVDIR_AGENT_WORKER_ID=vllm-0 \
  KVDIR_AGENT_WORKER_ADDRESS=http://10.0.0.7:8000 KVDIR_AGENT_MODEL=llama3-8b agent

  # Beside trtllm-serve (kv_cache_config.event_buffer_max_size > 0), events pulled over HTTP:
  agent --directory dir-0:7001 --worker-id trt-0 --worker-address http://10.0.0.8:8000 \
    --model llama3-8b --kv-events-pull-url http://10.0.0.8:8000/kv_cache_events --block-size 32

  # Beside enginesim, JSON logs:
  agent --directory 127.0.0.1:7001 --worker-id sim-0 --worker-address http://127.0.0.1:8000 \
    --engine-kind enginesim --log-format json`

const notes = `SIGTERM or SIGINT flushes the pending batch, deregisters the worker and
exits 0; a second signal, a second or more later, exits 130 at once.
Exit status: 0 after a clean stop, 1 on an error, 2 on a usage error.`

// newProgram declares the flags, with the agent library's defaults.
func newProgram(getenv func(string) string, stdout, stderr io.Writer) (*cli.Program, *options) {
	p := &cli.Program{Name: "agent", Env: "AGENT", Summary: summary, Examples: examples, Notes: notes,
		Usage: "agent --directory HOST:PORT,... --worker-id ID [flags]", Getenv: getenv, Stdout: stdout, Stderr: stderr}
	o := &options{cfg: agent.DefaultConfig(), httpAddr: defaultHTTPAddr, dpSize: 1}
	o.engineKind = engineKindName(o.cfg.Engine)
	o.reportMode = "incremental"
	c := &o.cfg
	fs := p.Flags()
	p.Group("Directory and worker")
	fs.Var(cli.StringList(&o.directory), "directory", "comma-separated gRPC addresses (`HOST:PORT,...`) of directory nodes (required)")
	fs.StringVar(&c.WorkerID, "worker-id", c.WorkerID, "worker `ID`, unique in the directory (required)")
	fs.StringVar(&c.WorkerAddress, "worker-address", c.WorkerAddress, "the engine's HTTP base `URL`, e.g. http://10.0.0.7:8000")
	fs.StringVar(&c.Model, "model", c.Model, "served model `NAME` (part of the content-hash namespace)")
	fs.Var(cli.StringMap(&c.Labels), "labels", "`KEY=VALUE,...` registered with the worker (zone, GPU type, pool...): kvdirctl shows them, and a router's --worker-selector keeps only the workers whose labels match")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "block size the engine is expected to use (0: not told); routers hash with the sizes learned from the engine's events, and a different one is warned about and counted")
	fs.StringVar(&o.token, "token", "", "agent bearer `TOKEN` for the directory: its agent credential's token (--agent-credentials or --agent-token there), which must allow --worker-id (prefer --token-file or "+p.EnvVar("token")+": flags show in ps)")
	fs.StringVar(&o.tokenFile, "token-file", "", "`FILE` holding the agent bearer token (surrounding white space ignored)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "PEM `FILE` of the CA that signed the directory's certificates: dial the directory over TLS")
	fs.StringVar(&o.tlsServer, "tls-server-name", "", "`NAME` to verify the directory's certificates against (default: the host of each address)")
	p.Group("Engine")
	fs.StringVar(&o.engineKind, "engine-kind", o.engineKind, "engine `KIND`: vllm, sglang, trtllm, enginesim")
	fs.StringVar(&c.Endpoint, "kv-events-endpoint", c.Endpoint, "engine KV-events `ENDPOINT`")
	fs.BoolVar(&c.Bind, "kv-events-bind", c.Bind, "bind the KV-events address (the engine's PUB connects: vLLM and SGLang given tcp://127.0.0.1:PORT); the replay endpoint is always connected to; with --data-parallel-size every rank's port is bound")
	fs.StringVar(&c.ReplayEndpoint, "kv-events-replay-endpoint", c.ReplayEndpoint, "engine replay (ROUTER) `ENDPOINT`; empty disables replay")
	fs.StringVar(&c.Topic, "topic", c.Topic, "KV-events topic prefix")
	fs.Int64Var(&c.MaxMessageBytes, "kv-events-max-message-bytes", kvevents.DefaultMaxMessageBytes, "largest ZMQ message accepted from the engine (live or replayed) in `bytes`; a peer declaring a larger one is disconnected and counted in kvdir_agent_zmtp_oversized_total")
	fs.StringVar(&c.PullURL, "kv-events-pull-url", c.PullURL, "TensorRT-LLM pull `URL` (trtllm-serve's POST /kv_cache_events, e.g. http://engine:8000/kv_cache_events), polled instead of a ZeroMQ endpoint; exclusive with --kv-events-endpoint; sets --engine-kind trtllm and --block-size 32 unless given")
	fs.DurationVar(&c.PullInterval, "kv-events-pull-interval", agent.DefaultPullInterval, "how often --kv-events-pull-url is polled")
	fs.Var(cli.Choice(&o.reportMode, "incremental", "full"), "kv-report-mode", "how the engine reports stores: incremental (vLLM's default) or full (vLLM's kv_cache_report_mode=\"full\", which re-sends the stores of reused prefixes without removals; each held block then counts once)")
	fs.IntVar(&o.dpSize, "data-parallel-size", o.dpSize, "data-parallel ranks of the engine: one event stream (port + rank, as vLLM offsets them) and one worker (<worker-id>-dp<rank>) per rank")
	fs.StringVar(&c.MetricsURL, "metrics-url", c.MetricsURL, "engine metrics `URL` (default worker-address + /metrics): vLLM's or SGLang's Prometheus text or trtllm-serve's JSON iteration stats, as --engine-kind says (detected for vllm and enginesim); with --data-parallel-size each rank reads its own series")
	p.Group("Agent")
	fs.StringVar(&o.httpAddr, "http-addr", o.httpAddr, "`HOST:PORT` of the agent's /metrics and /healthz")
	fs.DurationVar(&o.httpIdle, "http-idle-timeout", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection to --http-addr is kept")
	fs.DurationVar(&c.BatchInterval, "batch-interval", c.BatchInterval, "longest wait before a batch is sent")
	fs.IntVar(&c.BatchBlocks, "batch-blocks", c.BatchBlocks, "blocks that make a batch full")
	fs.IntVar(&c.MapCapacity, "map-capacity", c.MapCapacity, "engine-hash map capacity (about 2x the engine's KV blocks)")
	fs.IntVar(&c.QueueLimit, "queue-limit", c.QueueLimit, "unacknowledged batches buffered before dropping and resynchronising")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", c.HeartbeatInterval, "fixed heartbeat interval (0: a third of the directory's lease)")
	fs.DurationVar(&c.EngineDownAfter, "engine-down-after", c.EngineDownAfter, "how long the engine's metrics URL may go unanswered (refused, timed out, 502-504; from the first failed probe, at least 3 in a row) before the worker is deregistered, until it answers again (0: half the directory's lease)")
	return p, o
}

// parseFlags parses the command line and the environment and checks the
// result; its errors are usage errors (or cli.ErrHelp, cli.ErrVersion).
func parseFlags(args []string, getenv func(string) string, stdout, stderr io.Writer) (*cli.Program, *options, error) {
	p, o := newProgram(getenv, stdout, stderr)
	if err := p.Parse(args); err != nil {
		return p, nil, err
	}
	if len(o.directory) == 0 || o.cfg.WorkerID == "" {
		return p, nil, cli.Usagef("--directory and --worker-id are required")
	}
	if o.dpSize < 1 || o.dpSize > 256 {
		return p, nil, cli.Usagef("--data-parallel-size %d: must be 1 to 256", o.dpSize)
	}
	if err := pullDefaults(p, o); err != nil {
		return p, nil, err
	}
	if err := o.directorySecurity(); err != nil {
		return p, nil, err
	}
	mode, err := agent.ParseReportMode(o.reportMode)
	if err != nil {
		return p, nil, cli.Usage(err)
	}
	o.cfg.ReportMode = mode
	kind, err := engineKind(o.engineKind)
	if err != nil {
		return p, nil, cli.Usage(err)
	}
	o.cfg.Engine = kind
	if o.cfg.MetricsURL == "" && o.cfg.WorkerAddress != "" {
		o.cfg.MetricsURL = strings.TrimRight(o.cfg.WorkerAddress, "/") + "/metrics"
	}
	if err := o.cfg.Validate(); err != nil {
		return p, nil, cli.Usage(err)
	}
	o.log = p.Logger()
	for _, w := range p.Warnings() {
		o.log.Warn(w)
	}
	o.cfg.Logger = o.log
	return p, o, nil
}

// engineKindName is the --engine-kind of k.
func engineKindName(k kvdirv1.EngineKind) string {
	switch k {
	case kvdirv1.EngineKind_ENGINE_KIND_SGLANG:
		return "sglang"
	case kvdirv1.EngineKind_ENGINE_KIND_TRTLLM:
		return "trtllm"
	case kvdirv1.EngineKind_ENGINE_KIND_ENGINESIM:
		return "enginesim"
	case kvdirv1.EngineKind_ENGINE_KIND_UNSPECIFIED:
		return ""
	}
	return "vllm"
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

// runMain runs the command and returns its exit status.
func runMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	p, o, err := parseFlags(args, getenv, stdout, stderr)
	if err != nil {
		return p.Exit(err)
	}
	return p.Exit(serve(ctx, o))
}

// run parses args and runs the agent until ctx ends; help goes nowhere.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	_, o, err := parseFlags(args, getenv, io.Discard, stderr)
	if err != nil {
		return err
	}
	return serve(ctx, o)
}

// directorySecurity reads --token-file and --tls-ca.
func (o *options) directorySecurity() error {
	tok, tc, err := dirclient.Security{Token: o.token, TokenFile: o.tokenFile, CAFile: o.tlsCA, ServerName: o.tlsServer}.Load()
	if err != nil {
		return cli.Usage(err)
	}
	o.token, o.dirTLS = tok, tc
	return nil
}

// serve runs the agents of every rank and the HTTP server until ctx ends.
func serve(ctx context.Context, o *options) error {
	log := o.log
	dir, err := dirclient.New(dirclient.Config{Addrs: o.directory, Token: o.token, TLS: o.dirTLS, Logger: log})
	if err != nil {
		return fmt.Errorf("directory client: %w", err)
	}
	defer dir.Close()
	// One agent per data-parallel rank: rank r's events come from the
	// endpoints offset by r, and it is its own worker.
	var agents []*agent.Agent
	var gatherers prometheus.Gatherers
	for r := range o.dpSize {
		cfg := o.cfg
		if o.dpSize > 1 {
			cfg.WorkerID = fmt.Sprintf("%s-dp%d", o.cfg.WorkerID, r)
			if cfg.Endpoint, err = kvevents.OffsetEndpoint(o.cfg.Endpoint, r); err != nil {
				return fmt.Errorf("--kv-events-endpoint for rank %d: %w", r, err)
			}
			if o.cfg.ReplayEndpoint != "" {
				if cfg.ReplayEndpoint, err = kvevents.OffsetEndpoint(o.cfg.ReplayEndpoint, r); err != nil {
					return fmt.Errorf("--kv-events-replay-endpoint for rank %d: %w", r, err)
				}
			}
			cfg.Logger = log.With("rank", r)
			// The engine's one API server exports every rank's series:
			// this rank's worker reads its own.
			cfg.MetricsRank, cfg.MetricsByRank = r, true
			// Routers pin the worker's requests to its rank.
			rank := uint32(r)
			cfg.DataParallelRank = &rank
		}
		a, err := agent.New(cfg, dir)
		if err != nil {
			return fmt.Errorf("agent for rank %d: %w", r, err)
		}
		agents = append(agents, a)
		gatherers = append(gatherers, a.Gatherer())
	}
	ctx, stop := context.WithCancel(ctx)
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
	srv := httpserve.New(mux, httpserve.Timeouts{Idle: o.httpIdle}, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	go func() {
		if err := httpserve.Serve(srv, lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("agent: http server", "err", err)
		}
	}()
	events := []any{"events", o.cfg.Endpoint}
	if o.cfg.PullURL != "" {
		events = []any{"pull", o.cfg.PullURL}
	}
	log.Info("agent: starting", append(append([]any{"worker", o.cfg.WorkerID, "ranks", o.dpSize}, events...), "http", lis.Addr().String())...)
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
