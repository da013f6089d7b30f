package router

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/cachecheck"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// registrationRefresh is how often the checker reads a worker's directory
// record again (its registered model and block size, and whether the
// directory holds blocks of it).
const registrationRefresh = 5 * time.Second

// maxMismatchWorkers bounds the workers the check keeps windows for (ids
// come and go as workers re-register under new names).
const maxMismatchWorkers = 1 << 14

// workerGetter is the directory call the misconfiguration check needs;
// *dirclient.Client implements it.
type workerGetter interface {
	GetWorker(ctx context.Context, workerID string, topChains uint32) (*kvdirv1.GetWorkerResponse, error)
}

// mismatchChecker is the router's misconfiguration check: per worker, a
// rolling window of the last cachecheck.Window turns placed with the
// directory's help, evaluated after every turn by cachecheck's rule. A
// worker that becomes flagged sets kvdir_router_cache_mismatch{worker,cause}
// to 1 and logs one warning; one that clears deletes the series and logs
// one info line.
type mismatchChecker struct {
	dir     workerGetter // nil without a directory
	ctx     func() context.Context
	log     *slog.Logger
	gauge   *prometheus.GaugeVec
	flagged *prometheus.CounterVec

	mu   sync.Mutex
	byID map[string]*mismatchState
}

// mismatchState is one worker's window and verdict.
type mismatchState struct {
	win  [cachecheck.Window]windowTurn
	n    int // turns in win
	next int // where the next turn goes

	reg      registration
	regAt    time.Time // when reg was last read (zero: never)
	fetching bool

	kind  cachecheck.Kind
	cause cachecheck.Cause
}

// windowTurn is a turn with what the cause naming needs of its request.
type windowTurn struct {
	cachecheck.Turn
	model string // the model the prompt was hashed under
}

// registration is a worker's directory record as the checker last read it.
type registration struct {
	known     bool
	model     string
	blockSize int
	blocks    uint64
}

func newMismatchChecker(reg prometheus.Registerer, dir workerGetter, ctx func() context.Context, log *slog.Logger) *mismatchChecker {
	c := &mismatchChecker{dir: dir, ctx: ctx, log: log, byID: map[string]*mismatchState{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvdir_router_cache_mismatch",
			Help: "1 while the worker's predicted and engine-reported cached tokens disagree (see the router's README, Misconfiguration check), by likely cause."},
			[]string{"worker", "cause"}),
		flagged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_cache_mismatch_flagged_total",
			Help: "Times a worker became flagged by the misconfiguration check, by likely cause."}, []string{"worker", "cause"}),
	}
	reg.MustRegister(c.gauge, c.flagged)
	return c
}

// MismatchState is a worker's misconfiguration verdict, as explain shows it.
type MismatchState struct {
	Condition string `json:"condition"`
	Cause     string `json:"cause"`
	Summary   string `json:"summary"`
}

// state returns id's verdict, nil if it is not flagged.
func (c *mismatchChecker) state(id string) *MismatchState {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.byID[id]
	if st == nil || st.kind == cachecheck.KindNone {
		return nil
	}
	acc := st.accounting()
	return &MismatchState{Condition: string(st.kind), Cause: string(st.cause), Summary: cachecheck.Summary(acc)}
}

// observe counts one turn on worker id and re-evaluates it. dirBlocks is
// the number of blocks the directory matched on that worker for this
// prompt. The first turn, and any turn 5 s after the last read, starts a
// read of the worker's directory record in the background.
func (c *mismatchChecker) observe(id string, t windowTurn, dirBlocks int) cachecheck.Turn {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.byID[id]
	if st == nil {
		if len(c.byID) >= maxMismatchWorkers {
			c.forgetUnflagged()
		}
		st = &mismatchState{}
		c.byID[id] = st
	}
	if c.dir != nil && !st.fetching && time.Since(st.regAt) >= registrationRefresh {
		st.fetching = true
		go c.fetch(id)
	}
	if st.reg.known {
		t.RegisteredBlockSize = st.reg.blockSize
		t.ModelDiffers = t.model != st.reg.model
	}
	t.DirHoldsBlocks = dirBlocks > 0 || st.reg.blocks > 0
	st.win[st.next] = t
	st.next = (st.next + 1) % len(st.win)
	st.n = min(st.n+1, len(st.win))
	c.evaluate(id, st)
	return t.Turn
}

// forgetUnflagged drops the windows of workers that are not flagged; c.mu
// is held.
func (c *mismatchChecker) forgetUnflagged() {
	for id, st := range c.byID {
		if st.kind == cachecheck.KindNone && !st.fetching {
			delete(c.byID, id)
		}
	}
}

// fetch reads id's directory record into its state.
func (c *mismatchChecker) fetch(id string) {
	ctx, cancel := context.WithTimeout(c.ctx(), 2*time.Second)
	defer cancel()
	resp, err := c.dir.GetWorker(ctx, id, 0)
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.byID[id]
	if st == nil {
		return
	}
	st.fetching = false
	st.regAt = time.Now()
	if err != nil {
		c.log.Debug("router: reading the worker's directory record for the misconfiguration check failed", "worker", id, "err", err)
		return
	}
	w := resp.GetWorker()
	// The block size the engine uses: learned from its events when the
	// directory knows it, else the registered one.
	st.reg = registration{known: true, model: w.GetSpec().GetModel(), blockSize: engineBlockSize(w), blocks: w.GetBlocks()}
	c.evaluate(id, st) // the cause may now be named better
}

// accounting sums st's window.
func (st *mismatchState) accounting() *kvdirv1.CacheAccounting {
	acc := &kvdirv1.CacheAccounting{}
	for i := range st.n {
		cachecheck.Add(acc, st.win[i].Turn)
	}
	return acc
}

// evidence is what the router knows of st's worker.
func (st *mismatchState) evidence() cachecheck.Evidence {
	latest := st.win[(st.next+len(st.win)-1)%len(st.win)]
	e := cachecheck.Evidence{RequestModel: latest.model, HashedBlockSize: latest.BlockSize, SaltKnown: true}
	salted := 0
	for i := range st.n {
		if st.win[i].Salted {
			salted++
		}
	}
	e.Salted = 2*salted > st.n
	if st.reg.known {
		e.RegisteredModel, e.RegisteredBlockSize = st.reg.model, st.reg.blockSize
	}
	return e
}

// evaluate applies the rule to st and acts on a change; c.mu is held.
func (c *mismatchChecker) evaluate(id string, st *mismatchState) {
	acc := st.accounting()
	kind := cachecheck.Evaluate(acc)
	cause := cachecheck.LikelyCause(kind, st.evidence())
	if kind == st.kind && cause == st.cause {
		return
	}
	if st.kind != cachecheck.KindNone {
		c.gauge.DeleteLabelValues(id, string(st.cause))
	}
	was := st.kind
	st.kind, st.cause = kind, cause
	switch {
	case kind == cachecheck.KindNone:
		c.log.Info("router: cache mismatch cleared: predicted and engine-reported cached tokens agree again",
			"worker", id, "was", string(was), "turns", cachecheck.Summary(acc))
		return
	case was == kind:
		// Same condition, better evidence: the cause label moves.
		c.gauge.WithLabelValues(id, string(cause)).Set(1)
		c.log.Info("router: cache mismatch cause revised", "worker", id, "condition", string(kind), "likely_cause", string(cause),
			"check", cause.Advice())
		return
	}
	c.gauge.WithLabelValues(id, string(cause)).Set(1)
	c.flagged.WithLabelValues(id, string(cause)).Inc()
	e := st.evidence()
	c.log.Warn("router: cache mismatch: "+kind.Describe(),
		"worker", id, "condition", string(kind), "likely_cause", string(cause), "check", cause.Advice(),
		"turns", acc.Turns, "hit_turns", acc.HitTurns, "unpredicted_hits", acc.UnpredictedHits,
		"predicted_turns", acc.PredictedTurns, "over_predicted", acc.OverPredicted,
		"predicted_tokens", acc.PredictedTokens, "reported_tokens", acc.ReportedTokens,
		"request_model", e.RequestModel, "registered_model", e.RegisteredModel,
		"hashed_block_size", e.HashedBlockSize, "registered_block_size", e.RegisteredBlockSize, "cache_salt", e.Salted)
}

// observeTurn counts a comparable turn (placed with the directory's answer,
// with the engine's cached tokens known) into the check, and returns it as
// counted (with what the worker's directory record adds).
func (s *Server) observeTurn(req *request, d *decision, reported int) cachecheck.Turn {
	i := d.pick.Index
	return s.mismatch.observe(d.workers[i].id, windowTurn{
		Turn:  cachecheck.Turn{Predicted: d.pick.PredictedCachedTokens, Reported: reported, BlockSize: d.bs[i], Salted: req.cacheSalt != ""},
		model: d.ns.at(i).Model}, d.dir[i])
}
