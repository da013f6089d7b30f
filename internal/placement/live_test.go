package placement

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// swapSource is a ProfileSource a test switches between profiles.
type swapSource struct {
	p atomic.Pointer[costmodel.Profile]
}

func (s *swapSource) Profile() costmodel.Profile { return *s.p.Load() }

func (s *swapSource) set(p costmodel.Profile) { s.p.Store(&p) }

// TestKVDirLiveProfile: with a LiveProfile, every Pick prices with the
// source's profile of the moment.
func TestKVDirLiveProfile(t *testing.T) {
	p8 := llama8b(t)
	p70, err := costmodel.ProfileByName("llama3-70b")
	if err != nil {
		t.Fatal(err)
	}
	src := &swapSource{}
	src.set(p8)
	pol, err := NewKVDir(Options{Profile: p70, LiveProfile: src})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{PromptTokens: 4096, BlockSize: 16}
	cands := []Candidate{{Worker: "a"}}
	for _, prof := range []costmodel.Profile{p8, p70, p8} {
		src.set(prof)
		d, err := pol.Pick(req, cands)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Scores[0].PrefillMs, prof.Prefill.Millis(4096, 0); math.Abs(got-want) > 1e-9 {
			t.Fatalf("%s: Pick priced the prefill at %v ms, want %v", prof.Name, got, want)
		}
		if got := pol.Score(req, cands[0]).ColdPrefillMs; math.Abs(got-prof.Prefill.Millis(4096, 0)) > 1e-9 {
			t.Fatalf("%s: Score priced the cold prefill at %v ms", prof.Name, got)
		}
		if pol.Profile().Name != prof.Name {
			t.Fatalf("Profile() = %s, want %s", pol.Profile().Name, prof.Name)
		}
	}
}

// TestKVDirCalibratorConcurrent picks while a calibrator learns (run with
// -race).
func TestKVDirCalibratorConcurrent(t *testing.T) {
	cal, err := costmodel.NewCalibrator(llama8b(t), costmodel.CalibratorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := NewKVDir(Options{LiveProfile: cal, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 300 {
			_ = cal.Observe(costmodel.Observation{NewTokens: 100 + 10*i, PrefixTokens: 50 * i, Millis: 10 + float64(i)})
		}
	})
	wg.Go(func() {
		cands := []Candidate{{Worker: "a"}, {Worker: "b"}}
		for range 300 {
			if _, err := pol.Pick(Request{PromptTokens: 1000, BlockSize: 16}, cands); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	if got := pol.Profile(); got != cal.Profile() {
		t.Fatalf("policy profile %+v, calibrator's %+v", got, cal.Profile())
	}
}
