package sim

import (
	"time"

	"github.com/kvdir/kvdir/bench/report"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/simengine"
)

// CalibrationCheckpoint is when, after the first arrival, a calibrated run
// records its profile's error (report.Calibration's Checkpoint figures).
const CalibrationCheckpoint = 2 * time.Minute

// observe feeds the placing router's calibrator the finished request q, as
// the router sees it at the end of the response (its usage carries the
// cached tokens): prompt and cached tokens and the time to first token, if
// the worker had nothing queued at placement.
func (s *state) observe(q *intent, f *simengine.Result, now time.Duration) {
	cal := s.routers[q.router].cal
	if cal == nil {
		return
	}
	if s.calib == nil {
		s.calib = &report.Calibration{Prior: s.cfg.PolicyProfile.Name, Engine: s.cfg.Profile.Name}
		s.calib.PriorErrorMax, _ = costmodel.PrefillError(s.cfg.PolicyProfile, s.cfg.Profile)
	}
	if !q.clean || f.FirstToken <= f.Arrival {
		s.calib.Skipped++
	} else {
		err := cal.Observe(costmodel.Observation{
			NewTokens: f.PromptTokens - f.CachedTokens, PrefixTokens: f.CachedTokens,
			Millis:     float64(f.FirstToken-f.Arrival) / float64(time.Millisecond),
			DecodeSeqs: q.running, DecodeContext: q.running * placement.DefaultDecodeContext,
		})
		if err != nil {
			s.calib.Skipped++
		}
	}
	if !s.checked && now-s.start >= CalibrationCheckpoint {
		s.checked = true
		c := s.calibration(true)
		s.calib.CheckpointSec = (now - s.start).Seconds()
		s.calib.CheckpointObservations = c.Observations
		s.calib.CheckpointErrorMax, s.calib.CheckpointErrorMean = c.FinalErrorMax, c.FinalErrorMean
	}
}

// calibration returns the run's calibration figures as of now: the worst
// router's errors against the engines' profile, the observations summed
// over the routers. It is nil without Config.Calibrate or observations.
// With partial, the checkpoint fields are left empty.
func (s *state) calibration(partial bool) *report.Calibration {
	if s.calib == nil {
		return nil
	}
	out := *s.calib
	if partial {
		out = report.Calibration{}
	}
	out.Observations, out.FinalErrorMax, out.FinalErrorMean = 0, 0, 0
	for i, rt := range s.routers {
		if rt.cal == nil {
			continue
		}
		st := rt.cal.Stats()
		out.Observations += st.Accepted
		worst, mean := costmodel.PrefillError(rt.cal.Profile(), s.cfg.Profile)
		out.FinalErrorMax, out.FinalErrorMean = max(out.FinalErrorMax, worst), max(out.FinalErrorMean, mean)
		if i == 0 {
			out.Scales = st.Scales[:]
		}
	}
	return &out
}
