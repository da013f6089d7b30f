package costmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
)

// calibShape draws a request shape spread like mixed chat and agent
// traffic: new tokens log-uniform in [64, 32k], a cached prefix (log-uniform
// up to 64k) two times in three.
func calibShape(rng *rand.Rand) (newTok, prefix int) {
	newTok = int(math.Exp(math.Log(64) + rng.Float64()*math.Log(32768.0/64)))
	if rng.IntN(3) > 0 {
		prefix = int(math.Exp(math.Log(256) + rng.Float64()*math.Log(65536.0/256)))
	}
	return newTok, prefix
}

// measure returns truth's prefill for the shape with multiplicative noise
// (relative standard deviation sd).
func measure(rng *rand.Rand, truth Profile, newTok, prefix int, sd float64) float64 {
	return truth.Prefill.Millis(newTok, prefix) * math.Exp(sd*rng.NormFloat64())
}

func newTestCalibrator(t *testing.T, prior string, cfg CalibratorConfig) *Calibrator {
	t.Helper()
	c, err := NewCalibrator(mustProfile(t, prior), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// observeUntil feeds c noisy observations of truth until its grid error is
// at most limit, and returns how many it took (or max+1).
func observeUntil(t *testing.T, c *Calibrator, rng *rand.Rand, truth Profile, limit float64, maxN int) int {
	t.Helper()
	for n := 1; n <= maxN; n++ {
		nt, p := calibShape(rng)
		if err := c.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05)}); err != nil {
			t.Fatal(err)
		}
		if err := c.Profile().Validate(); err != nil {
			t.Fatalf("after %d observations: %v", n, err)
		}
		if worst, _ := PrefillError(c.Profile(), truth); worst <= limit {
			return n
		}
	}
	return maxN + 1
}

func TestCalibratorStartsAtPrior(t *testing.T) {
	c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{})
	if got, want := c.Profile(), mustProfile(t, "llama3-8b"); !reflect.DeepEqual(got, want) {
		t.Fatalf("Profile() before any observation = %+v, want the prior %+v", got, want)
	}
	if err := c.Observe(Observation{NewTokens: 0, Millis: 5}); err == nil {
		t.Fatal("observation of 0 new tokens accepted")
	}
	for _, ms := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if err := c.Observe(Observation{NewTokens: 100, Millis: ms}); err == nil {
			t.Fatalf("observation of %v ms accepted", ms)
		}
	}
	if err := c.Observe(Observation{NewTokens: 100, Millis: 1, DecodeSeqs: -1}); err == nil {
		t.Fatal("observation with a negative decode batch accepted")
	}
	if got, want := c.Profile(), mustProfile(t, "llama3-8b"); !reflect.DeepEqual(got, want) {
		t.Fatalf("rejected observations moved the profile to %+v", got)
	}
	if st := c.Stats(); st.Accepted != 0 || st.Rejected != 6 {
		t.Fatalf("stats %+v, want 0 accepted, 6 rejected", st)
	}
}

// TestCalibratorConverges starts from llama3-8b on llama3-70b's noisy
// prefills (5 % noise) and needs the grid error within 10 % in a bounded
// number of observations, then keeps it there.
func TestCalibratorConverges(t *testing.T) {
	truth := mustProfile(t, "llama3-70b")
	prior := mustProfile(t, "llama3-8b")
	if worst, _ := PrefillError(prior, truth); worst < 0.5 {
		t.Fatalf("prior error only %.0f%%: the test would prove nothing", worst*100)
	}
	const maxN = 100
	var ns []int
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 1))
		c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{})
		n := observeUntil(t, c, rng, truth, 0.10, maxN)
		if n > maxN {
			worst, _ := PrefillError(c.Profile(), truth)
			t.Fatalf("seed %d: grid error still %.1f%% after %d observations", seed, worst*100, maxN)
		}
		ns = append(ns, n)
		for range 500 {
			nt, p := calibShape(rng)
			if err := c.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05)}); err != nil {
				t.Fatal(err)
			}
		}
		worst, mean := PrefillError(c.Profile(), truth)
		if worst > 0.10 {
			t.Errorf("seed %d: grid error %.1f%% after %d more observations", seed, worst*100, 500)
		}
		t.Logf("seed %d: within 10%% after %d observations; after %d: max %.1f%%, mean %.1f%%, scales %.3f",
			seed, n, n+500, worst*100, mean*100, c.Stats().Scales)
	}
	t.Logf("observations to reach 10%% grid error: %v", ns)
}

// TestCalibratorOutlier: one observation 10x the truth, among converged
// clean ones, moves the grid prediction by little.
func TestCalibratorOutlier(t *testing.T) {
	truth := mustProfile(t, "llama3-70b")
	rng := rand.New(rand.NewPCG(7, 1))
	c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{})
	for range 400 {
		nt, p := calibShape(rng)
		if err := c.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05)}); err != nil {
			t.Fatal(err)
		}
	}
	before := c.Profile()
	for _, f := range []float64{10, 0.1} {
		if err := c.Observe(Observation{NewTokens: 512, PrefixTokens: 4096, Millis: f * truth.Prefill.Millis(512, 4096)}); err != nil {
			t.Fatal(err)
		}
		moved, _ := PrefillError(c.Profile(), before)
		if moved > 0.02 {
			t.Errorf("one %gx outlier moved the grid prediction by %.1f%%", f, moved*100)
		}
		t.Logf("%gx outlier moved the grid prediction by %.2f%%", f, moved*100)
		before = c.Profile()
	}
	// Without the Huber weights the same outlier moves it much more: the
	// test can fail.
	c2 := newTestCalibrator(t, "llama3-8b", CalibratorConfig{HuberK: 1e6})
	rng = rand.New(rand.NewPCG(7, 1))
	for range 400 {
		nt, p := calibShape(rng)
		_ = c2.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05)})
	}
	b2 := c2.Profile()
	_ = c2.Observe(Observation{NewTokens: 512, PrefixTokens: 4096, Millis: 10 * truth.Prefill.Millis(512, 4096)})
	if moved, _ := PrefillError(c2.Profile(), b2); moved < 0.02 {
		t.Errorf("least squares without Huber weights moved only %.2f%%: the outlier test is too weak", moved*100)
	} else {
		t.Logf("without Huber weights the 10x outlier moves it %.1f%%", moved*100)
	}
}

// TestCalibratorForgets: after the engines become 1.6x or 3x slower, or
// 2x faster, the fit follows within a few half-lives.
func TestCalibratorForgets(t *testing.T) {
	for _, f := range []float64{1.6, 3, 0.5} {
		t.Run(fmt.Sprint(f), func(t *testing.T) { testForgets(t, f) })
	}
}

func testForgets(t *testing.T, factor float64) {
	fast := mustProfile(t, "llama3-70b")
	slow := fast
	slow.Prefill = PrefillModel{A: fast.Prefill.A * factor, B: fast.Prefill.B * factor, C: fast.Prefill.C * factor, D: fast.Prefill.D * factor}
	rng := rand.New(rand.NewPCG(3, 1))
	c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{HalfLife: 64})
	if n := observeUntil(t, c, rng, fast, 0.05, 2000); n > 2000 {
		t.Fatal("did not converge on the fast profile")
	}
	for range 300 {
		nt, p := calibShape(rng)
		_ = c.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, fast, nt, p, 0.05)})
	}
	n := observeUntil(t, c, rng, slow, 0.10, 6*64)
	if n > 6*64 {
		worst, _ := PrefillError(c.Profile(), slow)
		t.Fatalf("grid error against the new speed still %.1f%% after %d observations (half-life 64)", worst*100, 6*64)
	}
	t.Logf("followed a %gx change of speed to within 10%% in %d observations (half-life 64)", factor, n)
}

// TestCalibratorValid: degenerate traffic (one shape, zero-cost terms,
// wild measurements) never yields an invalid profile.
func TestCalibratorValid(t *testing.T) {
	c := newTestCalibrator(t, "llama3-70b", CalibratorConfig{HalfLife: 8, Decode: true})
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range 2000 {
		o := Observation{NewTokens: 1 + rng.IntN(4), PrefixTokens: rng.IntN(2) * 100000, Millis: math.Exp(rng.NormFloat64() * 5),
			DecodeSeqs: rng.IntN(2) * rng.IntN(300), DecodeContext: rng.IntN(1 << 22)}
		if i%3 == 0 {
			o = Observation{NewTokens: 1 << 20, Millis: 1e-6}
		}
		_ = c.Observe(o)
		p := c.Profile()
		if err := p.Validate(); err != nil {
			t.Fatalf("observation %d (%+v): %v", i, o, err)
		}
		for _, s := range c.Stats().Scales {
			if s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
				t.Fatalf("observation %d: scales %v", i, c.Stats().Scales)
			}
		}
	}
}

func TestCalibratorConcurrent(t *testing.T) {
	truth := mustProfile(t, "llama3-70b")
	c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for range 200 {
				nt, p := calibShape(rng)
				_ = c.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05)})
				if err := c.Profile().Validate(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := c.Stats(); st.Accepted != 800 {
		t.Fatalf("accepted %d of 800", st.Accepted)
	}
	if worst, _ := PrefillError(c.Profile(), truth); worst > 0.10 {
		t.Fatalf("grid error %.1f%% after 800 concurrent observations", worst*100)
	}
}

// TestCalibratorDecodes: observations taken while the engine decodes hold
// the decodes' cost too; the calibrator fits it instead of charging it to
// the prefill, and its decode model moves toward the truth.
func TestCalibratorDecodes(t *testing.T) {
	truth := mustProfile(t, "llama3-70b")
	prior := mustProfile(t, "llama3-8b")
	rng := rand.New(rand.NewPCG(11, 1))
	c := newTestCalibrator(t, "llama3-8b", CalibratorConfig{Decode: true})
	for range 600 {
		nt, p := calibShape(rng)
		o := Observation{NewTokens: nt, PrefixTokens: p}
		ms := truth.Prefill.Millis(nt, p)
		if rng.IntN(4) > 0 {
			o.DecodeSeqs = 1 + rng.IntN(64)
			o.DecodeContext = o.DecodeSeqs * (2048 + rng.IntN(14336))
			steps := (nt + DefaultCalibChunkTokens - 1) / DefaultCalibChunkTokens
			ms += truth.Decode.Floor/2 + (float64(steps)+0.5)*truth.Decode.Extra(o.DecodeSeqs, o.DecodeContext)
		}
		o.Millis = ms * math.Exp(0.05*rng.NormFloat64())
		if err := c.Observe(o); err != nil {
			t.Fatal(err)
		}
	}
	got := c.Profile()
	worst, mean := PrefillError(got, truth)
	if worst > 0.10 {
		t.Errorf("prefill grid error %.1f%% with decodes riding along", worst*100)
	}
	extra := func(p Profile) float64 { return p.Decode.Extra(32, 32*4096) }
	if e, e0, et := extra(got), extra(prior), extra(truth); math.Abs(e-et) > 0.25*et {
		t.Errorf("decode extra %.2f ms (prior %.2f, truth %.2f)", e, e0, et)
	}
	// Without Decode the fit is the same but Profile keeps the prior's
	// decode model.
	c2 := newTestCalibrator(t, "llama3-8b", CalibratorConfig{})
	rng = rand.New(rand.NewPCG(11, 1))
	for range 600 {
		nt, p := calibShape(rng)
		_ = c2.Observe(Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05), DecodeSeqs: 8, DecodeContext: 8 * 4096})
	}
	if c2.Profile().Decode != prior.Decode {
		t.Errorf("decode model %+v without Decode, want the prior's %+v", c2.Profile().Decode, prior.Decode)
	}
	t.Logf("prefill max %.1f%%, mean %.1f%%; decode floor %.1f ms (truth %.1f), extra(32 x 4k) %.2f ms (truth %.2f); scales %.3f",
		worst*100, mean*100, got.Decode.Floor, truth.Decode.Floor, extra(got), extra(truth), c.Stats().Scales)
}

func BenchmarkCalibratorObserve(b *testing.B) {
	truth, _ := ProfileByName("llama3-70b")
	prior, _ := ProfileByName("llama3-8b")
	c, err := NewCalibrator(prior, CalibratorConfig{})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	obs := make([]Observation, 4096)
	for i := range obs {
		nt, p := calibShape(rng)
		obs[i] = Observation{NewTokens: nt, PrefixTokens: p, Millis: measure(rng, truth, nt, p, 0.05), DecodeSeqs: rng.IntN(8), DecodeContext: 20000}
	}
	for i := range obs[:1024] {
		_ = c.Observe(obs[i])
	}
	b.ResetTimer()
	for i := range b.N {
		_ = c.Observe(obs[i%len(obs)])
	}
}
