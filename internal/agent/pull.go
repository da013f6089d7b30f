package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/trtevents"
)

// Defaults of the pull poller.
const (
	// DefaultPullInterval is how often the pull endpoint is polled.
	DefaultPullInterval = 100 * time.Millisecond
	// maxPullBackoff bounds the wait after failed pulls.
	maxPullBackoff = 5 * time.Second
	// pullAgainEvents is a response size (in events) after which the next
	// pull starts at once: the engine is busy and its queue may be long.
	pullAgainEvents = 1024
)

// pulled is one pull's decoded events, handed to the main loop.
type pulled struct {
	events []trtevents.Event
}

// pullState is the poller's sequence state (main loop only) and metrics.
//
// TensorRT-LLM's pull endpoint numbers events (event_id, consecutive from
// 0, the created event) and keeps nothing once read, so there is no
// replay: a gap (events drained by another reader, dropped by the engine's
// bounded queue, or a response the agent could not read) clears the worker
// in the directory and rebuilds it from the next events; ids going
// backwards mean a new engine, handled as a restart (a new registration).
type pullState struct {
	have bool
	last uint64

	pulls   *prometheus.CounterVec // by result
	skipped *prometheus.CounterVec // decoded events not translated, by reason
}

func newPullState(a *Agent) *pullState {
	p := &pullState{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_pulls_total",
			Help: "Polls of the engine's pull endpoint (TensorRT-LLM POST /kv_cache_events), by result: ok, error (HTTP or transport), undecodable."}, []string{"result"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvdir_agent_pull_events_skipped_total",
			Help: "Pulled events or blocks not translated, by reason: empty, updated, unknown, malformed, partial_block, partial_removed."}, []string{"reason"}),
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"worker": a.cfg.WorkerID}, a.m.reg)
	reg.MustRegister(p.pulls, p.skipped)
	return p
}

// validatePull checks the event source: exactly one of Endpoint and
// PullURL, and PullURL an http(s) URL without the ZeroMQ-only settings.
func (c Config) validatePull() error {
	if c.PullURL == "" {
		if c.Endpoint == "" {
			return errors.New("agent: kv-events endpoint is required (or a pull URL)")
		}
		return nil
	}
	if c.Endpoint != "" {
		return errors.New("agent: kv-events endpoint and pull URL are mutually exclusive: a ZeroMQ engine has an endpoint, a TensorRT-LLM pull endpoint a URL")
	}
	if c.ReplayEndpoint != "" || c.Bind {
		return errors.New("agent: replay endpoint and bind are for a ZeroMQ endpoint, not a pull URL")
	}
	u, err := url.Parse(c.PullURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("agent: pull URL %q: want an http(s) URL such as http://10.0.0.7:8000/kv_cache_events", c.PullURL)
	}
	if c.PullInterval < 0 {
		return fmt.Errorf("agent: pull interval %v is negative (0 means the default)", c.PullInterval)
	}
	return nil
}

// pullLoop polls the pull endpoint until ctx ends, sending each non-empty
// response's events, in order, to out. Failed pulls are counted and backed
// off (doubling from the interval up to maxPullBackoff); the heartbeats go
// on meanwhile.
func (a *Agent) pullLoop(ctx context.Context, out chan<- pulled) {
	p := a.pull
	interval := a.cfg.PullInterval
	if interval <= 0 {
		interval = DefaultPullInterval
	}
	cl := &trtevents.Client{URL: a.cfg.PullURL, HTTP: &http.Client{Timeout: trtevents.DefaultTimeout}}
	dec := trtevents.NewDecoder(a.cfg.BlockSize)
	var backoff time.Duration
	failing := false
	for {
		wait := interval
		body, err := cl.Pull(ctx)
		if ctx.Err() != nil {
			return
		}
		var evs []trtevents.Event
		var st trtevents.Stats
		if err == nil {
			evs, st, err = dec.Decode(body)
			if err != nil {
				// The engine drained these events: the next ids show the gap.
				p.pulls.WithLabelValues("undecodable").Inc()
				a.log.Warn("agent: undecodable pull response; its events are lost", "url", a.cfg.PullURL, "err", err)
			}
		} else {
			p.pulls.WithLabelValues("error").Inc()
		}
		switch {
		case err != nil && body == nil:
			backoff = min(max(2*backoff, interval), maxPullBackoff)
			wait = backoff
			if !failing {
				a.log.Warn("agent: pull of the engine's KV events failed; backing off", "url", a.cfg.PullURL, "err", err)
			} else {
				a.log.Debug("agent: pull failed", "url", a.cfg.PullURL, "err", err, "backoff", backoff)
			}
			failing = true
		case err == nil:
			if failing {
				a.log.Info("agent: pulling the engine's KV events again", "url", a.cfg.PullURL)
			}
			failing, backoff = false, 0
			p.pulls.WithLabelValues("ok").Inc()
			p.count(st)
			if len(evs) > 0 {
				select {
				case out <- pulled{events: evs}:
				case <-ctx.Done():
					return
				}
			}
			if len(evs) >= pullAgainEvents {
				wait = 0
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// count exports a response's decoder counts.
func (p *pullState) count(st trtevents.Stats) {
	for _, c := range []struct {
		reason string
		n      int
	}{{"empty", st.Empty}, {"updated", st.Updated}, {"unknown", st.Unknown}, {"malformed", st.Malformed},
		{"partial_block", st.PartialBlocks}, {"partial_removed", st.PartialRemoved}} {
		if c.n > 0 {
			p.skipped.WithLabelValues(c.reason).Add(float64(c.n))
		}
	}
}

// handlePull applies the event_id rules to one response's events and
// translates them in order.
func (a *Agent) handlePull(ctx context.Context, in pulled) {
	p := a.pull
	a.lastEventAt = time.Now()
	var run []kvevents.Event
	translateRun := func() {
		if len(run) > 0 {
			a.translate(ctx, kvevents.Batch{Events: run})
			run = nil
		}
	}
	for _, ev := range in.events {
		switch {
		case p.have && ev.ID <= p.last:
			// Drained reads never repeat an id: a new engine counts
			// from 0 again.
			translateRun()
			a.m.restarts.Inc()
			a.log.Warn("agent: engine event_id went backwards; engine restarted", "event_id", ev.ID, "last", p.last)
			a.engineRestarted(ctx)
			p.have = false
		case p.have && ev.ID > p.last+1:
			translateRun()
			a.m.gaps.Inc()
			a.log.Warn("agent: events missing from the engine's pull endpoint (no replay); clearing the worker and rebuilding",
				"from", p.last+1, "to", ev.ID-1)
			a.resync("pull_gap")
		}
		if !p.have {
			p.have = true
			if ev.ID > 0 {
				// The engine's first events were read by someone else (or
				// dropped) before this agent's first pull: what they
				// stored is missing. The registration cleared the worker.
				translateRun()
				a.m.gaps.Inc()
				a.log.Warn("agent: the engine's first pulled event is not its first; blocks stored before it are not in the directory",
					"event_id", ev.ID)
				a.resync("pull_start")
			}
		}
		p.last = ev.ID
		if ev.Event != nil {
			run = append(run, ev.Event)
		}
	}
	translateRun()
}
