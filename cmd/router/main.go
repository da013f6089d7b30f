// Command router is kvdir's OpenAI-compatible router: it places each request
// on the engine replica that already holds the longest part of its prompt in
// its KV cache, unless that replica is so busy that recomputing elsewhere is
// faster (see internal/router and internal/placement).
//
// Every flag can also be set by an environment variable KVDIR_ROUTER_<FLAG>,
// the flag name upper-cased with dashes as underscores (a flag given on the
// command line wins; see internal/cli). The defaults and checks of the
// router's settings are internal/router's (router.DefaultConfig,
// router.Config.Validate). SIGTERM or SIGINT stops accepting requests, lets
// those in flight finish (up to --shutdown-timeout) and exits 0; a second
// signal exits 130 at once. A usage error exits 2, a failure 1.
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
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvdir/kvdir/internal/admission"
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/enginemetrics"
	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/tokenize"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background(), "router", os.Stderr)
	code := runMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed flags: the router's config (without the parts
// run builds: policies, renderer, directory client) and what only the
// command knows.
type options struct {
	cfg                                            router.Config
	addr, workers, policy, fallback                string
	mode, eppAddr, eppCert, eppKey                 string
	profile, tokenizer, tokenizeURL, tokenizeModel string
	token, explainTokenFile                        string
	tokenFile, tlsCA, tlsServer                    string
	dirTLS                                         *tls.Config
	followLog, calibrate                           bool
	directory                                      []string
	groups                                         []cli.NamedList // --directory-group, in order
	hashBalance, seed                              int
	chunkTokens                                    int
	sessionCacheSessions, sessionCacheBytes        int
	shutdownTimeout                                time.Duration
	log                                            *slog.Logger
}

const summary = `router is kvdir's OpenAI-compatible router.

Put it in front of vLLM, SGLang or enginesim replicas instead of a plain load
balancer: it tokenizes and hashes each prompt, asks the kvdir directory which
replica holds the longest prefix of it, weighs that against each replica's
load, and proxies the request there (streaming passes through as it arrives).

Workers are discovered from the directory (the agents register them) or
given as a static list.

With --mode epp it is instead the endpoint picker of a Gateway API
Inference Extension gateway: Envoy's ext_proc filter streams each request
to it over gRPC (--epp-addr), and it answers with the host:port of the
worker to send it to, placed exactly as the proxy places it.`

const examples = `  # Discover the workers from a three-node directory:
  router --directory 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003

  # Two directory groups, each serving its own models (their nodes' --models):
  router --directory-group chat=10.0.1.1:7001,10.0.1.2:7001,10.0.1.3:7001 \
         --directory-group code=10.0.2.1:7001,10.0.2.2:7001,10.0.2.3:7001

  # Two static workers, placed by session hash:
  router --workers a=http://127.0.0.1:8001,b=http://127.0.0.1:8002 --policy session-hash

  # Endpoint picker for an Envoy gateway (ext_proc on :9002, metrics on :9090):
  router --mode epp --directory dir:7001 --epp-addr 0.0.0.0:9002 --addr 0.0.0.0:9090

  # From the environment, with vLLM's own tokenizer:
  KVDIR_ROUTER_DIRECTORY=dir:7001 KVDIR_ROUTER_TOKENIZER=remote \
  KVDIR_ROUTER_TOKENIZE_URL=http://vllm:8000/tokenize router --addr 0.0.0.0:8080`

const notes = `SIGTERM or SIGINT stops accepting requests and lets those in flight finish
(up to --shutdown-timeout); a second signal, a second or more later, exits
130 at once. Exit status: 0 after a clean stop, 1 on an error, 2 on a usage
error.`

// Modes of --mode.
const (
	modeProxy = "proxy"
	modeEPP   = "epp"
)

// newProgram declares the flags, with the router library's defaults.
func newProgram(getenv func(string) string, stdout, stderr io.Writer) (*cli.Program, *options) {
	p := &cli.Program{Name: "router", Env: "ROUTER", Summary: summary, Examples: examples, Notes: notes,
		Usage: "router (--directory HOST:PORT,... | --directory-group NAME=HOST:PORT,... ... | --workers ID=URL,...) [--mode proxy|epp] [flags]", Getenv: getenv, Stdout: stdout, Stderr: stderr}
	o := &options{cfg: router.DefaultConfig(), addr: "127.0.0.1:8080", policy: "kvdir", fallback: "session-hash", profile: costmodel.DefaultProfileName, calibrate: true,
		mode: modeProxy, eppAddr: "127.0.0.1:9002", hashBalance: 150, tokenizer: "chatml-cl100k", sessionCacheSessions: 100000, sessionCacheBytes: 256 << 20, shutdownTimeout: 30 * time.Second}
	c := &o.cfg
	fs := p.Flags()
	p.Group("Serving and workers")
	fs.StringVar(&o.mode, "mode", o.mode, "proxy: serve the OpenAI API on --addr and proxy each request to its worker; epp: be a Gateway API Inference Extension endpoint picker, serving Envoy's ext_proc gRPC service on --epp-addr that answers each request with its worker's host:port (x-gateway-destination-endpoint), for the gateway to send it (needs --directory: the candidates are its registered workers)")
	fs.StringVar(&o.addr, "addr", o.addr, "HTTP `HOST:PORT` to serve the OpenAI API (proxy mode only), /metrics, /healthz and /readyz on")
	fs.StringVar(&o.eppAddr, "epp-addr", o.eppAddr, "with --mode epp: gRPC `HOST:PORT` to serve the ext_proc service (envoy.service.ext_proc.v3.ExternalProcessor) and the gRPC health service (liveness, readiness) on")
	fs.StringVar(&o.eppCert, "epp-tls-cert", o.eppCert, "with --mode epp: PEM certificate `FILE` to serve --epp-addr over TLS (with --epp-tls-key); plaintext without")
	fs.StringVar(&o.eppKey, "epp-tls-key", o.eppKey, "with --mode epp: PEM private key `FILE` of --epp-tls-cert")
	fs.Var(cli.StringList(&o.directory), "directory", "comma-separated gRPC addresses (`HOST:PORT,...`) of directory nodes")
	fs.Var(cli.NamedLists(&o.groups), "directory-group", "one directory group of several side by side, each serving some models (its nodes' --models): `NAME=HOST:PORT[,HOST:PORT...]`; repeat the flag for each group (in the environment, separate groups with ';'). Workers are discovered from every group and a request goes to the workers of its model's group only, matched and recorded there; a model two groups claim is routed with the first given. Instead of --directory (which is one group, named default)")
	fs.StringVar(&o.workers, "workers", o.workers, "static workers instead of discovery: `id=url[@model][#rank],...` (model learned from the engine's metrics if omitted; #rank: one data-parallel rank of the engine at url, its load read from that rank's series and its requests sent with "+router.HeaderDataParallelRank+"); with --directory, prefixes are still matched there")
	fs.Var(cli.StringMap(&c.WorkerSelector), "worker-selector", "only the directory's workers whose registered labels (the agent's --labels) hold every `KEY=VALUE,...` pair are candidates, the others as if not registered; in EPP mode, the InferencePool's pods when other pods on the directory serve the same model (default: every registered worker)")
	fs.StringVar(&c.EngineKind, "engine-kind", "auto", "shape of the engines' /metrics: "+enginemetrics.KindNames+" (auto: detected from each scrape)")
	fs.StringVar(&o.token, "token", o.token, "bearer `TOKEN` for the directory (prefer --token-file or "+p.EnvVar("token")+": flags show in ps)")
	fs.StringVar(&o.tokenFile, "token-file", o.tokenFile, "`FILE` holding the bearer token for the directory (surrounding white space ignored)")
	fs.StringVar(&o.tlsCA, "tls-ca", o.tlsCA, "PEM `FILE` of the CA that signed the directory's certificates: dial the directory over TLS")
	fs.StringVar(&o.tlsServer, "tls-server-name", o.tlsServer, "`NAME` to verify the directory's certificates against (default: the host of each address)")
	fs.DurationVar(&o.cfg.LocalStaleAfter, "follow-stale-after", router.DefaultLocalStaleAfter, "with --follow-log: matches from a replica not heard from the directory for this `DURATION` are marked stale (explain, metrics)")
	fs.DurationVar(&o.cfg.LocalMaxStale, "follow-max-stale", router.DefaultLocalMaxStale, "with --follow-log: past this `DURATION` without the directory the replica stops answering and the directory (or the fallback policy) does; also the longest /readyz waits at start for the replica's first sync")
	fs.BoolVar(&o.followLog, "follow-log", false, "keep a local replica of the directory, fed by a node's stream of the committed log, and answer prefix matches from it while it is in sync (the directory answers them otherwise); /readyz waits for its first sync")
	fs.BoolVar(&c.ShareIntents, "share-intents", c.ShareIntents, "with --directory: publish each placement to the directory as it happens and count the other routers' placements as this router's own (speculative entries, queued prefill, requests in flight); false places with this router's own accounting only")
	fs.StringVar(&c.RouterID, "router-id", c.RouterID, "`ID` naming this router to the directory and the other routers, unique among them (default: host name and process id)")
	fs.StringVar(&c.SessionHeader, "session-header", c.SessionHeader, "request header that carries the session id (optional in requests)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest request body accepted, in bytes (413 beyond it); 8 MiB holds a prompt far longer than any engine's context (128k tokens of text are under 1 MiB) and bounds what one request makes the router hold and tokenize")
	fs.IntVar(&c.MaxPromptBytes, "max-prompt-bytes", c.MaxPromptBytes, "most prompt text, in bytes, a request may ask the router to tokenize (400 beyond it): 2 MiB is over 400k tokens of English, and tokenizing the slowest 2 MiB (runs of spaces) takes 1 to 3 s of CPU")
	fs.IntVar(&c.MaxPromptTokens, "max-prompt-tokens", c.MaxPromptTokens, "most token ids a prompt may have, given or rendered (400 beyond it)")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", c.BodyTimeout, "longest `DURATION` to receive a request body once its headers are in; a client that stalls or trickles gets 408 and its connection is closed (negative: no limit)")
	fs.StringVar(&c.Explain, "explain", c.Explain, "who may see the router's prediction of a prompt's cached tokens (POST "+router.PathExplain+" and the "+router.HeaderPredicted+" header), which tells whether another client recently sent the same prefix: open (everyone), token (requests with the --explain-token in "+router.HeaderExplainToken+") or off; default token with an --explain-token, else off")
	fs.StringVar(&c.ExplainToken, "explain-token", c.ExplainToken, "operator `TOKEN` for --explain token (prefer "+p.EnvVar("explain-token")+" or --explain-token-file: flags show in ps)")
	fs.StringVar(&o.explainTokenFile, "explain-token-file", o.explainTokenFile, "`FILE` holding the --explain-token (surrounding white space ignored)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", o.shutdownTimeout, "on SIGTERM, how long requests in flight may take to finish")
	p.Group("Placement")
	fs.StringVar(&o.policy, "policy", o.policy, "placement policy: "+strings.Join(placement.Names(), ", "))
	fs.StringVar(&o.fallback, "fallback-policy", o.fallback, "policy used when the directory cannot answer in time")
	fs.StringVar(&o.profile, "profile", o.profile, "kvdir cost model timing profile: a built-in `name` ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON file")
	fs.BoolVar(&o.calibrate, "calibrate", o.calibrate, "fit the kvdir cost model online to the engines' measured prefills, with --profile as the prior: streamed responses with usage (cached tokens) placed on a worker with nothing queued; the fit is exported as kvdir_router_model_* metrics and shown by "+router.PathExplain)
	fs.IntVar(&o.hashBalance, "hash-balance-factor", o.hashBalance, "session-hash load bound, percent of the mean load (HAProxy's hash-balance-factor; 0 disables)")
	fs.DurationVar(&c.MatchTimeout, "match-timeout", c.MatchTimeout, "directory look-up deadline; past it the fallback policy places the request")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", c.ScrapeInterval, "how often each engine's /metrics is read for its load")
	fs.DurationVar(&c.ModelsInterval, "models-interval", c.ModelsInterval, "how often each engine's /v1/models is read to learn the LoRA adapters it serves (a failed read keeps the last list; negative disables adapter routing)")
	fs.DurationVar(&c.SpecTTL, "speculative-ttl", c.SpecTTL, "how long a placed prompt counts as cached on its worker after its first response byte (it counts from placement on; negative disables)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "workers tried for a request whose worker fails before the first response byte")
	fs.DurationVar(&c.DownFor, "down-for", c.DownFor, "how long a worker that refused a connection is avoided")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "KV block size assumed for workers whose block size is neither learned from their events (through the directory) nor registered")
	fs.IntVar(&o.seed, "seed", o.seed, "seed of the policies' random choices (0: from the clock)")
	p.Group("Late binding (admission queue)")
	fs.IntVar(&c.AdmissionQueue, "admission-queue", c.AdmissionQueue, "most requests held at the router while every worker is past its knee (its queued prefill exceeds two engine steps of --chunk-tokens), to be placed on fresh loads as soon as one drops below it; more are refused with 429 and Retry-After. 0 places every request at once (no late binding)")
	fs.DurationVar(&c.AdmissionMaxWait, "admission-max-wait", c.AdmissionMaxWait, "longest `DURATION` a request is held; then it is refused with 503 and Retry-After (the queue's drain estimate)")
	fs.IntVar(&o.chunkTokens, "chunk-tokens", 2048, "the engines' prefill token budget per step (vLLM --max-num-batched-tokens): kvdir's decode-interference term and the knee of late binding")
	p.Group("Tokenization")
	fs.StringVar(&o.tokenizer, "tokenizer", o.tokenizer, "prompt rendering: chatml-cl100k (built in, as enginesim) or remote (POST to --tokenize-url)")
	fs.StringVar(&o.tokenizeURL, "tokenize-url", o.tokenizeURL, "engine /tokenize `URL` for --tokenizer remote, e.g. http://vllm:8000/tokenize")
	fs.StringVar(&o.tokenizeModel, "tokenize-model", o.tokenizeModel, "model `name` sent to --tokenize-url")
	fs.IntVar(&o.sessionCacheSessions, "session-cache-sessions", o.sessionCacheSessions, "sessions whose rendered tokens are kept for incremental tokenization")
	fs.IntVar(&o.sessionCacheBytes, "session-cache-bytes", o.sessionCacheBytes, "bytes the session cache may keep over all sessions: 4 per token id plus the messages' text, which is charged too because text that tokenizes poorly (runs of spaces) is a hundred times its ids")
	return p, o
}

// parseFlags parses the command line and the environment; its errors are
// usage errors (or cli.ErrHelp, cli.ErrVersion).
func parseFlags(args []string, getenv func(string) string, stdout, stderr io.Writer) (*cli.Program, *options, error) {
	p, o := newProgram(getenv, stdout, stderr)
	if err := p.Parse(args); err != nil {
		return p, nil, err
	}
	if len(o.directory) > 0 && len(o.groups) > 0 {
		return p, nil, cli.Usagef("give --directory (one directory group) or --directory-group (one or more, named), not both")
	}
	if len(o.cfg.WorkerSelector) > 0 && o.workers != "" {
		return p, nil, cli.Usagef("--worker-selector picks among the directory's registered workers; --workers lists them instead")
	}
	if len(o.groups) > 1 && o.workers != "" {
		return p, nil, cli.Usagef("--workers takes one directory at most: give --directory, or a single --directory-group")
	}
	dirs := len(o.directory) > 0 || len(o.groups) > 0
	switch o.mode {
	case modeProxy:
		if !dirs && o.workers == "" {
			return p, nil, cli.Usagef("give --directory (discover workers from the kvdir directory) or --workers (a static list)")
		}
	case modeEPP:
		if !dirs || o.workers != "" {
			return p, nil, cli.Usagef("--mode epp needs --directory and no --workers (or --directory-group instead of --directory): its candidates are the directory's registered workers, matched to the gateway's pod endpoints by their registered address")
		}
		if (o.eppCert == "") != (o.eppKey == "") {
			return p, nil, cli.Usagef("give both --epp-tls-cert and --epp-tls-key, or neither")
		}
	default:
		return p, nil, cli.Usagef("--mode %q: want proxy or epp", o.mode)
	}
	o.log = p.Logger()
	for _, w := range p.Warnings() {
		o.log.Warn(w)
	}
	o.cfg.Logger = o.log
	return p, o, nil
}

// parseWorkers parses --workers.
func parseWorkers(s string) ([]router.StaticWorker, error) {
	var out []router.StaticWorker
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, rest, ok := strings.Cut(item, "=")
		if !ok || id == "" || rest == "" {
			return nil, fmt.Errorf("--workers: %q: want id=url[@model][#rank]", item)
		}
		if seen[id] {
			return nil, fmt.Errorf("--workers: worker id %q given twice", id)
		}
		seen[id] = true
		w := router.StaticWorker{ID: id, Address: rest}
		if i := strings.LastIndex(rest, "#"); i >= 0 {
			n, err := strconv.Atoi(rest[i+1:])
			if err != nil || n < 0 || rest[i+1:] != strconv.Itoa(n) {
				return nil, fmt.Errorf("--workers: %q: data-parallel rank %q after # is not a non-negative integer", item, rest[i+1:])
			}
			rest, w.Address, w.Rank, w.HasRank = rest[:i], rest[:i], n, true
		}
		if i := strings.LastIndex(rest, "@"); i > strings.Index(rest, "://")+2 {
			w.Address, w.Model = rest[:i], rest[i+1:]
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, errors.New("--workers: no worker given")
	}
	return out, nil
}

// runMain runs the command and returns its exit status.
func runMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	p, o, err := parseFlags(args, getenv, stdout, stderr)
	if err != nil {
		return p.Exit(err)
	}
	return p.Exit(serve(ctx, o, nil))
}

// run runs the router until ctx ends; help goes nowhere. ready, if not
// nil, receives the listening address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	_, o, err := parseFlags(args, getenv, io.Discard, stderr)
	if err != nil {
		return err
	}
	return serve(ctx, o, ready)
}

// configure builds the router's config: policies, renderer and workers
// from the flags. Its errors are usage errors.
func configure(o *options) (router.Config, error) {
	cfg := o.cfg
	prof, err := costmodel.ResolveProfile(o.profile)
	if err != nil {
		return cfg, cli.Usagef("--profile: %w", err)
	}
	seed := int64(o.seed)
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	hbf := o.hashBalance
	if hbf == 0 {
		hbf = -1
	}
	if o.chunkTokens < 1 {
		return cfg, cli.Usagef("--chunk-tokens %d, want >= 1", o.chunkTokens)
	}
	popts := placement.Options{Seed: seed, Profile: prof, HashBalanceFactor: hbf, ChunkTokens: o.chunkTokens}
	cfg.AdmissionKnee = admission.NewKnee(prof, o.chunkTokens)
	if o.calibrate {
		cal, err := costmodel.NewCalibrator(prof, costmodel.CalibratorConfig{})
		if err != nil {
			return cfg, cli.Usagef("--profile: %w", err)
		}
		cfg.Calibrator, popts.LiveProfile = cal, cal
	}
	if cfg.Policy, err = placement.New(o.policy, popts); err != nil {
		return cfg, cli.Usagef("--policy: %w", err)
	}
	if cfg.Fallback, err = placement.New(o.fallback, popts); err != nil {
		return cfg, cli.Usagef("--fallback-policy: %w", err)
	}
	switch o.tokenizer {
	case "chatml-cl100k":
		tmpl, err := tokenize.ChatMLCL100K()
		if err != nil {
			return cfg, fmt.Errorf("tokenizer: %w", err)
		}
		if cfg.Renderer, err = router.NewLocalRenderer(tmpl, o.sessionCacheSessions, o.sessionCacheBytes); err != nil {
			return cfg, cli.Usagef("--session-cache-sessions, --session-cache-bytes: %w", err)
		}
	case "remote":
		if o.tokenizeURL == "" {
			return cfg, cli.Usagef("--tokenizer remote needs --tokenize-url")
		}
		cfg.Renderer = router.NewRemoteRenderer(o.tokenizeURL, o.tokenizeModel, 10*time.Second)
	default:
		return cfg, cli.Usagef("--tokenizer %q: want chatml-cl100k or remote", o.tokenizer)
	}
	if o.explainTokenFile != "" {
		if cfg.ExplainToken != "" {
			return cfg, cli.Usagef("give --explain-token or --explain-token-file, not both")
		}
		b, err := os.ReadFile(o.explainTokenFile)
		if err != nil {
			return cfg, cli.Usagef("--explain-token-file: %w", err)
		}
		if cfg.ExplainToken = strings.TrimSpace(string(b)); cfg.ExplainToken == "" {
			return cfg, cli.Usagef("--explain-token-file %s is empty", o.explainTokenFile)
		}
	}
	if o.workers != "" {
		if cfg.Static, err = parseWorkers(o.workers); err != nil {
			return cfg, cli.Usage(err)
		}
	}
	return cfg, nil
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

// followDialOptions dials the --follow-log stream as the directory client does.
func (o *options) followDialOptions() []grpc.DialOption {
	if o.dirTLS == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(o.dirTLS))}
}

// serve runs the router until ctx ends. ready, if not nil, receives the
// listening address.
func serve(ctx context.Context, o *options, ready chan<- string) error {
	log := o.log
	cfg, err := configure(o)
	if err != nil {
		return err
	}
	groups := o.groups
	if len(o.directory) > 0 {
		groups = []cli.NamedList{{Name: router.DefaultGroup, Items: o.directory}}
	}
	if len(groups) > 0 {
		if err := o.directorySecurity(); err != nil {
			return err
		}
	} else if o.followLog {
		return cli.Usagef("--follow-log needs --directory")
	}
	for _, gr := range groups {
		dir, err := dirclient.New(dirclient.Config{Addrs: gr.Items, Token: o.token, TLS: o.dirTLS, Logger: log.With("group", gr.Name)})
		if err != nil {
			return fmt.Errorf("directory client of group %s: %w", gr.Name, err)
		}
		defer dir.Close()
		g := router.DirectoryGroup{Name: gr.Name, Directory: dir}
		if o.followLog {
			fl, err := follow.New(follow.Config{Addrs: gr.Items, Token: o.token, DialOptions: o.followDialOptions(), Logger: log.With("group", gr.Name)})
			if err != nil {
				return fmt.Errorf("--follow-log (group %s): %w", gr.Name, err)
			}
			defer fl.Close()
			fctx, stopFollow := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = fl.Run(fctx) }()
			defer func() { stopFollow(); <-done }()
			g.Local = fl
		}
		if len(o.groups) == 0 { // --directory: the one group, as before
			cfg.Directory, cfg.Local = g.Directory, g.Local
		} else {
			cfg.Groups = append(cfg.Groups, g)
		}
	}
	if err := cfg.Validate(); err != nil {
		return cli.Usage(err)
	}
	srv, err := router.New(cfg)
	if err != nil {
		return err
	}
	pol, fb := cfg.Policy, cfg.Fallback

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on --addr %s: %w", o.addr, err)
	}
	handler := srv.Handler()
	if o.mode == modeEPP {
		handler = srv.AdminHandler()
	}
	// Headers must arrive within 10 s of a request's first byte and a
	// connection waiting for a request (idle, or fresh and not used yet)
	// is closed after 2 min; the body's deadline (--body-timeout) is set by
	// the handler, which clears it once the body is in, so that a long
	// streamed answer is not cut the way an http.Server ReadTimeout would.
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- srv.Run(runCtx) }()
	serveErr := make(chan error, 2)
	var gs *grpc.Server
	if o.mode == modeEPP {
		if gs, err = serveEPP(runCtx, o, srv, serveErr); err != nil {
			_ = ln.Close()
			return err
		}
		defer gs.Stop()
	}
	go func() { serveErr <- httpserve.Serve(hs, ln) }()
	log.Info("router: serving", "mode", o.mode, "addr", ln.Addr().String(), "policy", pol.Name(), "fallback", fb.Name(),
		"directory", strings.Join(o.directory, ","), "directory_groups", o.groupsString(), "static_workers", len(cfg.Static), "worker_selector", cli.StringMap(&cfg.WorkerSelector).String())
	if ready != nil {
		ready <- ln.Addr().String()
	}

	select {
	case <-ctx.Done():
		log.Info("router: shutting down; letting requests in flight finish", "timeout", o.shutdownTimeout)
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case err := <-runErr:
		if err != nil {
			_ = hs.Close()
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if gs != nil {
		// Streams in flight (requests whose responses are still being
		// observed) finish; new ones are refused.
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			gs.Stop()
		}
	}
	err = hs.Shutdown(sctx)
	cancelRun()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// serveEPP serves the endpoint picker (ext_proc and gRPC health) on
// --epp-addr until the returned server stops; a serving error goes to
// errs.
func serveEPP(ctx context.Context, o *options, srv *router.Server, errs chan<- error) (*grpc.Server, error) {
	var opts []grpc.ServerOption
	if o.eppCert != "" {
		creds, err := credentials.NewServerTLSFromFile(o.eppCert, o.eppKey)
		if err != nil {
			return nil, cli.Usagef("--epp-tls-cert, --epp-tls-key: %w", err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	ln, err := net.Listen("tcp", o.eppAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on --epp-addr %s: %w", o.eppAddr, err)
	}
	gs := grpc.NewServer(opts...)
	srv.RegisterEPP(ctx, gs)
	go func() {
		if err := gs.Serve(ln); err != nil {
			errs <- fmt.Errorf("epp: %w", err)
		}
	}()
	o.log.Info("router: endpoint picker serving", "epp_addr", ln.Addr().String(), "tls", o.eppCert != "")
	return gs, nil
}

// groupsString lists --directory-group for the start-up log.
func (o *options) groupsString() string {
	var b strings.Builder
	for i, g := range o.groups {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(g.Name + "=" + strings.Join(g.Items, ","))
	}
	return b.String()
}
