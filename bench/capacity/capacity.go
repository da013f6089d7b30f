// Package capacity measures what request rate a cluster sustains under each
// placement policy at a time-to-first-token objective: the policy's
// capacity at an SLO.
//
// A trace is replayed in the simulator (bench/sim) at a request-rate
// multiplier m (its timestamps scaled by 1/m). A run passes when the p90
// TTFT over all its requests, a rejected request counting as one that never
// gets a first token, is at most the SLO. Sweep finds per policy the highest
// passing m by bracketing (doubling or halving from m = 1) and bisection in
// log space, then compares the policies: against round-robin, against the
// best of the baselines (the other routers' policies), and by their p90 TTFT
// all at the best baseline's capacity.
package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/bench/sim"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/simengine"
	"github.com/kvdir/kvdir/internal/workload"
)

// Defaults of Options.
const (
	DefaultPrecision     = 0.05
	DefaultMinMultiplier = 1.0 / 64
	DefaultMaxMultiplier = 64
	DefaultParallel      = 2
	// Quantile is the TTFT quantile the SLO bounds.
	Quantile = 0.9
)

// Baselines are the policies of other routers that kvdir is compared with;
// the best baseline of a sweep is the one of them with the highest capacity.
var Baselines = []string{"llm-d", "llm-d-sticky", "sglang", "dynamo", "prefix", "session-hash"}

// RoundRobin is the policy every capacity is also compared with.
const RoundRobin = "round-robin"

// defaultSLOs are the TTFT objectives of the built-in profiles.
var defaultSLOs = map[string]time.Duration{"llama3-70b": 2 * time.Second, "llama3-8b": time.Second}

// DefaultSLO returns the p90 TTFT objective used for a built-in profile; ok
// is false for other profiles (a profile file), which must be given one.
func DefaultSLO(profile string) (time.Duration, bool) {
	d, ok := defaultSLOs[profile]
	return d, ok
}

// Options configures a sweep.
type Options struct {
	// SLO bounds the p90 TTFT; required.
	SLO time.Duration
	// Precision stops the bisection once hi/lo ≤ 1+Precision (default
	// 0.05).
	Precision float64
	// MinMultiplier and MaxMultiplier bound the request-rate multiplier
	// (defaults 1/64 and 64).
	MinMultiplier, MaxMultiplier float64
	// Parallel is how many policies are swept at once (default 2); each
	// policy's runs are sequential.
	Parallel int
	// Trace names the trace in the result.
	Trace string
	// Logger receives progress; nil discards.
	Logger *slog.Logger
}

// ErrBadOptions is wrapped by errors about Options or the inputs of Sweep.
var ErrBadOptions = errors.New("capacity: invalid options")

func (o *Options) fill() error {
	if o.Precision == 0 {
		o.Precision = DefaultPrecision
	}
	if o.MinMultiplier == 0 {
		o.MinMultiplier = DefaultMinMultiplier
	}
	if o.MaxMultiplier == 0 {
		o.MaxMultiplier = DefaultMaxMultiplier
	}
	if o.Parallel == 0 {
		o.Parallel = DefaultParallel
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.SLO <= 0:
		return fmt.Errorf("%w: SLO %v, want > 0", ErrBadOptions, o.SLO)
	case !(o.Precision > 0) || math.IsInf(o.Precision, 0):
		return fmt.Errorf("%w: precision %v, want > 0", ErrBadOptions, o.Precision)
	case !(o.MinMultiplier > 0) || !(o.MaxMultiplier >= o.MinMultiplier) || math.IsInf(o.MaxMultiplier, 0):
		return fmt.Errorf("%w: multipliers [%v, %v], want 0 < min <= max, finite", ErrBadOptions, o.MinMultiplier, o.MaxMultiplier)
	case o.Parallel < 1:
		return fmt.Errorf("%w: parallel %d, want >= 1", ErrBadOptions, o.Parallel)
	}
	return nil
}

// Point is one simulated run of a policy at a request-rate multiplier.
type Point struct {
	Multiplier float64 `json:"multiplier"`
	RateRPS    float64 `json:"rate_rps"` // the trace's mean request rate times Multiplier
	// TTFT quantiles of the completed requests (rejected ones have none).
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP90Ms float64 `json:"ttft_p90_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	HitRate   float64 `json:"hit_rate"`
	Rejected  int     `json:"rejected"`
	// MetSLO counts the requests whose TTFT was within the SLO; GoodputRPS
	// is that over the span of the arrivals at this rate.
	MetSLO     int     `json:"met_slo"`
	GoodputRPS float64 `json:"goodput_rps"`
	// Pass: the p90 TTFT over all requests, rejected ones counted as
	// never answered, is within the SLO.
	Pass bool `json:"pass"`
}

// Policy is one policy's capacity. The rate-dependent figures (hit rate,
// TTFT, goodput, max replica share) are those of the run at
// CapacityMultiplier, or, for a capacity of 0, of the run at the lowest
// multiplier tried.
type Policy struct {
	Name string `json:"name"`
	// CapacityMultiplier is the highest request-rate multiplier found to
	// pass (0: none down to the minimum); CapacityRPS is the request rate
	// it is.
	CapacityMultiplier float64 `json:"capacity_multiplier"`
	CapacityRPS        float64 `json:"capacity_rps"`
	GoodputRPS         float64 `json:"goodput_rps"`
	HitRate            float64 `json:"hit_rate"`
	ReuseCaptured      float64 `json:"reuse_captured"`
	ReuseVsPooled      float64 `json:"reuse_vs_pooled"`
	TTFTP50Ms          float64 `json:"ttft_p50_ms"`
	TTFTP90Ms          float64 `json:"ttft_p90_ms"`
	TTFTP99Ms          float64 `json:"ttft_p99_ms"`
	MaxReplicaShare    float64 `json:"max_replica_share"`
	Rejected           int     `json:"rejected"`
	// TTFTP90AtBestBaselineMs is the p90 TTFT (completed requests) of a run
	// at the best baseline's capacity multiplier; absent without one.
	TTFTP90AtBestBaselineMs *float64 `json:"ttft_p90_at_best_baseline_ms,omitempty"`
	// VsRoundRobin and VsBestBaseline are capacity ratios, absent when
	// that policy was not run or has no capacity.
	VsRoundRobin   *float64 `json:"vs_round_robin,omitempty"`
	VsBestBaseline *float64 `json:"vs_best_baseline,omitempty"`
	// Capped: the policy passed at MaxMultiplier, so its capacity is at
	// least that.
	Capped bool `json:"capped"`
	// Points are every run of the policy, by multiplier.
	Points []Point `json:"points"`
}

// Result is a sweep: the cluster, the trace and each policy's capacity.
// On disk it is a results envelope (internal/benchjson) with Tool "sweep".
type Result struct {
	Tool    string            `json:"-"`
	Command []string          `json:"-"`
	Machine benchjson.Machine `json:"-"`
	Started time.Time         `json:"-"`

	SLOMs         float64 `json:"slo_ms"`
	TTFTQuantile  float64 `json:"ttft_quantile"`
	Precision     float64 `json:"precision"`
	MinMultiplier float64 `json:"min_multiplier"`
	MaxMultiplier float64 `json:"max_multiplier"`
	Trace         string  `json:"trace"`
	// Requests and DurationSec describe the trace at its own rate
	// (multiplier 1); TraceRPS is Requests / DurationSec.
	Requests       int     `json:"requests"`
	DurationSec    float64 `json:"duration_sec"`
	TraceRPS       float64 `json:"trace_rps"`
	Replicas       int     `json:"replicas"`
	Profile        string  `json:"profile"`
	KVBlocks       int     `json:"kv_blocks"`
	BlockSize      int     `json:"block_size"`
	Seed           int64   `json:"seed"`
	KVToWorkingSet float64 `json:"kv_to_working_set"`
	IdealHitRate   float64 `json:"ideal_hit_rate"`
	PooledHitRate  float64 `json:"pooled_hit_rate"`
	// BestBaseline is the baseline (Baselines) with the highest capacity
	// among those run, empty if none was; BestBaselineMultiplier is its
	// capacity multiplier.
	BestBaseline           string  `json:"best_baseline"`
	BestBaselineMultiplier float64 `json:"best_baseline_multiplier"`
	// LowestP90AtBestBaseline is the policy with the lowest p90 TTFT at the
	// best baseline's capacity.
	LowestP90AtBestBaseline string   `json:"lowest_p90_at_best_baseline"`
	Policies                []Policy `json:"policies"`
}

// Policy returns the named policy's entry.
func (r *Result) Policy(name string) (*Policy, bool) {
	for i := range r.Policies {
		if r.Policies[i].Name == name {
			return &r.Policies[i], true
		}
	}
	return nil, false
}

// run is one evaluated point with the figures only the summary needs.
type run struct {
	pt            Point
	reuseCaptured float64
	maxShare      float64
}

// sweeper holds what every run of a sweep shares.
type sweeper struct {
	recs    []workload.Record
	ideal   []int
	base    sim.Config
	opts    Options
	spanSec float64 // arrivals' span at multiplier 1
	rps     float64 // trace rate at multiplier 1
	pooled  float64
}

// Sweep finds each policy's capacity: the highest request-rate multiplier
// of recs (in arrival order; ideal is workload.IdealHits of them) at which
// the p90 TTFT is within opts.SLO, on the cluster of base (whose Policy,
// TimeScale and Observe it sets per run). The result is deterministic for
// base.Seed.
func Sweep(ctx context.Context, recs []workload.Record, ideal []int, base sim.Config, policies []string, opts Options) (*Result, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	switch {
	case len(recs) < 2:
		return nil, fmt.Errorf("%w: %d records, want >= 2", ErrBadOptions, len(recs))
	case len(policies) == 0:
		return nil, fmt.Errorf("%w: no policies", ErrBadOptions)
	case base.Impl != nil:
		return nil, fmt.Errorf("%w: base config has a policy instance; the sweep makes one per run", ErrBadOptions)
	}
	if base.TraceBlockSize == 0 {
		base.TraceBlockSize = workload.DefaultBlockSize
	}
	if base.BlockSize == 0 {
		base.BlockSize = simengine.DefaultBlockSize
	}
	span := (recs[len(recs)-1].Timestamp - recs[0].Timestamp) / 1000
	if !(span > 0) {
		return nil, fmt.Errorf("%w: the trace's arrivals span no time", ErrBadOptions)
	}
	rep := report.ForTrace("sweep", opts.Trace, recs, ideal, base.TraceBlockSize, base.BlockSize, base.Replicas, base.Profile.Name, base.KVBlocks, 1)
	s := &sweeper{recs: recs, ideal: ideal, base: base, opts: opts, spanSec: span,
		rps: float64(len(recs)) / span, pooled: rep.PooledHitRate}
	res := &Result{
		Tool: "sweep", Machine: benchjson.ThisMachine(), Started: time.Now().UTC().Truncate(time.Second),
		SLOMs: ms(opts.SLO), TTFTQuantile: Quantile, Precision: opts.Precision,
		MinMultiplier: opts.MinMultiplier, MaxMultiplier: opts.MaxMultiplier, Trace: opts.Trace,
		Requests: len(recs), DurationSec: span, TraceRPS: s.rps, Replicas: base.Replicas, Profile: base.Profile.Name,
		KVBlocks: base.KVBlocks, BlockSize: base.BlockSize, Seed: base.Seed, KVToWorkingSet: rep.KVToWorkingSet,
		IdealHitRate: rep.TraceStats.IdealHitRate, PooledHitRate: rep.PooledHitRate,
		Policies: make([]Policy, len(policies)),
	}
	caches := make([]map[float64]run, len(policies))
	if err := parallel(len(policies), opts.Parallel, func(i int) error {
		caches[i] = make(map[float64]run)
		p, err := s.capacity(ctx, policies[i], caches[i])
		res.Policies[i] = p
		return err
	}); err != nil {
		return nil, err
	}
	s.compare(res)
	if res.BestBaselineMultiplier > 0 {
		m := res.BestBaselineMultiplier
		if err := parallel(len(policies), opts.Parallel, func(i int) error {
			r, err := s.point(ctx, policies[i], m, caches[i])
			if err != nil {
				return err
			}
			v := r.pt.TTFTP90Ms
			res.Policies[i].TTFTP90AtBestBaselineMs = &v
			return nil
		}); err != nil {
			return nil, err
		}
		lowest := math.Inf(1)
		for _, p := range res.Policies {
			if v := *p.TTFTP90AtBestBaselineMs; v < lowest {
				lowest, res.LowestP90AtBestBaseline = v, p.Name
			}
		}
	}
	for i := range res.Policies {
		res.Policies[i].Points = sortedPoints(caches[i])
	}
	return res, nil
}

// parallel runs f(0..n-1), at most width at once, and joins their errors.
func parallel(n, width int, f func(int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// capacity brackets and bisects one policy's capacity.
func (s *sweeper) capacity(ctx context.Context, name string, cache map[float64]run) (Policy, error) {
	o := &s.opts
	eval := func(m float64) (bool, error) {
		r, err := s.point(ctx, name, m, cache)
		return r.pt.Pass, err
	}
	start := min(max(1, o.MinMultiplier), o.MaxMultiplier)
	pass, err := eval(start)
	if err != nil {
		return Policy{}, err
	}
	var lo, hi float64 // lo passes, hi fails (0: not found yet)
	capped, none := false, false
	if pass {
		lo = start
		for hi == 0 {
			if lo >= o.MaxMultiplier {
				capped = true
				break
			}
			m := min(lo*2, o.MaxMultiplier)
			if pass, err = eval(m); err != nil {
				return Policy{}, err
			}
			if pass {
				lo = m
			} else {
				hi = m
			}
		}
	} else {
		hi = start
		for lo == 0 {
			if hi <= o.MinMultiplier {
				none = true
				break
			}
			m := max(hi/2, o.MinMultiplier)
			if pass, err = eval(m); err != nil {
				return Policy{}, err
			}
			if pass {
				lo = m
			} else {
				hi = m
			}
		}
	}
	if !capped && !none {
		for hi/lo > 1+o.Precision {
			m := math.Sqrt(lo * hi)
			if pass, err = eval(m); err != nil {
				return Policy{}, err
			}
			if pass {
				lo = m
			} else {
				hi = m
			}
		}
	}
	p := Policy{Name: name, Capped: capped}
	at := o.MinMultiplier
	if !none {
		p.CapacityMultiplier, p.CapacityRPS = lo, lo*s.rps
		at = lo
	}
	r := cache[at]
	p.GoodputRPS, p.HitRate, p.ReuseCaptured = r.pt.GoodputRPS, r.pt.HitRate, r.reuseCaptured
	p.ReuseVsPooled = ratio(r.pt.HitRate, s.pooled)
	p.TTFTP50Ms, p.TTFTP90Ms, p.TTFTP99Ms = r.pt.TTFTP50Ms, r.pt.TTFTP90Ms, r.pt.TTFTP99Ms
	p.MaxReplicaShare, p.Rejected = r.maxShare, r.pt.Rejected
	o.Logger.Info("capacity", "policy", name, "multiplier", fmt.Sprintf("%.3f", p.CapacityMultiplier),
		"rps", fmt.Sprintf("%.3f", p.CapacityRPS), "capped", capped, "runs", len(cache))
	return p, nil
}

// never stands for the TTFT of a rejected request.
const never = 1e300

// point runs name at multiplier m, or returns the earlier run there.
func (s *sweeper) point(ctx context.Context, name string, m float64, cache map[float64]run) (run, error) {
	if r, ok := cache[m]; ok {
		return r, nil
	}
	cfg := s.base
	cfg.Policy, cfg.TimeScale = name, 1/m
	var ttft []float64
	cfg.Observe = func(samples []report.Sample) {
		ttft = make([]float64, len(samples))
		for i, x := range samples {
			ttft[i] = never
			if !x.Rejected {
				ttft[i] = ms(x.FirstToken - x.Arrival)
			}
		}
	}
	p, err := sim.Run(ctx, s.recs, s.ideal, cfg)
	if err != nil {
		return run{}, fmt.Errorf("capacity: %s at %.4gx: %w", name, m, err)
	}
	slices.Sort(ttft)
	slo := ms(s.opts.SLO)
	met, _ := slices.BinarySearch(ttft, math.Nextafter(slo, math.Inf(1)))
	r := run{
		pt: Point{
			Multiplier: m, RateRPS: m * s.rps, TTFTP50Ms: p.TTFTP50Ms, TTFTP90Ms: p.TTFTP90Ms, TTFTP99Ms: p.TTFTP99Ms,
			HitRate: p.HitRate, Rejected: p.Rejected, MetSLO: met, GoodputRPS: float64(met) / (s.spanSec / m),
			Pass: len(ttft) > 0 && report.Quantile(ttft, Quantile) <= slo,
		},
		reuseCaptured: p.ReuseCaptured, maxShare: p.MaxReplicaShare,
	}
	cache[m] = r
	s.opts.Logger.Info("point", "policy", name, "multiplier", fmt.Sprintf("%.4g", m), "ttft_p90_s",
		fmt.Sprintf("%.2f", p.TTFTP90Ms/1000), "rejected", p.Rejected, "pass", r.pt.Pass, "wall_s", fmt.Sprintf("%.1f", p.WallSec))
	return r, nil
}

// compare picks the best baseline and fills the capacity ratios.
func (s *sweeper) compare(res *Result) {
	var best *Policy
	for _, b := range Baselines {
		if p, ok := res.Policy(b); ok && (best == nil || p.CapacityMultiplier > best.CapacityMultiplier) {
			best = p
		}
	}
	if best != nil {
		res.BestBaseline, res.BestBaselineMultiplier = best.Name, best.CapacityMultiplier
	}
	rr, hasRR := res.Policy(RoundRobin)
	for i := range res.Policies {
		p := &res.Policies[i]
		if hasRR && rr.CapacityMultiplier > 0 {
			v := p.CapacityMultiplier / rr.CapacityMultiplier
			p.VsRoundRobin = &v
		}
		if best != nil && best.CapacityMultiplier > 0 {
			v := p.CapacityMultiplier / best.CapacityMultiplier
			p.VsBestBaseline = &v
		}
	}
}

func sortedPoints(cache map[float64]run) []Point {
	out := make([]Point, 0, len(cache))
	for _, r := range cache {
		out = append(out, r.pt)
	}
	slices.SortFunc(out, func(a, b Point) int { return cmp.Compare(a.Multiplier, b.Multiplier) })
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
