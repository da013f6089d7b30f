package router

import (
	"bytes"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
)

// calibration feeds the router's costmodel.Calibrator and exports its fit.
//
// An observation is one response the router proxied: the engine's prompt
// and cached tokens from its usage (prompt_tokens and
// prompt_tokens_details.cached_tokens) and the time from sending the
// request to the first data event carrying a token. Only responses that
// measure a prefill are used:
//
//   - streamed (an event stream): a plain response's first byte comes
//     after the whole generation;
//   - with usage and its cached tokens (vLLM: stream_options.include_usage
//     and --enable-prompt-tokens-details): without them the prefill's shape
//     is a guess;
//   - placed on a worker with nothing queued ahead: the engine reported no
//     waiting requests and the router (with the other routers' shared
//     intents) counted no uncached prompt tokens there that had not yet
//     produced a first token. The engine's running sequences are the
//     decode batch riding along; each is assumed to attend to
//     placement.DefaultDecodeContext tokens, as the kvdir policy assumes;
//   - answered 2xx and relayed to the end.
type calibration struct {
	cal                *costmodel.Calibrator
	observed, rejected prometheus.Counter
	skipped            *prometheus.CounterVec
}

// Reasons a response is not observed (the reason label of
// kvdir_router_calibration_skipped_total).
const (
	skipNotStreamed = "not-streamed"
	skipNoUsage     = "no-usage"
	skipQueued      = "queued"
	skipOutcome     = "outcome"
)

func newCalibration(cal *costmodel.Calibrator, reg *prometheus.Registry) *calibration {
	c := &calibration{cal: cal,
		observed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_router_calibration_observations_total",
			Help: "Responses whose measured prefill the cost model was fitted to (--calibrate)."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvdir_router_calibration_rejected_total",
			Help: "Clean responses the calibrator refused (no new tokens, or no measurable time)."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_router_calibration_skipped_total",
			Help: "Responses not used for calibration, by reason: not-streamed, no-usage (no cached tokens reported), queued (work queued on the worker at placement), outcome (not a complete 2xx)."},
			[]string{"reason"}),
	}
	reg.MustRegister(c.observed, c.rejected, c.skipped)
	for _, s := range costmodel.ShapeGrid() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvdir_router_model_prefill_ms",
			Help:        "The cost model's prefill time of a request shape (new tokens after a cached prefix), in ms: the calibrated profile as the policy prices it now.",
			ConstLabels: prometheus.Labels{"new": strconv.Itoa(s.New), "prefix": strconv.Itoa(s.Prefix)}},
			func() float64 { return cal.Profile().Prefill.Millis(s.New, s.Prefix) }))
	}
	coef := func(name string, f func(p costmodel.Profile) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvdir_router_model_coefficient",
			Help:        "The cost model's coefficients now (costmodel.Profile, names as in a profile file); the prior's until the first observation.",
			ConstLabels: prometheus.Labels{"term": name}},
			func() float64 { return f(cal.Profile()) }))
	}
	coef("prefill.a_ms", func(p costmodel.Profile) float64 { return p.Prefill.A })
	coef("prefill.b_ms_per_token", func(p costmodel.Profile) float64 { return p.Prefill.B })
	coef("prefill.c_ms_per_token2", func(p costmodel.Profile) float64 { return p.Prefill.C })
	coef("prefill.d_ms_per_prefix_token", func(p costmodel.Profile) float64 { return p.Prefill.D })
	coef("decode.floor_ms", func(p costmodel.Profile) float64 { return p.Decode.Floor })
	coef("decode.per_seq_ms", func(p costmodel.Profile) float64 { return p.Decode.PerSeq })
	coef("decode.per_context_token_ms", func(p costmodel.Profile) float64 { return p.Decode.PerToken })
	return c
}

// observe feeds the calibrator the response relayed for d, if it is clean;
// ttft is the time to its first token (0 if none was seen).
func (c *calibration) observe(d *decision, stream bool, u *usageScanner, ttft time.Duration, outcome string) {
	ld := d.cands[d.pick.Index].Load
	switch {
	case outcome != OutcomeOK:
		c.skipped.WithLabelValues(skipOutcome).Inc()
		return
	case !stream || ttft <= 0:
		c.skipped.WithLabelValues(skipNotStreamed).Inc()
		return
	case !u.known || !u.promptKnown:
		c.skipped.WithLabelValues(skipNoUsage).Inc()
		return
	case ld.Waiting > 0 || ld.QueuedPrefillTokens > 0:
		c.skipped.WithLabelValues(skipQueued).Inc()
		return
	}
	err := c.cal.Observe(costmodel.Observation{
		NewTokens: u.prompt - u.cached, PrefixTokens: u.cached,
		Millis:     float64(ttft) / float64(time.Millisecond),
		DecodeSeqs: max(ld.Running, 0), DecodeContext: max(ld.Running, 0) * placement.DefaultDecodeContext,
	})
	if err != nil {
		c.rejected.Inc()
		return
	}
	c.observed.Inc()
}

// hasToken reports whether an event stream's data line carries generated
// text: a non-empty "content" (chat) or "text" (completion) string. An
// engine may send the chat role's chunk, with empty content, before the
// prefill (the engine simulator does; vLLM sends it with the first token).
func hasToken(line []byte) bool {
	for _, key := range [][]byte{[]byte(`"content":`), []byte(`"text":`)} {
		rest := line
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = bytes.TrimLeft(rest[i+len(key):], " ")
			if len(rest) >= 2 && rest[0] == '"' && rest[1] != '"' {
				return true
			}
		}
	}
	return false
}
