package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvdir/kvdir/internal/admission"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Defaults of Config.
const (
	DefaultSessionHeader = "X-Session-Id"
	// DefaultMaxBodyBytes is 8 MiB: a 128k-token context is well under
	// 1 MiB of English text, and a prompt of a million token ids under
	// 8 MiB of JSON, so no request an engine could serve is refused, while
	// the bytes a request makes the router hold and tokenize stay small.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxPromptBytes bounds the prompt text tokenized per request:
	// 2 MiB is over 400k tokens of English, and the slowest text for the
	// built-in tokenizer (long runs of spaces) takes 1 to 3 s of CPU
	// (BenchmarkRenderCompletion1MiB in internal/tokenize).
	DefaultMaxPromptBytes = 2 << 20
	// DefaultMaxPromptTokens bounds the token ids of a prompt, given or
	// rendered: above any engine's context length.
	DefaultMaxPromptTokens = 1 << 20
	// DefaultBodyTimeout bounds receiving a request body.
	DefaultBodyTimeout    = 30 * time.Second
	DefaultMatchTimeout   = 5 * time.Millisecond
	DefaultScrapeInterval = 100 * time.Millisecond
	DefaultSpecTTL        = 5 * time.Second
	// DefaultLocalStaleAfter and DefaultLocalMaxStale bound the age of the
	// local replica's view (Config.LocalStaleAfter, LocalMaxStale).
	DefaultLocalStaleAfter = 2 * time.Second
	DefaultLocalMaxStale   = 30 * time.Second
	DefaultMaxAttempts     = 3
	DefaultDownFor         = 2 * time.Second
	DefaultBlockSize       = 16
	DefaultConnectTimeout  = 2 * time.Second
)

// StaticWorker is a worker given on the command line instead of discovered.
type StaticWorker struct {
	ID      string
	Address string // base URL, e.g. http://10.0.0.7:8000
	Model   string // "" to learn it from the engine's metrics (model_name label)
	// Rank, with HasRank, is the data-parallel rank of the engine behind
	// Address this worker stands for: its load is read from that rank's
	// series and its requests carry HeaderDataParallelRank.
	Rank    int
	HasRank bool
}

// Config configures a Server. Zero values select the defaults.
type Config struct {
	// Policy places requests (required); Fallback places them when the
	// directory cannot answer (default session-hash).
	Policy   placement.Policy
	Fallback placement.Policy
	// Renderer turns prompts into token ids (required).
	Renderer Renderer
	// Directory, when set, is used to match prefixes, to discover workers
	// (unless Static is set) and to record sessions: the router's one
	// directory group, named DefaultGroup.
	Directory *dirclient.Client
	// Groups, instead of Directory, are several directory groups side by
	// side, each serving some models (group.go): workers are discovered
	// from every group, and a request is matched, recorded and shared in
	// the group serving its model only. Their order decides a model two
	// groups claim (the first). Each group's Local is its local replica.
	Groups []DirectoryGroup
	// Local, when set with Directory, answers prefix matches from a local
	// replica of the directory (internal/follow) while it is in sync; the
	// directory answers them otherwise. Its lag is the
	// kvdir_router_view_lag_entries gauge.
	Local LocalReplica
	// LocalStaleAfter is the age past which the local replica's matches
	// are marked stale (default 2 s); LocalMaxStale the age past which the
	// directory answers instead (default 30 s). Both ages are how long ago
	// a directory node was last heard from. With Local, /readyz also waits
	// for the replica's first sync, for LocalMaxStale at most.
	LocalStaleAfter, LocalMaxStale time.Duration
	// Static lists the workers when they are not discovered from the
	// directory.
	Static []StaticWorker
	// WorkerSelector, when set, keeps only the directory's workers whose
	// registered labels hold every pair of it (an agent's --labels): the
	// rest are not candidates, as if not registered. It is how a picker
	// serves one InferencePool's pods of a model that other pods on the
	// same directory serve too.
	WorkerSelector map[string]string
	// EngineKind is the shape of the engines' /metrics: "auto" (or "")
	// detects it from each scrape; vllm, sglang or trtllm force it (see
	// enginemetrics.ParseKind).
	EngineKind string
	// SessionHeader names the request header holding the session id.
	SessionHeader string
	// MaxBodyBytes bounds request bodies.
	MaxBodyBytes int64
	// MaxPromptBytes bounds the prompt text (message contents, or a
	// completion's prompt) a request may ask the router to tokenize;
	// MaxPromptTokens the token ids of its prompt, given or rendered.
	// Requests beyond either are refused with 400 before any engine sees
	// them (defaults 2 MiB and 1 Mi tokens).
	MaxPromptBytes  int
	MaxPromptTokens int
	// Explain says who may see the router's prediction of a prompt's
	// cached tokens, the explain endpoint and HeaderPredicted, which tell
	// whether another client sent the same prefix (an oracle of other
	// users' prompts): ExplainOpen (everyone), ExplainToken (requests with
	// ExplainToken in HeaderExplainToken) or ExplainOff. The default ("")
	// is private: ExplainToken when ExplainToken is set, else ExplainOff.
	Explain      string
	ExplainToken string
	// BodyTimeout bounds the time to receive a request body, from the
	// handler's start (default 30 s; negative disables): a client that
	// stalls or trickles gets 408 and its connection is closed.
	BodyTimeout time.Duration
	// MatchTimeout is the directory look-up deadline.
	MatchTimeout time.Duration
	// ScrapeInterval is how often each engine's /metrics is read.
	ScrapeInterval time.Duration
	// ModelsInterval is how often each engine's /v1/models is read to learn
	// the LoRA adapters it serves (0 uses the default; negative disables:
	// then only base models are routed).
	ModelsInterval time.Duration
	// SpecTTL is how long a placed chain counts as present on its worker
	// (0 uses the default; negative disables speculative entries).
	SpecTTL time.Duration
	// MaxAttempts bounds the workers tried for one request.
	MaxAttempts int
	// DownFor is how long a worker that failed a connection is avoided.
	DownFor time.Duration
	// BlockSize is assumed for workers whose block size is not known: the
	// directory has learned none from their events and their agents were
	// not told one (static workers without a directory worker of the same
	// id always).
	BlockSize int
	// ConnectTimeout bounds connecting to a worker.
	ConnectTimeout time.Duration
	// SessionInterval is how often session records are written (default 250ms).
	SessionInterval time.Duration
	// ShareIntents, with Directory, publishes every placement to the
	// directory's Share stream as it happens and counts the other routers'
	// placements as this router's own (intents.go). DefaultConfig sets it;
	// a zero Config leaves it off.
	ShareIntents bool
	// AdmissionQueue, when positive, enables late binding (admission.go):
	// while every worker is past its knee, requests wait at the router, at
	// most AdmissionQueue of them (more are refused with 429) and for at
	// most AdmissionMaxWait each (then 503). DefaultConfig sets
	// DefaultAdmissionQueue and DefaultAdmissionMaxWait; a zero Config
	// leaves late binding off.
	AdmissionQueue   int
	AdmissionMaxWait time.Duration
	// AdmissionKnee is the knee rule (zero: admission.NewKnee of the
	// default profile and a 2048-token chunk).
	AdmissionKnee admission.Knee
	// RouterID names the router to the directory and the other routers;
	// unique among them (default DefaultRouterID: host name and pid).
	RouterID string
	// Calibrator, if set, is fed an observation of each clean streamed
	// response (calibrate.go) and its fit is exported as metrics; give the
	// same calibrator to the kvdir policy (placement.Options.LiveProfile)
	// for the policy to price with it.
	Calibrator *costmodel.Calibrator
	Logger     *slog.Logger
}

func (c *Config) setDefaults() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Fallback == nil {
		p, err := placement.New("session-hash", placement.Options{})
		if err != nil {
			return fmt.Errorf("router: fallback policy: %w", err)
		}
		c.Fallback = p
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MatchTimeout, DefaultMatchTimeout)
	def(&c.ScrapeInterval, DefaultScrapeInterval)
	def(&c.ModelsInterval, DefaultModelsInterval)
	def(&c.SpecTTL, DefaultSpecTTL)
	def(&c.LocalStaleAfter, DefaultLocalStaleAfter)
	def(&c.LocalMaxStale, max(DefaultLocalMaxStale, c.LocalStaleAfter))
	def(&c.DownFor, DefaultDownFor)
	def(&c.ConnectTimeout, DefaultConnectTimeout)
	def(&c.BodyTimeout, DefaultBodyTimeout)
	def(&c.SessionInterval, DefaultSessionInterval)
	def(&c.AdmissionMaxWait, DefaultAdmissionMaxWait)
	if c.Explain == "" {
		c.Explain = DefaultExplain(c.ExplainToken)
	}
	if c.SessionHeader == "" {
		c.SessionHeader = DefaultSessionHeader
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxPromptBytes <= 0 {
		c.MaxPromptBytes = DefaultMaxPromptBytes
	}
	if c.MaxPromptTokens <= 0 {
		c.MaxPromptTokens = DefaultMaxPromptTokens
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BlockSize <= 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RouterID == "" {
		c.RouterID = DefaultRouterID()
	}
	return nil
}

// Server is the router. Create it with New, serve Handler, and call Run to
// discover workers and scrape their load.
type Server struct {
	cfg       Config
	calib     *calibration // nil without Config.Calibrator
	policy    placement.Policy
	fallback  placement.Policy
	renderer  Renderer
	groups    []*group // at least one; the first takes static workers
	pool      *pool
	scraper   *scraper
	modelPoll *modelPoller // nil when disabled
	metrics   *metrics
	adm       *admitter // nil without late binding
	mismatch  *mismatchChecker
	transport *http.Transport
	bufs      sync.Pool
	scratch   sync.Pool // *decideScratch
	candBufs  sync.Pool // *candBufs
	log       *slog.Logger
	mux       *http.ServeMux // admin plus the proxied API
	admin     *http.ServeMux

	created        time.Time // when New returned: the local replica's wait for readiness counts from here
	breakerPause   time.Duration
	groupWait      time.Duration // groupLoadWait (tests shorten it)
	conflictLogged sync.Map      // models claimed by several groups, logged once
	runCtx         atomic.Pointer[context.Context]
	started        atomic.Bool
}

// New returns a router for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, policy: cfg.Policy, fallback: cfg.Fallback, renderer: cfg.Renderer, log: cfg.Logger, breakerPause: breakerPause,
		groupWait: groupLoadWait, created: time.Now()}
	if len(cfg.Groups) > 0 {
		for _, g := range cfg.Groups {
			s.groups = append(s.groups, newGroup(g.Name, g.Directory, g.Local))
		}
	} else {
		s.groups = []*group{newGroup(DefaultGroup, cfg.Directory, cfg.Local)}
	}
	s.transport = &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	s.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	s.pool = newPool(cfg.SpecTTL, s.startScraper)
	s.metrics = newMetrics(func() float64 { return float64(len(s.pool.snapshot())) })
	if cfg.Calibrator != nil {
		s.calib = newCalibration(cfg.Calibrator, s.metrics.reg)
	}
	s.metrics.reg.MustRegister(newGroupCollector(s))
	kind, force, err := engineKind(cfg.EngineKind)
	if err != nil {
		return nil, err
	}
	s.scraper = &scraper{client: &http.Client{Transport: s.transport}, interval: cfg.ScrapeInterval, failures: 3, noStatsHold: DefaultNoStatsHold,
		kind: kind, force: force, reads: newSharedReads(cfg.ScrapeInterval / 2),
		onFailure: func(w *worker, reason string) { s.metrics.scrapeFailures.WithLabelValues(w.id, reason).Inc() },
		onLoad:    func(*worker) { s.adm.wake() },
		onError: func(w *worker, err error) {
			s.log.Warn("router: engine metrics unreachable or unreadable; avoiding the worker", "worker", w.id,
				"reason", scrapeReason(err), "err", err)
			w.downUntil.Store(time.Now().Add(cfg.DownFor).UnixNano())
		}}
	var getter workerGetter
	if cfg.ModelsInterval > 0 {
		s.modelPoll = &modelPoller{client: &http.Client{Transport: s.transport}, interval: cfg.ModelsInterval,
			timeout: min(max(cfg.ModelsInterval, time.Second), 5*time.Second), log: s.log,
			onFailure: func(w *worker, reason string) { s.metrics.modelsFailures.WithLabelValues(w.id, reason).Inc() }}
	}
	for _, g := range s.groups {
		if g.dir == nil {
			continue
		}
		g.rec = newRecorder(g.dir, cfg.SessionInterval, 512, s.metrics, s.log)
		g.rec.group = g.name
		getter = groupGetter{s}
		if cfg.ShareIntents || g.local != nil {
			g.share = newSharer(s, g)
		}
	}
	if s.sharing() {
		s.metrics.reg.MustRegister(newPeerCollector(s))
	}
	if cfg.AdmissionQueue > 0 {
		s.adm = newAdmitter(s)
	}
	s.mismatch = newMismatchChecker(s.metrics.reg, getter, s.baseContext, s.log)
	s.admin = http.NewServeMux()
	s.admin.HandleFunc("POST "+PathExplain, s.serveExplain)
	s.admin.HandleFunc("GET "+PathView, s.serveView)
	s.admin.HandleFunc("GET /v1/models", s.serveModels)
	s.admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.admin.HandleFunc("GET /readyz", s.serveReady)
	s.admin.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	s.admin.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notFound("no route for %s %s", r.Method, r.URL.Path))
	})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST "+PathChat, func(w http.ResponseWriter, r *http.Request) { s.serveProxy(w, r, true) })
	s.mux.HandleFunc("POST "+PathCompletions, func(w http.ResponseWriter, r *http.Request) { s.serveProxy(w, r, false) })
	s.mux.Handle("/", s.admin)
	return s, nil
}

// Handler returns the router's HTTP handler: the OpenAI API it proxies
// and AdminHandler's routes.
func (s *Server) Handler() http.Handler { return s.mux }

// AdminHandler returns the router's HTTP handler without the proxied
// OpenAI API: /metrics, /healthz, /readyz, GET /v1/models and the kvdir
// explain and view endpoints. The endpoint picker serves it, as its data
// plane sends the requests.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// Run discovers workers and scrapes their load until ctx ends. It returns
// nil when ctx ends, or an error the directory made final (such as a
// refused token).
func (s *Server) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("router: Run called twice")
	}
	s.runCtx.Store(&ctx)
	defer s.pool.close()
	defer s.transport.CloseIdleConnections()
	var wg sync.WaitGroup
	for _, g := range s.groups {
		if g.rec != nil {
			wg.Add(1)
			go func() { defer wg.Done(); g.rec.run(ctx) }()
		}
		if g.share != nil {
			wg.Add(1)
			go func() { defer wg.Done(); g.share.run(ctx) }()
		}
	}
	defer wg.Wait()
	if len(s.cfg.Static) > 0 {
		specs := make([]workerSpec, len(s.cfg.Static))
		for i, w := range s.cfg.Static {
			specs[i] = workerSpec{ID: w.ID, Address: w.Address, Model: w.Model, BlockSize: s.cfg.BlockSize,
				Rank: w.Rank, HasRank: w.HasRank}
		}
		if errs := s.pool.replace(specs); len(errs) > 0 {
			return fmt.Errorf("router: static workers: %w", errors.Join(errs...))
		}
		s.groups[0].synced.Store(true)
		if s.groups[0].dir != nil {
			s.watchStaticLayouts(ctx)
		}
		<-ctx.Done()
		return nil
	}
	err := s.runGroups(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// selected says whether w's registered labels hold every pair of the
// router's WorkerSelector.
func (s *Server) selected(w *kvdirv1.Worker) bool {
	labels := w.GetSpec().GetLabels()
	for k, v := range s.cfg.WorkerSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// specOf converts a directory worker.
func specOf(w *kvdirv1.Worker) workerSpec {
	sp := w.GetSpec()
	return workerSpec{ID: sp.GetId(), Address: sp.GetAddress(), Model: sp.GetModel(), BlockSize: int(sp.GetBlockSize()),
		Rank: int(sp.GetDataParallelRank()), HasRank: sp.DataParallelRank != nil,
		BlockSizes: learnedSizes(w),
		Draining:   w.GetState() == kvdirv1.WorkerState_WORKER_STATE_DRAINING,
		Running:    int(w.GetLoad().GetRunning()), Waiting: int(w.GetLoad().GetWaiting()), KVUsage: w.GetLoad().GetKvUsage()}
}

// startScraper starts polling a worker that joined the pool.
func (s *Server) startScraper(w *worker) {
	ctx := s.baseContext()
	go s.scraper.run(ctx, w)
	if s.modelPoll != nil {
		go s.modelPoll.run(ctx, w)
	}
}

// baseContext is Run's context, or the background before Run.
func (s *Server) baseContext() context.Context {
	if p := s.runCtx.Load(); p != nil {
		return *p
	}
	return context.Background()
}

// models returns the models the known workers serve, sorted, then the
// LoRA adapters their engines list, sorted.
func (s *Server) models() []string {
	cards := s.modelCards()
	out := make([]string, len(cards))
	for i, c := range cards {
		out[i] = c.id
	}
	return out
}

// serveModels lists the workers' models and, as vLLM does, each LoRA
// adapter with its parent (the base model) and root.
func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.modelList())
}

// modelList is GET /v1/models's answer.
func (s *Server) modelList() openai.ModelList {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, c := range s.modelCards() {
		m := openai.Model{ID: c.id, Object: "model", OwnedBy: "kvdir", Root: c.root}
		if c.parent != "" {
			m.Parent = &c.parent
		}
		list.Data = append(list.Data, m)
	}
	return list
}

// serveReady answers 200 once the router is ready (Ready), else 503 with
// why not.
func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if ok, why := s.Ready(); !ok {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
	for _, n := range s.conflictNotes() {
		_, _ = fmt.Fprintf(w, "warning: %s\n", n)
	}
}

// Ready reports whether the router can place requests, and if not why:
// workers are known and at least one is routable and, with a local
// replica, the replica has been in sync (see localWait). GET /readyz and
// the endpoint picker's readiness health service both answer it.
func (s *Server) Ready() (bool, string) {
	for _, g := range s.groups {
		if !g.synced.Load() {
			if len(s.groups) == 1 {
				return false, "worker list not loaded yet"
			}
			// One group down at start must not keep the others' models
			// out of service: wait for it a bounded time only.
			if left := s.groupWait - time.Since(s.created); left > 0 {
				return false, fmt.Sprintf("worker list of directory group %s not loaded yet; ready once it is, or in %v without it",
					g.name, left.Round(time.Millisecond))
			}
			if g.unloadedLogged.CompareAndSwap(false, true) {
				s.log.Warn("router: directory group's worker list still not loaded; ready without it (its models are refused until it loads)",
					"group", g.name, "waited", s.groupWait, "last_error", strings.TrimSpace(s.directoryCause(g)))
			}
			continue
		}
		if wait := s.localWait(g); wait > 0 {
			of := "the directory"
			if len(s.groups) > 1 {
				of = "directory group " + g.name
			}
			return false, fmt.Sprintf("local replica of %s not in sync yet; ready once it is, or in %v (--follow-max-stale) without it",
				of, wait.Round(time.Millisecond))
		}
	}
	now := time.Now()
	for _, wk := range s.pool.snapshot() {
		if wk.model() != "" && wk.routable(now) {
			return true, ""
		}
	}
	return false, "no routable worker"
}

// localWait is how much longer readiness waits for the local replica's
// first sync (0: it does not wait). A router that just started with a
// local replica would otherwise take traffic while every match goes over
// the network, or, with the directory unreachable, is placed by hashing.
// The wait is bounded by LocalMaxStale, counted from New: a router that has
// had no view of the directory for that long serves anyway, as one whose
// view has grown that old does, so a router without a directory does not
// stay out of service for good. Once the replica has been in sync,
// readiness no longer depends on it: a directory outage later must not take
// every router out of service at once (matches then go by staleness, see
// matcherFor).
func (s *Server) localWait(g *group) time.Duration {
	l := g.local
	if l == nil || g.localReady.Load() {
		return 0
	}
	if l.Synced() {
		if g.localReady.CompareAndSwap(false, true) {
			s.log.Info("router: local replica of the directory in sync; ready", "group", g.name, "after", time.Since(s.created).Round(time.Millisecond))
		}
		return 0
	}
	left := s.cfg.LocalMaxStale - time.Since(s.created)
	if left <= 0 {
		if g.localReady.CompareAndSwap(false, true) {
			s.log.Warn("router: local replica of the directory still not in sync; ready without it (matches go to the directory, or the fallback policy)",
				"group", g.name, "waited", s.cfg.LocalMaxStale)
		}
		return 0
	}
	return left
}
