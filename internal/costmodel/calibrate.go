package costmodel

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// Defaults of [CalibratorConfig].
const (
	DefaultCalibHalfLife    = 256  // observations
	DefaultCalibPriorWeight = 0.01 // observations' worth of evidence per coefficient
	DefaultCalibHuberK      = 0.25 // relative residual
	DefaultCalibTieWeight   = 1    // observations' worth of evidence
	DefaultCalibChunkTokens = 2048 // engine prefill chunk (tokens per step)
)

// Observation is one request's prefill as measured.
//
// Millis is the time from the request reaching an engine with nothing queued
// ahead of it to its first token (or the engine's own prefill time). If the
// engine was running decodes at the time (DecodeSeqs > 0), they are part of
// it: half a decode step (the step in progress when the request arrived, on
// average) plus the decodes' extra in each chunk of the prefill; the
// calibrator fits their cost along with the prefill's.
type Observation struct {
	NewTokens     int     // prompt tokens computed (prompt minus cached)
	PrefixTokens  int     // prompt tokens served from the prefix cache
	Millis        float64 // measured prefill time, ms
	DecodeSeqs    int     // sequences decoding alongside (0: none or unknown)
	DecodeContext int     // their total context tokens
}

// CalibratorConfig configures a [Calibrator]. Zero values select defaults.
type CalibratorConfig struct {
	// HalfLife is the forgetting half-life in observations: an observation
	// counts half as much as the newest one HalfLife observations later
	// (default DefaultCalibHalfLife).
	HalfLife int
	// Window is how many recent observations the fit keeps (default
	// 4·HalfLife, where the oldest counts 1/16).
	Window int
	// PriorWeight is the ridge prior's strength, in observations' worth of
	// evidence per coefficient (default DefaultCalibPriorWeight: a weak
	// prior that the first few observations override but that still decides
	// the directions the traffic leaves open).
	PriorWeight float64
	// TieWeight is the strength, in observations' worth of evidence, of the
	// prior that ties the decode corrections to the prefill's: the decode
	// floor's to the per-token cost's (both scale with the model's weights)
	// and the decodes' extra to the prefix cost's (both read the KV cache)
	// (default DefaultCalibTieWeight; negative: no tie).
	TieWeight float64
	// HuberK is the relative residual beyond which an observation counts
	// less than squared: linearly below the fit, falling off above it
	// (default DefaultCalibHuberK).
	HuberK float64
	// ChunkTokens is the engine's prefill chunk, for the decode interference
	// in observations (default DefaultCalibChunkTokens).
	ChunkTokens int
	// Decode makes Profile's decode model the fitted one too; by default
	// the decode corrections only keep the decodes' cost out of the
	// prefill's, and Profile keeps the prior's decode model (see Calibrator).
	Decode bool
}

// calTerms is the number of fitted corrections: the four prefill terms,
// the decode floor and the decodes' extra.
const calTerms = 6

// calObs is one kept observation: the prior's terms of its time and the
// measured time.
type calObs struct {
	x   [calTerms]float64
	y   float64
	seq uint64
}

// Calibrator fits a [Profile] online to measured prefills: it starts from a
// prior profile (a built-in one or a file) and, observation by observation,
// fits the four prefill coefficients to what the engines really take. It is
// safe for concurrent use; [Calibrator.Profile] takes no lock.
//
// Each coefficient is the prior's times a correction θ ≥ 0, so that
//
//	prefill_ms(new, prefix) = θa·A + θb·B·new + θc·C·new·(prefix+new/2) + θd·D·prefix
//
// with A..D the prior's: the four terms, which differ by six orders of
// magnitude as coefficients, are comparable as corrections. θ minimises
//
//	Σ_i w_i · ρ((y_i − ŷ_i) / ŷ_i)  +  PriorWeight · Σ_k ((θ_k − 1) / θ_k)²
//
// over the last Window observations: relative residuals (a 10 % miss on a
// 60 ms prefill counts as much as on a 6 s one), a ridge prior centred on the
// prior profile (it decides the directions the traffic does not tell apart,
// e.g. a workload of one shape) and relative to the correction, so that 9x
// and 1/9 are equally far from the prior, and weights that halve every HalfLife
// observations (exponential forgetting: the fit follows a change of speed,
// a new driver or a throttled card: a 1.6x and a 3x slow-down were within
// 10 % after 1.7 and 2.1 half-lives, a 2x speed-up after one).
// ρ is robust: a residual beyond HuberK below the fit counts linearly
// (Huber), and above it with a weight falling as its square, because an
// observation is far more often slowed by work the router did not see (a
// stall, a request that arrived during its prefill and shared its steps)
// than sped up; one 10x outlier moves the fit by under 0.2 %. The
// problem is solved by
// iteratively reweighted least squares, warm started from the previous fit,
// with the non-negativity of θ enforced exactly (a six-variable quadratic
// programme, solved over its 64 faces).
//
// An observation taken while the engine was decoding (see [Observation])
// also holds the decodes riding along: half a decode step for the step in
// progress when the request arrived, and the decodes' extra in every chunk
// of its prefill. Two more corrections, of the decode floor (θf) and of the
// decodes' extra (θx, PerSeq and PerToken), fit that share the same way,
//
//	ms = prefill_ms(new, prefix) + θf·Floor/2 + θx·(steps + 1/2)·Extra(batch, context)
//
// and, with Decode set, scale the profile's decode model (the floor never
// below 1 % of the prior's, which keeps it valid). Without them, a prior whose decodes are
// cheaper than the engines' leaves the difference to the prefill terms, and
// on busy agent traffic the fitted prefill came out 27 % off (kvbench sim,
// 8 replicas of llama3-70b from a llama3-8b prior). Early traffic tells the
// decode floor (a constant whenever the engine decodes) poorly from the
// prefix term (agent turns with a prefix come while sessions decode), so a
// second prior, of strength TieWeight, ties θf to θb (both scale with the
// model's weights) and θx to θd (both read the KV cache): from llama3-8b to
// llama3-70b θb is 9.5 and θf 7.2, θd 2.2 and θx 2.4 to 4.7. On the same
// simulated traffic, without it the error two minutes in reached 57 % on
// one of three seeds. The second tie is weaker (a tenth): the decodes'
// context per sequence is an estimate, which the extra's correction
// absorbs.
//
// Decode is off by default: the fitted decode model absorbs the assumed
// context per sequence of the observations (4,096 tokens, the kvdir
// policy's assumption; agent sessions run longer), so it is not the
// engines' decode model, and handed to the kvdir policy it placed no
// better in simulation (agent sessions, 8 x llama3-70b, the true profile
// as the prior, three seeds: p90 time to first token the same at the
// trace's rate, and 17.8 s mean with it or without it at twice the rate).
type Calibrator struct {
	prior Profile
	cfg   CalibratorConfig
	cur   atomic.Pointer[Profile]

	mu       sync.Mutex
	ring     []calObs
	next     int // ring write position
	seq      uint64
	theta    [calTerms]float64
	age      []float64 // fit's scratch: the observations' forgetting weights
	accepted atomic.Uint64
	rejected atomic.Uint64
}

// NewCalibrator returns a calibrator whose estimate is prior until the first
// observation.
func NewCalibrator(prior Profile, cfg CalibratorConfig) (*Calibrator, error) {
	if err := prior.Validate(); err != nil {
		return nil, fmt.Errorf("costmodel: calibrator prior: %w", err)
	}
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = DefaultCalibHalfLife
	}
	if cfg.Window <= 0 {
		cfg.Window = 4 * cfg.HalfLife
	}
	if !(cfg.PriorWeight > 0) || math.IsInf(cfg.PriorWeight, 0) {
		cfg.PriorWeight = DefaultCalibPriorWeight
	}
	if cfg.TieWeight == 0 || math.IsNaN(cfg.TieWeight) || math.IsInf(cfg.TieWeight, 0) {
		cfg.TieWeight = DefaultCalibTieWeight
	}
	if !(cfg.HuberK > 0) || math.IsInf(cfg.HuberK, 0) {
		cfg.HuberK = DefaultCalibHuberK
	}
	if cfg.ChunkTokens <= 0 {
		cfg.ChunkTokens = DefaultCalibChunkTokens
	}
	c := &Calibrator{prior: prior, cfg: cfg}
	for i := range c.theta {
		c.theta[i] = 1
	}
	p := prior
	c.cur.Store(&p)
	return c, nil
}

// Profile returns the current estimate: the prior with fitted prefill
// coefficients, named after the prior with "+calibrated" once an
// observation has been accepted. It always passes [Profile.Validate].
func (c *Calibrator) Profile() Profile { return *c.cur.Load() }

// Prior returns the profile the calibrator started from.
func (c *Calibrator) Prior() Profile { return c.prior }

// CalibratorStats are a calibrator's counters and current corrections.
type CalibratorStats struct {
	Accepted uint64 // observations fitted
	Rejected uint64 // observations refused (malformed)
	// Scales are the fitted corrections (1: the prior's) of the prefill's
	// A, B, C and D, the decode floor and the decodes' extra.
	Scales [calTerms]float64
}

// Stats returns the calibrator's counters and corrections.
func (c *Calibrator) Stats() CalibratorStats {
	c.mu.Lock()
	th := c.theta
	c.mu.Unlock()
	return CalibratorStats{Accepted: c.accepted.Load(), Rejected: c.rejected.Load(), Scales: th}
}

// errObservation is returned by Observe for an observation it cannot use.
var errObservation = errors.New("costmodel: unusable observation")

// Observe adds one measured prefill and refits. It returns an error, and
// changes nothing, for an observation it cannot use: no new tokens,
// negative counts, or a non-finite or non-positive time.
func (c *Calibrator) Observe(o Observation) error {
	if err := checkObservation(o); err != nil {
		c.rejected.Add(1)
		return err
	}
	n, p := float64(o.NewTokens), float64(o.PrefixTokens)
	pr, d := c.prior.Prefill, c.prior.Decode
	ob := calObs{x: [calTerms]float64{pr.A, pr.B * n, pr.C * n * (p + n/2), pr.D * p}, y: o.Millis}
	if o.DecodeSeqs > 0 {
		steps := (o.NewTokens + c.cfg.ChunkTokens - 1) / c.cfg.ChunkTokens
		ob.x[4] = d.Floor / 2
		ob.x[5] = (float64(steps) + 0.5) * d.Extra(o.DecodeSeqs, o.DecodeContext)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	ob.seq = c.seq
	if len(c.ring) < c.cfg.Window {
		c.ring = append(c.ring, ob)
	} else {
		c.ring[c.next] = ob
		c.next = (c.next + 1) % c.cfg.Window
	}
	c.accepted.Add(1)
	c.theta = c.fit(c.theta)
	prof := c.prior
	prof.Name = c.prior.Name + "+calibrated"
	th := &c.theta
	prof.Prefill = PrefillModel{A: pr.A * th[0], B: pr.B * th[1], C: pr.C * th[2], D: pr.D * th[3]}
	if c.cfg.Decode {
		prof.Decode = DecodeModel{Floor: d.Floor * max(th[4], 0.01), PerSeq: d.PerSeq * th[5], PerToken: d.PerToken * th[5]}
	}
	if prof.Validate() == nil {
		c.cur.Store(&prof)
	}
	return nil
}

// checkObservation reports whether o is usable.
func checkObservation(o Observation) error {
	switch {
	case o.NewTokens < 1 || o.PrefixTokens < 0 || o.DecodeSeqs < 0 || o.DecodeContext < 0:
		return fmt.Errorf("%w: %d new, %d prefix tokens, %d decodes", errObservation, o.NewTokens, o.PrefixTokens, o.DecodeSeqs)
	case !(o.Millis > 0) || math.IsInf(o.Millis, 0):
		return fmt.Errorf("%w: %v ms", errObservation, o.Millis)
	}
	return nil
}

// calTies are the ties between corrections: θ[a] is drawn to θ[b] with
// weight times the TieWeight.
var calTies = []struct {
	a, b   int
	weight float64
}{
	{4, 1, 1},   // decode floor to per-token prefill: the model's weights
	{5, 3, 0.1}, // decodes' extra to the prefix term: KV reads
}

// Fit parameters: IRLS iterations per observation (each fit starts from the
// previous one, so the iterations add up over observations; three keep an
// observation at about 80 µs with a full window of 1,024) and their
// convergence threshold.
const (
	calibMaxIter = 3
	calibTol     = 1e-4
)

// fit runs IRLS from theta over the kept observations. The caller holds mu.
func (c *Calibrator) fit(theta [calTerms]float64) [calTerms]float64 {
	lambda, k := c.cfg.PriorWeight, c.cfg.HuberK
	ln2h := math.Ln2 / float64(c.cfg.HalfLife)
	if cap(c.age) < len(c.ring) {
		c.age = make([]float64, len(c.ring), c.cfg.Window)
	}
	age := c.age[:len(c.ring)]
	for j := range c.ring {
		age[j] = math.Exp(-ln2h * float64(c.seq-c.ring[j].seq))
	}
	for range calibMaxIter {
		var m [calTerms][calTerms]float64
		var v [calTerms]float64
		for i := range calTerms {
			// The prior on θ−1 relative to the current θ: a correction by
			// 9x is as plausible as one by 1/9.
			l := lambda / math.Pow(max(theta[i], 0.1), 2)
			m[i][i] = l
			v[i] = l
		}
		if tie := c.cfg.TieWeight; tie > 0 {
			for _, t := range calTies {
				a, b := t.a, t.b
				l := t.weight * tie / math.Pow(max(theta[b], 0.1), 2)
				m[a][a] += l
				m[b][b] += l
				m[a][b] -= l
				m[b][a] -= l
			}
		}
		for j := range c.ring {
			o := &c.ring[j]
			yhat := 0.0
			for a := range calTerms {
				yhat += theta[a] * o.x[a]
			}
			if !(yhat > 1e-9) {
				yhat = 1e-9
			}
			w := age[j] / (yhat * yhat)
			switch r := o.y/yhat - 1; {
			case r > k:
				w *= k * k / (r * r)
			case r < -k:
				w *= -k / r
			}
			for a := range calTerms {
				if o.x[a] == 0 {
					continue
				}
				wa := w * o.x[a]
				v[a] += wa * o.y
				for b := a; b < calTerms; b++ {
					m[a][b] += wa * o.x[b]
				}
			}
		}
		for a := range calTerms {
			for b := range a {
				m[a][b] = m[b][a]
			}
		}
		next, ok := nnqp(&m, &v)
		if !ok {
			return theta
		}
		delta := 0.0
		for i := range calTerms {
			delta = max(delta, math.Abs(next[i]-theta[i])/max(math.Abs(theta[i]), 1e-3))
		}
		theta = next
		if delta < calibTol {
			break
		}
	}
	return theta
}

// nnqp minimises θᵀMθ − 2vᵀθ over θ ≥ 0 for a symmetric positive definite
// M, by solving the unconstrained problem on each face of the orthant and
// keeping the best feasible solution.
func nnqp(m *[calTerms][calTerms]float64, v *[calTerms]float64) ([calTerms]float64, bool) {
	var best [calTerms]float64
	bestObj, found := math.Inf(1), false
	var buf [calTerms]int
	// The full face first: an interior optimum is the optimum.
	for mask := 1<<calTerms - 1; mask > 0; mask-- {
		idx := buf[:0]
		for i := range calTerms {
			if mask&(1<<i) != 0 {
				idx = append(idx, i)
			}
		}
		sol, ok := solveSub(m, v, idx)
		if !ok {
			continue
		}
		var th [calTerms]float64
		feasible := true
		for j, i := range idx {
			if sol[j] < 0 || math.IsNaN(sol[j]) {
				feasible = false
				break
			}
			th[i] = sol[j]
		}
		if !feasible {
			continue
		}
		// At the face's optimum θᵀMθ = vᵀθ, so the objective is −vᵀθ.
		obj := 0.0
		for i := range calTerms {
			obj -= v[i] * th[i]
		}
		if obj < bestObj {
			best, bestObj, found = th, obj, true
		}
		if mask == 1<<calTerms-1 {
			break
		}
	}
	return best, found
}

// solveSub solves M[idx,idx]·x = v[idx] by Gaussian elimination with
// partial pivoting.
func solveSub(m *[calTerms][calTerms]float64, v *[calTerms]float64, idx []int) ([calTerms]float64, bool) {
	n := len(idx)
	var a [calTerms][calTerms + 1]float64
	for r, i := range idx {
		for s, j := range idx {
			a[r][s] = m[i][j]
		}
		a[r][n] = v[i]
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if a[piv][col] == 0 {
			return [calTerms]float64{}, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := col + 1; r < n; r++ {
			f := a[r][col] / a[col][col]
			for s := col; s <= n; s++ {
				a[r][s] -= f * a[col][s]
			}
		}
	}
	var x [calTerms]float64
	for r := n - 1; r >= 0; r-- {
		s := a[r][n]
		for j := r + 1; j < n; j++ {
			s -= a[r][j] * x[j]
		}
		x[r] = s / a[r][r]
	}
	return x, true
}

// Shape is one prefill shape of [ShapeGrid].
type Shape struct{ New, Prefix int }

// ShapeGrid returns the prefill shapes calibration accuracy is judged on:
// new ∈ {256, 2k, 8k, 32k} × prefix ∈ {0, 8k, 32k} tokens.
func ShapeGrid() []Shape {
	var out []Shape
	for _, n := range []int{256, 2048, 8192, 32768} {
		for _, p := range []int{0, 8192, 32768} {
			out = append(out, Shape{n, p})
		}
	}
	return out
}

// PrefillError returns the largest and the mean relative error of got's
// prefill time against want's over [ShapeGrid].
func PrefillError(got, want Profile) (maxRel, meanRel float64) {
	g := ShapeGrid()
	for _, s := range g {
		w := want.Prefill.Millis(s.New, s.Prefix)
		e := math.Abs(got.Prefill.Millis(s.New, s.Prefix)-w) / w
		maxRel = max(maxRel, e)
		meanRel += e
	}
	return maxRel, meanRel / float64(len(g))
}
