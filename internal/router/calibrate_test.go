package router

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
)

// metricValue returns the value of the series of family whose labels
// include every given name=value pair (counters and gauges).
func metricValue(t *testing.T, s *Server, family string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestCalibrateFromResponses streams responses whose usage says 4,000
// uncached prompt tokens and whose first token comes about 25 ms after the
// request (the llama3-8b prior says 104 ms): the router's calibrated
// profile, its metrics and the kvdir policy reading it follow the engine;
// plain responses and streams without usage are skipped.
func TestCalibrateFromResponses(t *testing.T) {
	const prefill = 25 * time.Millisecond
	var usage atomic.Bool
	usage.Store(true)
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		// The role chunk before the prefill, as the engine simulator sends it.
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		f.Flush()
		<-time.After(prefill) // the engine's prefill
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		if usage.Load() {
			_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4000,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n")
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	prior, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	cal, err := costmodel.NewCalibrator(prior, costmodel.CalibratorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := placement.NewKVDir(placement.Options{Seed: 1, LiveProfile: cal})
	if err != nil {
		t.Fatal(err)
	}
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, func(c *Config) {
		c.Calibrator = cal
	})
	priorMs, ok := metricValue(t, s, "kvdir_router_model_prefill_ms", "new", "2048", "prefix", "0")
	if !ok || priorMs != prior.Prefill.Millis(2048, 0) {
		t.Fatalf("model_prefill_ms{new=2048,prefix=0} = %v (%v) before any observation, want the prior's %v", priorMs, ok, prior.Prefill.Millis(2048, 0))
	}
	stream := strings.Replace(chatBody, `"max_tokens":4`, `"max_tokens":4,"stream":true`, 1)
	const n = 8
	for range n {
		if resp, body := post(t, url+PathChat, stream, "Content-Type", "application/json"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	usage.Store(false)
	post(t, url+PathChat, stream, "Content-Type", "application/json")
	if got, _ := metricValue(t, s, "kvdir_router_calibration_observations_total"); got != n {
		t.Fatalf("%v observations, want %d", got, n)
	}
	if got, _ := metricValue(t, s, "kvdir_router_calibration_skipped_total", "reason", skipNoUsage); got != 1 {
		t.Fatalf("%v skipped for lack of usage, want 1", got)
	}
	got := cal.Profile().Prefill.Millis(4000, 0)
	want := prior.Prefill.Millis(4000, 0)
	if got < float64(prefill/time.Millisecond) || got > 0.6*want {
		t.Fatalf("calibrated prefill of 4,000 tokens %.1f ms; the engine took %v, the prior says %.1f ms", got, prefill, want)
	}
	if ms, _ := metricValue(t, s, "kvdir_router_model_prefill_ms", "new", "2048", "prefix", "0"); ms >= 0.8*priorMs {
		t.Fatalf("model_prefill_ms{new=2048,prefix=0} = %.1f, prior %.1f: did not follow the engine", ms, priorMs)
	}
	if b, _ := metricValue(t, s, "kvdir_router_model_coefficient", "term", "prefill.b_ms_per_token"); b != cal.Profile().Prefill.B {
		t.Fatalf("model_coefficient{term=prefill.b_ms_per_token} = %v, calibrator's %v", b, cal.Profile().Prefill.B)
	}
	d, err := kv.Pick(placement.Request{PromptTokens: 4000, BlockSize: 16}, []placement.Candidate{{Worker: "w0"}})
	if err != nil {
		t.Fatal(err)
	}
	if ms := d.Scores[0].PrefillMs; ms != got {
		t.Fatalf("kvdir priced the prefill at %.1f ms, calibrated %.1f", ms, got)
	}
	s.policy = kv
	e := s.explainProfile("kvdir")
	if e == nil || e.CalibratedFrom != "llama3-8b" || e.CalibrationCount != n || e.PrefillB != cal.Profile().Prefill.B {
		t.Fatalf("explain profile %+v", e)
	}
	t.Logf("4,000-token prefill: prior %.1f ms, engine %v (+ proxying), calibrated %.1f ms", want, prefill, got)
}

// TestCalibrateSkipsPlain: a plain response's first byte is the whole
// answer, so it is not a prefill measurement.
func TestCalibrateSkipsPlain(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	cal, err := costmodel.NewCalibrator(mustProfile(t), costmodel.CalibratorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, func(c *Config) { c.Calibrator = cal })
	post(t, url+PathChat, chatBody, "Content-Type", "application/json")
	if got, _ := metricValue(t, s, "kvdir_router_calibration_skipped_total", "reason", skipNotStreamed); got != 1 {
		t.Fatalf("%v skipped as not streamed, want 1", got)
	}
	if st := cal.Stats(); st.Accepted != 0 {
		t.Fatalf("plain response observed: %+v", st)
	}
}

func mustProfile(t *testing.T) costmodel.Profile {
	t.Helper()
	p, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHasToken(t *testing.T) {
	for _, c := range []struct {
		line string
		want bool
	}{
		{`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`, false},
		{`data: {"choices":[{"delta":{"content":"hi"}}]}`, true},
		{`data: {"choices":[{"delta":{"content": "hi"}}]}`, true},
		{`data: {"choices":[{"delta":{"content":null}}]}`, false},
		{`data: {"choices":[{"text":"x","index":0}]}`, true},
		{`data: {"choices":[{"text":"","index":0}]}`, false},
		{`data: {"choices":[],"usage":{"prompt_tokens":3}}`, false},
		{`data: {"choices":[{"delta":{"reasoning_content":"","content":"a"}}]}`, true},
	} {
		if got := hasToken([]byte(c.line)); got != c.want {
			t.Errorf("hasToken(%s) = %v, want %v", c.line, got, c.want)
		}
	}
}
