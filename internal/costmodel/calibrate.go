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
	DefaultCalibChunkTokens = 2048 // engine prefill chunk (tokens per step)
)

// Observation is one request's prefill as measured.
//
// Millis is the time from the request reaching an engine with nothing queued
// ahead of it to its first token (or the engine's own prefill time). If the
// engine was running decodes at the time (DecodeSeqs > 0), the calibrator
// subtracts what they cost per the prior's decode model: half a decode step
// (the step in progress when the request arrived, on average) plus the
// decodes' extra in each chunk of the prefill.
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
	// HuberK is the relative residual beyond which an observation counts
	// linearly rather than squared (default DefaultCalibHuberK).
	HuberK float64
	// ChunkTokens is the engine's prefill chunk, for the decode interference
	// subtracted from observations (default DefaultCalibChunkTokens).
	ChunkTokens int
}

// calObs is one kept observation: the prior's four prefill terms and the
// measured prefill without decode interference.
type calObs struct {
	x   [4]float64
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
//	Σ_i w_i · huber((y_i − ŷ_i) / ŷ_i)  +  PriorWeight · Σ_k (θ_k − 1)²
//
// over the last Window observations: relative residuals (a 10 % miss on a
// 60 ms prefill counts as much as on a 6 s one), a ridge prior centred on the
// prior profile (it decides the directions the traffic does not tell apart,
// e.g. a workload of one shape), and weights that halve every HalfLife
// observations (exponential forgetting: the fit follows a change of speed,
// a new driver or a throttled card; a 1.6x slow-down is within 10 % after
// about 3.5 half-lives, the Huber weights slowing the first ones).
// Residuals beyond HuberK (relative) count linearly, not squared, so one
// outlier, such as a request that waited behind a stall the router did not
// see, moves the fit by at most HuberK's worth. The problem is solved by
// iteratively reweighted least squares, warm started from the previous fit,
// with the non-negativity of θ enforced exactly (a four-variable quadratic
// programme, solved over its 16 faces).
//
// Only the prefill is fitted; the decode model stays the prior's (it prices
// the decode interference subtracted from each observation, see
// [Observation]).
type Calibrator struct {
	prior Profile
	cfg   CalibratorConfig
	cur   atomic.Pointer[Profile]

	mu       sync.Mutex
	ring     []calObs
	next     int // ring write position
	seq      uint64
	theta    [4]float64
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
	if !(cfg.HuberK > 0) || math.IsInf(cfg.HuberK, 0) {
		cfg.HuberK = DefaultCalibHuberK
	}
	if cfg.ChunkTokens <= 0 {
		cfg.ChunkTokens = DefaultCalibChunkTokens
	}
	c := &Calibrator{prior: prior, cfg: cfg, theta: [4]float64{1, 1, 1, 1}}
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
	Accepted uint64     // observations fitted
	Rejected uint64     // observations refused (malformed, or all decode interference)
	Scales   [4]float64 // fitted corrections of A, B, C, D (1: the prior's)
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
// negative counts, a non-finite or non-positive time, or a time no larger
// than the modelled decode interference.
func (c *Calibrator) Observe(o Observation) error {
	y, err := c.clean(o)
	if err != nil {
		c.rejected.Add(1)
		return err
	}
	n, p := float64(o.NewTokens), float64(o.PrefixTokens)
	pr := c.prior.Prefill
	ob := calObs{x: [4]float64{pr.A, pr.B * n, pr.C * n * (p + n/2), pr.D * p}, y: y}

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
	prof.Prefill = PrefillModel{A: pr.A * c.theta[0], B: pr.B * c.theta[1], C: pr.C * c.theta[2], D: pr.D * c.theta[3]}
	if prof.Validate() == nil {
		c.cur.Store(&prof)
	}
	return nil
}

// clean returns o's prefill time without the modelled decode interference.
func (c *Calibrator) clean(o Observation) (float64, error) {
	switch {
	case o.NewTokens < 1 || o.PrefixTokens < 0 || o.DecodeSeqs < 0 || o.DecodeContext < 0:
		return 0, fmt.Errorf("%w: %d new, %d prefix tokens, %d decodes", errObservation, o.NewTokens, o.PrefixTokens, o.DecodeSeqs)
	case !(o.Millis > 0) || math.IsInf(o.Millis, 0):
		return 0, fmt.Errorf("%w: %v ms", errObservation, o.Millis)
	}
	y := o.Millis
	if o.DecodeSeqs > 0 {
		d := c.prior.Decode
		steps := (o.NewTokens + c.cfg.ChunkTokens - 1) / c.cfg.ChunkTokens
		y -= 0.5*d.Millis(o.DecodeSeqs, o.DecodeContext) + float64(steps)*d.Extra(o.DecodeSeqs, o.DecodeContext)
	}
	if !(y > 0) {
		return 0, fmt.Errorf("%w: %v ms is all decode interference", errObservation, o.Millis)
	}
	return y, nil
}

// Fit parameters: IRLS iterations and their convergence threshold.
const (
	calibMaxIter = 20
	calibTol     = 1e-6
)

// fit runs IRLS from theta over the kept observations. The caller holds mu.
func (c *Calibrator) fit(theta [4]float64) [4]float64 {
	lambda, k := c.cfg.PriorWeight, c.cfg.HuberK
	ln2h := math.Ln2 / float64(c.cfg.HalfLife)
	for range calibMaxIter {
		var m [4][4]float64
		var v [4]float64
		for i := range 4 {
			m[i][i] = lambda
			v[i] = lambda
		}
		for j := range c.ring {
			o := &c.ring[j]
			yhat := theta[0]*o.x[0] + theta[1]*o.x[1] + theta[2]*o.x[2] + theta[3]*o.x[3]
			if !(yhat > 1e-9) {
				yhat = 1e-9
			}
			w := math.Exp(-ln2h*float64(c.seq-o.seq)) / (yhat * yhat)
			if r := math.Abs(o.y/yhat - 1); r > k {
				w *= k / r
			}
			for a := range 4 {
				wa := w * o.x[a]
				v[a] += wa * o.y
				for b := a; b < 4; b++ {
					m[a][b] += wa * o.x[b]
				}
			}
		}
		for a := range 4 {
			for b := range a {
				m[a][b] = m[b][a]
			}
		}
		next, ok := nnqp(&m, &v)
		if !ok {
			return theta
		}
		delta := 0.0
		for i := range 4 {
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
// M, by solving the unconstrained problem on each of the 16 faces of the
// orthant and keeping the best feasible solution.
func nnqp(m *[4][4]float64, v *[4]float64) ([4]float64, bool) {
	var best [4]float64
	bestObj, found := math.Inf(1), false
	for mask := 1; mask < 16; mask++ {
		var idx []int
		for i := range 4 {
			if mask&(1<<i) != 0 {
				idx = append(idx, i)
			}
		}
		sol, ok := solveSub(m, v, idx)
		if !ok {
			continue
		}
		var th [4]float64
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
		for i := range 4 {
			obj -= v[i] * th[i]
		}
		if obj < bestObj {
			best, bestObj, found = th, obj, true
		}
	}
	return best, found
}

// solveSub solves M[idx,idx]·x = v[idx] by Gaussian elimination with
// partial pivoting.
func solveSub(m *[4][4]float64, v *[4]float64, idx []int) ([]float64, bool) {
	n := len(idx)
	var a [4][5]float64
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
			return nil, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := col + 1; r < n; r++ {
			f := a[r][col] / a[col][col]
			for s := col; s <= n; s++ {
				a[r][s] -= f * a[col][s]
			}
		}
	}
	x := make([]float64, n)
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
