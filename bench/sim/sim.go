// Package sim is kvbench's discrete-event simulator: it runs a trace, in
// virtual time, through a real placement policy (internal/placement) in front
// of N copies of the real engine model (internal/simengine), with the
// directory's view built from the engines' own KV-cache events the way the
// real system builds it.
//
// # What is real and what is modelled
//
//   - Engines: simengine.Engine instances (paged prefix cache with LRU eviction,
//     continuous batching with chunked prefill and preemption, step times
//     from a calibrated costmodel.Profile, the one the policy is given),
//     each driven on the virtual clock: a step starts when the previous
//     one ends, or when a request arrives at an idle engine.
//   - Directory: each engine's event batches go through the agent's real
//     Translator (engine hashes to content hashes) into one real radix index,
//     the directory's data structure. A batch becomes visible EventLag after
//     the end of the step that produced it (default 0: visible to the next
//     placement after that step).
//   - Router: per request, the prompt's content-hash chain (internal/blockhash,
//     the engine's block size) is matched against the index; the policy gets,
//     per replica, the matched blocks (the larger of the directory's match and
//     the router's speculative entries: after a placement the chosen replica
//     counts as holding the request's chain, see below) and the load:
//     running, waiting and KV usage from the engine as of its last finished
//     step, plus the router's own accounting of requests in flight and of the
//     uncached prefill tokens it routed that have not produced a first token.
//     Speculative entries follow the router: held while the request waits
//     for its first token (at most SpeculativePendingMax), then for
//     SpeculativeTTL.
//   - Routers (Config.Routers, default 1): a load balancer spreads the
//     requests over N routers (Balance: round-robin by arrival, seeded
//     random, or by session key). Each router has its own policy instance
//     (seeded Seed+k: its own tie breaks and, for the policies that keep
//     any, its own sticky or approximate-tree state), its own replica of the
//     directory's index, which applies each batch RouterViewLag (spread by
//     RouterViewJitter, drawn by seed) after the directory does, and its own
//     speculative entries, in-flight count and queued-prefill accounting.
//     Each placement is an intent: the placing router counts it at once,
//     from the placement, through its first token (its uncached tokens leave
//     the queue, its entry's TTL starts) to its end; with SharedIntents every
//     other router counts it the same way, each change IntentLag later
//     (the model of the routers' shared placement intents). One router is
//     the simulator as it was before routers were modelled: the tests
//     reproduce bench/results/sim-demo.json from it exactly. The engines'
//     gauges are the same for every router (scrape intervals are not
//     modelled).
//   - Late binding (Config.LateBinding): the router's admission queue,
//     with its rule (internal/admission): while every replica is past its
//     knee a request waits at its router and is placed at the first step
//     end, or arrival, at which a replica is below the knee for it.
//   - Cost model: the policy prices with Config.PolicyProfile (default:
//     the engines' Profile); with Calibrate, each router fits it online
//     (costmodel.Calibrator) to the requests it placed on a worker with
//     nothing queued, as the HTTP router does, and the result's Calibration
//     says how close the fit came to the engines' profile.
//   - Offload tier (Config.OffloadBlocks): each engine keeps the blocks its
//     GPU cache evicts on a bounded tier in host memory (or disk) and loads
//     a request's prefix back from it, taking the profile's transfer time;
//     the directory indexes the tier's blocks on their medium, and the
//     policy gets, per replica, the part of the match beyond the GPU-held
//     run (Config.Tiers).
//   - Not modelled: network and proxy latency, tokenization time, metric
//     scrape intervals, directory outages.
//
// Requests arrive open-loop at their trace timestamps (times TimeScale). A
// request the engine refuses (longer than a replica's KV cache) is counted as
// rejected. The run is deterministic for a seed.
package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/admission"
	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Defaults of Config.
const (
	// DefaultSpeculativeTTL is the router's default (router.DefaultSpecTTL,
	// not imported so that the simulator does not build the HTTP router).
	DefaultSpeculativeTTL = 5 * time.Second
	// SpeculativePendingMax bounds how long an entry waits for its
	// request's first token (the router's specPendingMax).
	SpeculativePendingMax = 10 * time.Minute
	// DefaultQueueSamples is the number of intervals of the queue-depth
	// series when Config.QueueInterval is 0.
	DefaultQueueSamples = 300
	// DefaultAdmissionQueue and DefaultAdmissionMaxWait are the router's
	// defaults of late binding (router.DefaultAdmissionQueue and
	// DefaultAdmissionMaxWait).
	DefaultAdmissionQueue   = 1024
	DefaultAdmissionMaxWait = 30 * time.Second
	// DefaultChainPrefixBlocks is how many leading chain hashes a request
	// carries for hashing policies when it has no session key.
	DefaultChainPrefixBlocks = 4
)

// Config configures one simulated run.
type Config struct {
	Policy string // placement policy name (placement.Names)
	// Impl, if set, is used instead of placement.New(Policy, ...) (for
	// experiments with policy variants); Policy still names it in results.
	// With several Routers they all call this one instance, so its state
	// and random choices are shared as no real routers' are (tests use that
	// to compare the routers' views alone).
	Impl    placement.Policy
	Profile costmodel.Profile // engine timing model, also given to the policy
	// PolicyProfile, if named, is the policy's profile instead of Profile
	// (a what-if: the router's cost model is wrong, e.g. another model's).
	// With Calibrate it is the calibration's prior.
	PolicyProfile costmodel.Profile
	// Calibrate gives each router's policy a costmodel.Calibrator, with the
	// policy's profile as its prior, fed the observation the router sees
	// when each request it placed ends: prompt and cached tokens, and the
	// time to first token, if the worker had nothing queued at placement
	// (engine Waiting and the router's queued prefill tokens both 0), with
	// the engine's running count then as the decode batch riding along.
	Calibrate bool
	Replicas  int // engines
	KVBlocks  int // KV-cache blocks per engine
	// BlockSize, MaxBatchedTokens and MaxRunning configure every engine
	// (zero: the engine's defaults, 16, 8192, 256).
	BlockSize        int
	MaxBatchedTokens int
	MaxRunning       int
	// OffloadBlocks, if positive, gives every engine an offload tier of
	// that many blocks on OffloadMedium (default "CPU", host memory):
	// blocks the GPU cache evicts stay there and load back, taking the
	// profile's transfer time (simengine's offload.go).
	OffloadBlocks int
	OffloadMedium string
	// Tiers is how the policy is told of blocks held beyond a replica's
	// GPU run: TiersPriced (the default) passes the directory's tier split
	// (placement.Candidate's HostBlocks and DiskBlocks), TiersAsGPU counts
	// them as GPU-held (the split left out), TiersGPUOnly leaves them out
	// of the match.
	Tiers string
	// TraceBlockSize is the trace's tokens per hash id (default 512).
	TraceBlockSize int
	// TimeScale multiplies the trace's timestamps (default 1; 0.5 sends
	// the trace twice as fast).
	TimeScale float64
	// EventLag delays the visibility of every event batch after the end of
	// the step that produced it.
	EventLag time.Duration
	// Routers is how many routers place the requests (0: 1). Each has its
	// own policy instance (seeded Seed+k for router k), its own directory
	// view, and its own speculative entries and accounting.
	Routers int
	// Balance spreads the requests over the routers the way a load balancer
	// in front of them does: BalanceRoundRobin (the default), BalanceRandom
	// (seeded by Seed) or BalanceSession (a session's requests to one
	// router).
	Balance string
	// RouterViewLag delays each router's directory view beyond EventLag (a
	// router that follows the directory's log sees an entry this long after
	// the directory has it).
	RouterViewLag time.Duration
	// RouterViewJitter spreads the routers' view lags: router k's lag is
	// RouterViewLag plus an offset drawn uniformly from [-RouterViewJitter,
	// +RouterViewJitter] by Seed and k, and never below 0.
	RouterViewJitter time.Duration
	// SharedIntents makes every router count the other routers'
	// placements as its own: their speculative entries, requests in flight
	// and queued uncached prefill tokens, each change IntentLag after the
	// router that placed the request saw it.
	SharedIntents bool
	// IntentLag is how long a placement, its first token and its end take
	// to reach the other routers (with SharedIntents).
	IntentLag time.Duration
	// SpeculativeTTL is how long a placement counts as holding its chain
	// (0: DefaultSpeculativeTTL; negative: no speculative entries).
	SpeculativeTTL time.Duration
	// SpeculativeFixedTTL ends a speculative entry SpeculativeTTL after the
	// placement (the router's earlier rule). By default, as the router does
	// now, the entry lasts while the request waits for its first token (at
	// most SpeculativePendingMax) and then for SpeculativeTTL.
	SpeculativeFixedTTL bool
	// Model names the namespace of every request (default: the profile name).
	Model string
	// Seed seeds the policy's random choices and the engines.
	Seed int64
	// LateBinding holds a request at the router while every replica is
	// past its knee (admission.Knee, with MaxBatchedTokens as the chunk),
	// in a queue of at most AdmissionQueue requests, each for at most
	// AdmissionMaxWait; it is placed, by the policy on the loads of that
	// moment, at the first step end at which a replica is below its knee.
	// A request the queue refuses (full, or waited too long) is counted as
	// rejected. New requests queue behind held ones, and a session's
	// request never overtakes its earlier one (the router's rule).
	LateBinding bool
	// AdmissionQueue bounds the held requests (0: DefaultAdmissionQueue).
	AdmissionQueue int
	// AdmissionMaxWait bounds a request's wait (0: DefaultAdmissionMaxWait).
	AdmissionMaxWait time.Duration
	// QueueInterval is the width of a queue-depth sample (0: the trace's
	// span / DefaultQueueSamples, at least one second).
	QueueInterval time.Duration
	// Logger receives progress; nil discards.
	Logger *slog.Logger
	// Observe, if set, receives every request's sample at the end of a
	// successful run (in finishing order; rejected requests included), for
	// measures the Policy does not hold.
	Observe func([]report.Sample)
}

// Values of Config.Tiers.
const (
	TiersPriced  = "priced"
	TiersAsGPU   = "as-gpu"
	TiersGPUOnly = "gpu-only"
)

// TierModes returns the values of Config.Tiers.
func TierModes() []string { return []string{TiersPriced, TiersAsGPU, TiersGPUOnly} }

// ErrBadConfig is wrapped by configuration errors.
var ErrBadConfig = errors.New("sim: invalid config")

func (c *Config) fill(recs []workload.Record) error {
	if c.TraceBlockSize == 0 {
		c.TraceBlockSize = workload.DefaultBlockSize
	}
	if c.BlockSize == 0 {
		c.BlockSize = simengine.DefaultBlockSize
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = simengine.DefaultMaxBatchedTokens
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.SpeculativeTTL == 0 {
		c.SpeculativeTTL = DefaultSpeculativeTTL
	}
	if c.Model == "" {
		c.Model = c.Profile.Name
	}
	if c.PolicyProfile.Name == "" {
		c.PolicyProfile = c.Profile
	}
	if c.Routers == 0 {
		c.Routers = 1
	}
	if c.Balance == "" {
		c.Balance = BalanceRoundRobin
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.AdmissionQueue == 0 {
		c.AdmissionQueue = DefaultAdmissionQueue
	}
	if c.AdmissionMaxWait == 0 {
		c.AdmissionMaxWait = DefaultAdmissionMaxWait
	}
	if c.Tiers == "" {
		c.Tiers = TiersPriced
	}
	if c.OffloadBlocks > 0 && c.OffloadMedium == "" {
		c.OffloadMedium = "CPU"
	}
	switch {
	case c.AdmissionQueue < 0 || c.AdmissionMaxWait < 0:
		return fmt.Errorf("%w: admission queue %d and max wait %v, want >= 0", ErrBadConfig, c.AdmissionQueue, c.AdmissionMaxWait)
	case c.Replicas < 1:
		return fmt.Errorf("%w: replicas %d, want >= 1", ErrBadConfig, c.Replicas)
	case c.KVBlocks < 1:
		return fmt.Errorf("%w: kv blocks %d, want >= 1", ErrBadConfig, c.KVBlocks)
	case !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0):
		return fmt.Errorf("%w: time scale %v, want a finite value > 0", ErrBadConfig, c.TimeScale)
	case c.EventLag < 0:
		return fmt.Errorf("%w: event lag %v, want >= 0", ErrBadConfig, c.EventLag)
	case c.QueueInterval < 0:
		return fmt.Errorf("%w: queue interval %v, want >= 0", ErrBadConfig, c.QueueInterval)
	case c.Routers < 1:
		return fmt.Errorf("%w: routers %d, want >= 1", ErrBadConfig, c.Routers)
	case !slices.Contains(Balances(), c.Balance):
		return fmt.Errorf("%w: balance %q, want one of %s", ErrBadConfig, c.Balance, strings.Join(Balances(), ", "))
	case c.RouterViewLag < 0:
		return fmt.Errorf("%w: router view lag %v, want >= 0", ErrBadConfig, c.RouterViewLag)
	case c.RouterViewJitter < 0:
		return fmt.Errorf("%w: router view jitter %v, want >= 0", ErrBadConfig, c.RouterViewJitter)
	case c.IntentLag < 0:
		return fmt.Errorf("%w: intent lag %v, want >= 0", ErrBadConfig, c.IntentLag)
	case !slices.Contains(TierModes(), c.Tiers):
		return fmt.Errorf("%w: tiers %q, want one of %s", ErrBadConfig, c.Tiers, strings.Join(TierModes(), ", "))
	case c.OffloadBlocks < 0:
		return fmt.Errorf("%w: offload blocks %d, want >= 0", ErrBadConfig, c.OffloadBlocks)
	case len(recs) == 0:
		return fmt.Errorf("%w: empty trace", ErrBadConfig)
	}
	if c.QueueInterval == 0 {
		span := time.Duration(recs[len(recs)-1].Timestamp * c.TimeScale * float64(time.Millisecond))
		c.QueueInterval = max(time.Second, span/DefaultQueueSamples)
	}
	return nil
}

// SessionKey is the key a run gives hashing policies for r: its session id,
// or, for traces without one, "h" and its first hash id (in the Mooncake
// traces the first block identifies the conversation). A live replay sends
// the same key as its X-Session-Id header.
func SessionKey(r *workload.Record) string {
	if r.SessionID != "" {
		return r.SessionID
	}
	if len(r.HashIDs) == 0 {
		return ""
	}
	return "h" + strconv.FormatInt(r.HashIDs[0], 10)
}

// replica is one engine, the events it published and the placements on it.
type replica struct {
	idx int
	id  string
	eng *simengine.Engine
	tr  *agent.Translator
	log []published // published, not yet applied by every view

	busy bool                 // a step is in progress
	step simengine.StepResult // the step in progress
	load placement.Load       // engine gauges as of the last finished step
	// intents are the placements here, oldest first, as long as some
	// router still counts them.
	intents []*intent
	res     map[string]*intent // requests in flight here
	// own[k] measures how busy router k's placements here kept the
	// prefill pipeline, peers[k] (with SharedIntents) the other routers'.
	own, peers []placement.BusyMeter

	peakQueue   int
	queue       []int // largest waiting count per interval
	prefill     int64
	preemptions int64
}

// published is one event batch of an engine, translated once (when the
// first view applies it) the agent's way.
type published struct {
	batch      simengine.EventBatch
	evs        []*kvdirv1.Event
	translated bool
}

// never is the time of what has not happened.
const never = time.Duration(math.MaxInt64)

// intent is one placement as the routers account for it: the router that
// placed it counts it at once, the others (with Config.SharedIntents)
// IntentLag after each change.
type intent struct {
	rec      int      // record index
	router   int      // the router that placed it
	chain    []uint64 // speculative entry; nil without one
	uncached int      // prefill tokens counted as queued until the first token
	matched  int      // tokens the chosen replica held for it at placement
	usage    float64  // the chosen replica's KV usage then
	placed   time.Duration
	started  time.Duration // first token, or never
	finished time.Duration // or never
	// dropped is when the placing router dropped the speculative entry
	// (at the first placement after its expiry), or never.
	dropped time.Duration
	// clean is whether the worker had nothing queued at placement, as the
	// placing router saw it, and running its running sequences then.
	clean   bool
	running int
}

// seen reports whether what happened at t has reached, at now, a router
// that learns of it lag later.
func seen(t, lag, now time.Duration) bool {
	return t != never && t <= now-lag
}

// state is one run.
type state struct {
	cfg     Config
	recs    []workload.Record
	ideal   []int
	routers []*router
	views   []*view
	reps    []*replica
	byName  map[string]int
	hasher  *blockhash.Hasher
	balance *rand.Rand // BalanceRandom's choices

	// held are the requests late binding holds (nil without it); knee is
	// its rule.
	held *admission.Queue[heldReq]
	knee admission.Knee
	// nheld and nrefused count the requests held and those refused.
	nheld, nrefused int
	peakHeld        int // most requests held at once

	samples []report.Sample
	done    []bool // per record: finished or rejected
	err     error  // a broken invariant seen while finishing a step
	tokens  []uint32
	chain   []uint64
	matches []radix.WorkerMatch
	cands   []placement.Candidate

	start   time.Duration       // first arrival
	calib   *report.Calibration // with Config.Calibrate
	checked bool                // the calibration checkpoint was taken
}

// Run simulates recs (in arrival order, see workload.SortByTime) under
// cfg.Policy and returns the policy's results. ideal holds each record's
// ideal cached tokens (workload.IdealHits with the trace's and the engine's
// block sizes).
func Run(ctx context.Context, recs []workload.Record, ideal []int, cfg Config) (report.Policy, error) {
	wall := time.Now()
	if err := cfg.fill(recs); err != nil {
		return report.Policy{}, err
	}
	if len(ideal) != len(recs) {
		return report.Policy{}, fmt.Errorf("%w: %d ideal counts for %d records", ErrBadConfig, len(ideal), len(recs))
	}
	hasher, err := blockhash.New(blockhash.Namespace{Model: cfg.Model, BlockSize: cfg.BlockSize})
	if err != nil {
		return report.Policy{}, fmt.Errorf("sim: %w", err)
	}
	s := &state{
		cfg: cfg, recs: recs, ideal: ideal, hasher: hasher,
		byName:  make(map[string]int, cfg.Replicas),
		samples: make([]report.Sample, 0, len(recs)),
		done:    make([]bool, len(recs)),
		balance: rand.New(rand.NewPCG(uint64(cfg.Seed), balanceStream)),
	}
	if cfg.LateBinding {
		s.held = admission.NewQueue[heldReq](cfg.AdmissionQueue, cfg.AdmissionMaxWait)
		s.knee = admission.NewKnee(cfg.Profile, cfg.MaxBatchedTokens)
	}
	if err := s.newRouters(); err != nil {
		return report.Policy{}, err
	}
	quiet := slog.New(slog.DiscardHandler)
	for i := range cfg.Replicas {
		r := &replica{idx: i, id: fmt.Sprintf("r%d", i), res: make(map[string]*intent),
			own: make([]placement.BusyMeter, cfg.Routers), peers: make([]placement.BusyMeter, cfg.Routers)}
		r.tr = agent.NewTranslator(cfg.Model, max(agent.DefaultMapCapacity, 4*cfg.KVBlocks), quiet)
		r.eng, err = simengine.New(simengine.Config{
			Profile: cfg.Profile, BlockSize: cfg.BlockSize, CapacityBlocks: cfg.KVBlocks,
			MaxBatchedTokens: cfg.MaxBatchedTokens, MaxRunning: cfg.MaxRunning, Seed: uint64(cfg.Seed),
			OffloadMedium: cfg.OffloadMedium, OffloadBlocks: cfg.OffloadBlocks,
		}, simengine.SinkFunc(func(b simengine.EventBatch) { r.log = append(r.log, published{batch: b}) }))
		if err != nil {
			return report.Policy{}, fmt.Errorf("sim: replica %d: %w", i, err)
		}
		s.reps = append(s.reps, r)
		s.byName[r.id] = i
	}
	for _, v := range s.views {
		v.next = make([]int, cfg.Replicas)
	}
	s.start = s.arrival(0)
	if err := s.loop(ctx); err != nil {
		return report.Policy{}, err
	}
	return s.result(time.Since(wall))
}

func (s *state) arrival(i int) time.Duration {
	return time.Duration(math.Round(s.recs[i].Timestamp * s.cfg.TimeScale * float64(time.Millisecond)))
}

// loop processes arrivals and step ends in time order; at equal times, a
// step's end comes first, so its results are visible to the arrival.
func (s *state) loop(ctx context.Context) error {
	next := 0
	lastLog := time.Now()
	for n := 0; ; n++ {
		if n&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			if time.Since(lastLog) > 5*time.Second {
				lastLog = time.Now()
				s.cfg.Logger.Info("sim progress", "policy", s.cfg.Policy, "arrived", next, "of", len(s.recs), "finished", len(s.samples))
			}
		}
		var step *replica
		for _, r := range s.reps {
			if r.busy && (step == nil || r.step.End < step.step.End) {
				step = r
			}
		}
		if next < len(s.recs) && (step == nil || s.arrival(next) < step.step.End) {
			if err := s.arrive(next); err != nil {
				return err
			}
			next++
			continue
		}
		if step == nil {
			if s.held != nil && s.held.Len() > 0 {
				return fmt.Errorf("sim: %d requests held with every engine idle", s.held.Len())
			}
			return nil
		}
		s.finishStep(step)
		if s.err != nil {
			return s.err
		}
	}
}

// finishStep applies the results of r's step at its end and starts the next.
func (s *state) finishStep(r *replica) {
	res := &r.step
	now := res.End
	r.prefill += int64(res.PrefillTokens)
	r.preemptions += int64(res.Preempted)
	for _, t := range res.Tokens {
		if t.Index != 0 {
			continue
		}
		if x := r.res[t.RequestID]; x != nil && x.started == never {
			x.started = now
			s.pending(r, x.router, now, -1)
		}
	}
	for _, f := range res.Finished {
		q := r.res[f.ID]
		delete(r.res, f.ID)
		if q == nil || s.done[q.rec] {
			s.err = fmt.Errorf("sim: %s finished request %s twice or without placing it", r.id, f.ID)
			continue
		}
		q.finished = now
		s.done[q.rec] = true
		if o, ok := s.routers[q.router].pol.(placement.CacheObserver); ok {
			o.ObserveCache(placement.CacheOutcome{MatchedTokens: q.matched, KVUsage: q.usage, CachedTokens: f.CachedTokens, OutputTokens: len(f.Output)})
		}
		s.observe(q, &f, now)
		s.samples = append(s.samples, report.Sample{
			Replica: r.idx, PromptTokens: f.PromptTokens, CachedTokens: f.CachedTokens,
			IdealCached: s.ideal[q.rec], OutputTokens: len(f.Output),
			Arrival: s.arrival(q.rec), FirstToken: f.FirstToken, Finish: f.Finish,
		})
	}
	st := r.eng.Stats()
	r.load.Running, r.load.Waiting, r.load.KVUsage = st.Running, st.Waiting, st.KVUsage
	s.recordQueue(r, now, st.Waiting)
	if s.held != nil && s.held.Len() > 0 {
		if err := s.release(now); err != nil {
			s.err = err
			return
		}
	}
	if r.eng.Busy() {
		r.step = r.eng.Step(now)
		r.busy = !r.step.Idle
	} else {
		r.busy = false
	}
}

func (s *state) recordQueue(r *replica, now time.Duration, waiting int) {
	r.peakQueue = max(r.peakQueue, waiting)
	b := int(now / s.cfg.QueueInterval)
	for len(r.queue) <= b {
		r.queue = append(r.queue, 0)
	}
	r.queue[b] = max(r.queue[b], waiting)
}

// arrive places record i, through the router the balancer picks, and
// submits it; with late binding it may hold it instead.
func (s *state) arrive(i int) error {
	now := s.arrival(i)
	if err := s.flush(now); err != nil {
		return err
	}
	s.expire(now)
	rt := s.pickRouter(i)
	if err := s.prepare(i, rt, now); err != nil {
		return err
	}
	if s.held != nil {
		s.rejectExpired(now)
		key := SessionKey(&s.recs[i])
		if s.held.Len() > 0 || s.held.Busy(key) || s.knee.AllPast(s.cands, len(s.tokens)) {
			if _, err := s.held.Push(now, key, heldReq{rec: i, rt: rt}); err != nil {
				s.reject(i, now) // queue full: the router's 429
				return nil
			}
			s.nheld++
			s.peakHeld = max(s.peakHeld, s.held.Len())
			// As the router wakes its queue on a push: a replica may be
			// below its knee for this request though not for those ahead.
			return s.release(now)
		}
	}
	return s.commit(i, rt, now)
}

// heldReq is a request late binding holds, and the router holding it.
type heldReq struct {
	rec int
	rt  *router
}

// release places, at the step end now, the held requests that some
// replica below its knee can take, oldest first (the router's wake-up).
func (s *state) release(now time.Duration) error {
	s.rejectExpired(now)
	if s.held.Len() == 0 {
		return nil
	}
	if err := s.flush(now); err != nil {
		return err
	}
	s.expire(now)
	// The knee needs only the loads, the same for every request of a
	// router: computed once per router and grant, not per request scanned.
	loads := make(map[int][]placement.Load, len(s.routers))
	fits := func(e *admission.Entry[heldReq]) bool {
		rt := e.Value.rt
		ls, ok := loads[rt.idx]
		if !ok {
			ls = make([]placement.Load, len(s.reps))
			for k, r := range s.reps {
				ls[k] = s.kneeLoad(rt, r, now)
			}
			loads[rt.idx] = ls
		}
		n := s.promptLen(e.Value.rec)
		for _, l := range ls {
			if !s.knee.Past(l, n) {
				return true
			}
		}
		return false
	}
	for {
		clear(loads)
		e := s.held.Next(now, fits)
		if e == nil {
			return nil
		}
		err := s.prepare(e.Value.rec, e.Value.rt, now)
		if err == nil {
			err = s.commit(e.Value.rec, e.Value.rt, now)
		}
		s.held.Done(e)
		if err != nil {
			return err
		}
	}
}

// kneeLoad is replica r's load as router rt sees it at now, as far as the
// knee needs it: the engine's gauges and the uncached prefill queued by
// the placements rt knows of (candidate's accounting, without the
// speculative depth, which needs the request's chain).
func (s *state) kneeLoad(rt *router, r *replica, now time.Duration) placement.Load {
	l := r.load
	l.QueuedPrefillTokens = 0
	for _, x := range r.intents {
		lag, ok := s.intentLag(rt, x)
		if ok && seen(x.placed, lag, now) && !seen(x.finished, lag, now) && !seen(x.started, lag, now) {
			l.QueuedPrefillTokens += x.uncached
		}
	}
	return l
}

// promptLen is the length of record i's prompt (workload.Prompt's).
func (s *state) promptLen(i int) int {
	r := &s.recs[i]
	return min(r.InputLength, len(r.HashIDs)*s.cfg.TraceBlockSize)
}

// rejectExpired counts as rejected the held requests that waited
// AdmissionMaxWait (the router's 503).
func (s *state) rejectExpired(now time.Duration) {
	for _, e := range s.held.Expired(now) {
		s.reject(e.Value.rec, now)
	}
}

// reject counts record i as refused at now.
func (s *state) reject(i int, now time.Duration) {
	s.done[i] = true
	s.nrefused++
	s.samples = append(s.samples, report.Sample{PromptTokens: s.promptLen(i), Rejected: true, Arrival: s.arrival(i), FirstToken: now, Finish: now})
}

// prepare renders and hashes record i and fills s.cands as router rt sees
// the replicas at now.
func (s *state) prepare(i int, rt *router, now time.Duration) error {
	rec := &s.recs[i]
	s.tokens = workload.Prompt(s.tokens[:0], rec, s.cfg.TraceBlockSize)
	s.chain = s.hasher.Chain(s.chain[:0], s.tokens, nil)
	var err error
	s.matches, err = rt.view.index.MatchInto(s.matches[:0], s.chain)
	if err != nil {
		return fmt.Errorf("sim: request %d: directory match: %w", i, err)
	}
	s.cands = s.cands[:0]
	for _, r := range s.reps {
		s.cands = append(s.cands, s.candidate(rt, r, now))
	}
	for _, m := range s.matches {
		if k, ok := s.byName[m.Worker]; ok {
			s.matchTiers(&s.cands[k], &m)
		}
	}
	return nil
}

// commit places record i, prepared, with rt's policy at now and submits it.
func (s *state) commit(i int, rt *router, now time.Duration) error {
	rec := &s.recs[i]
	req := placement.Request{
		SessionKey: SessionKey(rec), PromptTokens: len(s.tokens), BlockSize: s.cfg.BlockSize,
		ChainPrefix: s.chain[:min(len(s.chain), DefaultChainPrefixBlocks)],
	}
	d, err := rt.pol.Pick(req, s.cands)
	if err != nil {
		return fmt.Errorf("sim: request %d: %s: %w", i, s.cfg.Policy, err)
	}
	r := s.reps[d.Index]
	id := strconv.Itoa(i)
	err = r.eng.Submit(now, simengine.Request{ID: id, Tokens: s.tokens, MaxTokens: rec.OutputLength, Namespace: s.cfg.Model})
	switch {
	case errors.Is(err, simengine.ErrTooLong):
		s.done[i] = true
		s.samples = append(s.samples, report.Sample{Replica: r.idx, PromptTokens: len(s.tokens), Rejected: true,
			Arrival: s.arrival(i), FirstToken: now, Finish: now})
		return nil
	case err != nil:
		return fmt.Errorf("sim: request %d: %w", i, err)
	}
	x := &intent{
		rec: i, router: rt.idx, uncached: max(len(s.tokens)-d.PredictedCachedTokens, 0),
		matched: min(s.cands[d.Index].MatchedBlocks*s.cfg.BlockSize, len(s.tokens)-1), usage: s.cands[d.Index].Load.KVUsage,
		placed: now, started: never, finished: never, dropped: never,
		clean:   s.cands[d.Index].Load.Waiting == 0 && s.cands[d.Index].Load.QueuedPrefillTokens == 0,
		running: s.cands[d.Index].Load.Running,
	}
	if s.cfg.SpeculativeTTL > 0 {
		x.chain = append([]uint64(nil), s.chain...)
	}
	r.res[id] = x
	r.intents = append(r.intents, x)
	s.pending(r, rt.idx, now, 1)
	s.recordQueue(r, now, r.eng.Stats().Waiting)
	if !r.busy {
		r.step = r.eng.Step(now)
		r.busy = !r.step.Idle
	}
	return nil
}

// matchTiers merges the directory's match m into c, which holds the
// speculative entries' blocks (GPU-held: a placement's prefix), as
// Config.Tiers says.
func (s *state) matchTiers(c *placement.Candidate, m *radix.WorkerMatch) {
	spec := c.MatchedBlocks
	gpu := max(spec, m.Media[radix.GPU])
	switch s.cfg.Tiers {
	case TiersGPUOnly:
		c.MatchedBlocks = gpu
	case TiersAsGPU:
		c.MatchedBlocks = max(spec, m.Blocks)
	default:
		c.MatchedBlocks = max(spec, m.Blocks)
		c.HostBlocks, c.DiskBlocks = placement.TierSplit(c.MatchedBlocks, gpu, max(gpu, m.GPUOrCPU))
	}
}

// result summarises the run.
func (s *state) result(wall time.Duration) (report.Policy, error) {
	if len(s.samples) != len(s.recs) {
		return report.Policy{}, fmt.Errorf("sim: %d of %d requests finished", len(s.samples), len(s.recs))
	}
	ids := make([]string, len(s.reps))
	for i, r := range s.reps {
		ids[i] = r.id
	}
	p, err := report.Summarize(s.cfg.Policy, ids, s.samples)
	if err != nil {
		return report.Policy{}, err
	}
	// Keep at most 2·DefaultQueueSamples intervals: the run drains well past
	// the last arrival under overload.
	interval, longest := s.cfg.QueueInterval, 0
	for _, r := range s.reps {
		longest = max(longest, len(r.queue))
	}
	for longest > 2*DefaultQueueSamples {
		for _, r := range s.reps {
			r.queue = halve(r.queue)
		}
		longest = (longest + 1) / 2
		interval *= 2
	}
	p.Queue = &report.QueueSeries{IntervalSec: interval.Seconds(), Replicas: make([][]int, len(s.reps))}
	for i, r := range s.reps {
		p.Replicas[i].PeakQueue = r.peakQueue
		p.PrefillTokensComputed += r.prefill
		p.Preemptions += r.preemptions
		p.Queue.Replicas[i] = r.queue
		for k, v := range r.tr.Stats().Problems {
			if p.DirectoryProblems == nil {
				p.DirectoryProblems = make(map[string]uint64)
			}
			p.DirectoryProblems[k] += v
		}
	}
	p.Held, p.PeakHeld, p.AdmissionRejected = s.nheld, s.peakHeld, s.nrefused
	p.Finish()
	p.Calibration = s.calibration(false)
	p.WallSec = wall.Seconds()
	if s.cfg.Observe != nil {
		s.cfg.Observe(s.samples)
	}
	return p, nil
}

// halve merges pairs of consecutive intervals, keeping the larger queue.
func halve(q []int) []int {
	out := q[:0]
	for i := 0; i < len(q); i += 2 {
		v := q[i]
		if i+1 < len(q) {
			v = max(v, q[i+1])
		}
		out = append(out, v)
	}
	return out
}
