package sim

import (
	"context"
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// TestCalibrate runs engines of llama3-70b under a kvdir policy that starts
// from llama3-8b: with Calibrate, the result reports the calibration and
// its fitted profile is far closer to the engines' than the prior; without,
// no calibration is reported.
func TestCalibrate(t *testing.T) {
	recs, ideal := smallTrace(t)
	truth, err := costmodel.ProfileByName("llama3-70b")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config(t, "kvdir", 6000)
	cfg.Profile, cfg.PolicyProfile = truth, config(t, "kvdir", 0).Profile
	p, err := Run(context.Background(), recs, ideal, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.Calibration != nil {
		t.Fatalf("calibration reported without Calibrate: %+v", p.Calibration)
	}
	cfg.Calibrate = true
	p, err = Run(context.Background(), recs, ideal, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Calibration
	if c == nil {
		t.Fatal("no calibration reported")
	}
	if c.Prior != "llama3-8b" || c.Engine != "llama3-70b" || c.Observations == 0 || c.Observations+c.Skipped != uint64(len(recs)) {
		t.Fatalf("calibration %+v for %d requests", c, len(recs))
	}
	// 66 observations of short sessions: far from the 10 % of long
	// traffic, but far closer than the prior.
	if c.PriorErrorMax < 0.5 || c.FinalErrorMax > 0.35 || c.FinalErrorMean > 0.15 {
		t.Fatalf("grid error %.3f at the end, %.3f for the prior (%+v)", c.FinalErrorMax, c.PriorErrorMax, c)
	}
	t.Logf("%d observations (%d skipped): grid error max %.1f%%, mean %.1f%% (prior %.1f%%), scales %.2f",
		c.Observations, c.Skipped, c.FinalErrorMax*100, c.FinalErrorMean*100, c.PriorErrorMax*100, c.Scales)
}
