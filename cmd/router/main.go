// Command router is kvdir's OpenAI-compatible router: it places each request
// on the engine replica that already holds the longest part of its prompt in
// its KV cache, unless that replica is so busy that recomputing elsewhere is
// faster (see internal/router and internal/placement).
//
// Every flag can also be set by an environment variable KVDIR_ROUTER_<NAME>,
// the flag name upper-cased with dashes as underscores (a flag given on the
// command line wins). SIGTERM or SIGINT stops accepting requests, lets those
// in flight finish (up to --shutdown-timeout) and exits 0.
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

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/envflag"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/tokenize"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	addr, directory, workers, policy, fallback, sessionHeader string
	profile, tokenizer, tokenizeURL, tokenizeModel            string
	token, logLevel                                           string
	hashBalance, maxAttempts, blockSize, seed                 int
	sessionCacheSessions, sessionCacheTokens                  int
	maxBody                                                   int64
	matchTimeout, scrapeInterval, specTTL, downFor            time.Duration
	shutdownTimeout                                           time.Duration
}

const usageHead = `router: kvdir's OpenAI-compatible router.

Put it in front of vLLM, SGLang or enginesim replicas instead of a plain load
balancer: it tokenizes and hashes each prompt, asks the kvdir directory which
replica holds the longest prefix of it, weighs that against each replica's
load, and proxies the request there (streaming passes through as it arrives).

Workers are discovered from the directory (the agents register them) or
given as a static list. Examples:

  router --directory 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
  router --workers a=http://127.0.0.1:8001,b=http://127.0.0.1:8002 --policy session-hash

Every flag can also be set as KVDIR_ROUTER_<NAME> (e.g. KVDIR_ROUTER_POLICY=kvdir).

Flags:
`

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	o := &options{}
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "HTTP address to serve the OpenAI API, /metrics, /healthz and /readyz on")
	fs.StringVar(&o.directory, "directory", "", "comma-separated gRPC addresses of directory nodes")
	fs.StringVar(&o.workers, "workers", "", "static workers instead of discovery: `id=url[@model],...` (model learned from the engine's metrics if omitted); with --directory, prefixes are still matched there")
	fs.StringVar(&o.policy, "policy", "kvdir", "placement policy: "+strings.Join(placement.Names(), ", "))
	fs.StringVar(&o.fallback, "fallback-policy", "session-hash", "policy used when the directory cannot answer in time")
	fs.StringVar(&o.sessionHeader, "session-header", router.DefaultSessionHeader, "request header that carries the session id (optional in requests)")
	fs.StringVar(&o.profile, "profile", costmodel.DefaultProfileName, "kvdir cost model timing profile: a built-in `name` ("+strings.Join(costmodel.ProfileNames(), ", ")+") or a JSON file")
	fs.IntVar(&o.hashBalance, "hash-balance-factor", 150, "session-hash load bound, percent of the mean load (HAProxy's hash-balance-factor; 0 disables)")
	fs.StringVar(&o.tokenizer, "tokenizer", "chatml-cl100k", "prompt rendering: chatml-cl100k (built in, as enginesim) or remote (POST to --tokenize-url)")
	fs.StringVar(&o.tokenizeURL, "tokenize-url", "", "engine /tokenize URL for --tokenizer remote, e.g. http://vllm:8000/tokenize")
	fs.StringVar(&o.tokenizeModel, "tokenize-model", "", "model name sent to --tokenize-url")
	fs.IntVar(&o.sessionCacheSessions, "session-cache-sessions", 100000, "sessions whose rendered tokens are kept for incremental tokenization")
	fs.IntVar(&o.sessionCacheTokens, "session-cache-tokens", 64<<20, "tokens kept over all cached sessions (4 bytes each)")
	fs.DurationVar(&o.matchTimeout, "match-timeout", router.DefaultMatchTimeout, "directory look-up deadline; past it the fallback policy places the request")
	fs.DurationVar(&o.scrapeInterval, "scrape-interval", router.DefaultScrapeInterval, "how often each engine's /metrics is read for its load")
	fs.DurationVar(&o.specTTL, "speculative-ttl", router.DefaultSpecTTL, "how long a placed prompt counts as cached on its worker after its first response byte (it counts from placement on; negative disables)")
	fs.IntVar(&o.maxAttempts, "max-attempts", router.DefaultMaxAttempts, "workers tried for a request whose worker fails before the first response byte")
	fs.DurationVar(&o.downFor, "down-for", router.DefaultDownFor, "how long a worker that refused a connection is avoided")
	fs.Int64Var(&o.maxBody, "max-body-bytes", router.DefaultMaxBodyBytes, "largest request body accepted")
	fs.IntVar(&o.blockSize, "block-size", router.DefaultBlockSize, "KV block size assumed for workers that do not register one")
	fs.IntVar(&o.seed, "seed", 0, "seed of the policies' random choices (0: from the clock)")
	fs.StringVar(&o.token, "token", "", "bearer token for the directory")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q (flags only; see --help)", fs.Args())
	}
	if err := envflag.Apply(fs, "KVDIR_ROUTER_", getenv); err != nil {
		return nil, err
	}
	if o.directory == "" && o.workers == "" {
		return nil, errors.New("give --directory (discover workers from the kvdir directory) or --workers (a static list); see --help")
	}
	return o, nil
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
			return nil, fmt.Errorf("--workers: %q: want id=url[@model]", item)
		}
		if seen[id] {
			return nil, fmt.Errorf("--workers: worker id %q given twice", id)
		}
		seen[id] = true
		w := router.StaticWorker{ID: id, Address: rest}
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

// run runs the router until ctx ends. ready, if not nil, receives the
// listening address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	prof, err := costmodel.ResolveProfile(o.profile)
	if err != nil {
		return fmt.Errorf("--profile: %w", err)
	}
	seed := int64(o.seed)
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	hbf := o.hashBalance
	if hbf == 0 {
		hbf = -1
	}
	popts := placement.Options{Seed: seed, Profile: prof, HashBalanceFactor: hbf}
	pol, err := placement.New(o.policy, popts)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	fb, err := placement.New(o.fallback, popts)
	if err != nil {
		return fmt.Errorf("--fallback-policy: %w", err)
	}

	var rend router.Renderer
	switch o.tokenizer {
	case "chatml-cl100k":
		tmpl, err := tokenize.ChatMLCL100K()
		if err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
		if rend, err = router.NewLocalRenderer(tmpl, o.sessionCacheSessions, o.sessionCacheTokens); err != nil {
			return err
		}
	case "remote":
		if o.tokenizeURL == "" {
			return errors.New("--tokenizer remote needs --tokenize-url")
		}
		rend = router.NewRemoteRenderer(o.tokenizeURL, o.tokenizeModel, 10*time.Second)
	default:
		return fmt.Errorf("--tokenizer %q: want chatml-cl100k or remote", o.tokenizer)
	}

	cfg := router.Config{Policy: pol, Fallback: fb, Renderer: rend, SessionHeader: o.sessionHeader,
		MaxBodyBytes: o.maxBody, MatchTimeout: o.matchTimeout, ScrapeInterval: o.scrapeInterval, SpecTTL: o.specTTL,
		MaxAttempts: o.maxAttempts, DownFor: o.downFor, BlockSize: o.blockSize, Logger: log}
	if o.workers != "" {
		if cfg.Static, err = parseWorkers(o.workers); err != nil {
			return err
		}
	}
	if o.directory != "" {
		dir, err := dirclient.New(dirclient.Config{Addrs: strings.Split(o.directory, ","), Token: o.token, Logger: log})
		if err != nil {
			return fmt.Errorf("directory client: %w", err)
		}
		defer dir.Close()
		cfg.Directory = dir
	}
	srv, err := router.New(cfg)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on --addr %s: %w", o.addr, err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- srv.Run(runCtx) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	log.Info("router: serving", "addr", ln.Addr().String(), "policy", pol.Name(), "fallback", fb.Name(),
		"directory", o.directory, "static_workers", len(cfg.Static))
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
	err = hs.Shutdown(sctx)
	cancelRun()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
