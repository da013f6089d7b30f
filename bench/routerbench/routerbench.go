// Package routerbench measures kvdir's router (kvbench router, make
// bench-router), on a fleet of real processes (3 directory nodes, 4
// enginesims with agents, two kvdir routers):
//
//   - the placement decision for a turn of a long session (render the new
//     messages, tokenize them, hash the new blocks, match the chain,
//     score), warm (the session's earlier turns cached) and cold (first
//     sight of the whole prompt), as the router itself times it
//     (decision_us of POST /v1/kvdir/explain; decision.go), side by side
//     on a router that asks a directory node for every match and on one
//     that answers from its local replica of the directory (--follow-log);
//   - the proxy overhead on small requests, side by side with HAProxy
//     (Debian's package, balance hdr(X-Session-Id), hash-type consistent,
//     hash-balance-factor 150) in front of the same upstream, and requests
//     per second sustained through the router (overhead.go).
package routerbench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// Tool is the name the results carry.
const Tool = "router"

// Options shape a run. A zero field means its default (see Defaults); Log
// may be nil.
type Options struct {
	// Sessions long sessions are built turn by turn, TurnTokens at a time,
	// to SessionTokens prompt tokens; then Warm and Cold decisions are
	// timed per session.
	Sessions, SessionTokens, TurnTokens int
	Warm, Cold                          int
	// LatencyRequests is the sequential small requests per path (direct,
	// routers, HAProxy) timed for the overhead.
	LatencyRequests int
	// Each throughput run lasts RPSDuration with RPSClients closed-loop
	// clients.
	RPSDuration time.Duration
	RPSClients  int
	// HAProxy is the HAProxy binary.
	HAProxy                    string
	SkipDecision, SkipOverhead bool
	// Dir holds the binaries and data; empty: a temporary directory,
	// removed after.
	Dir string
	Log *slog.Logger
}

// Defaults are the options of the committed figures.
var Defaults = Options{Sessions: 6, SessionTokens: 32768, TurnTokens: 4096, Warm: 60, Cold: 20, LatencyRequests: 3000,
	RPSDuration: 5 * time.Second, RPSClients: 32, HAProxy: "haproxy"}

func (o Options) withDefaults() Options {
	d := o
	benchopt.Default(&d.Sessions, Defaults.Sessions)
	benchopt.Default(&d.SessionTokens, Defaults.SessionTokens)
	benchopt.Default(&d.TurnTokens, Defaults.TurnTokens)
	benchopt.Default(&d.Warm, Defaults.Warm)
	benchopt.Default(&d.Cold, Defaults.Cold)
	benchopt.Default(&d.LatencyRequests, Defaults.LatencyRequests)
	benchopt.Default(&d.RPSDuration, Defaults.RPSDuration)
	benchopt.Default(&d.RPSClients, Defaults.RPSClients)
	d.HAProxy = cmp.Or(d.HAProxy, Defaults.HAProxy)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// Measures are a run's numbers as the tool measured them; their JSON names
// are the figure and detail names.
type Measures struct {
	DecisionP50         float64            `json:"decision_p50_us"`
	DecisionP99         float64            `json:"decision_p99_us"`
	DecisionColdP50     float64            `json:"decision_cold_p50_us"`
	DecisionColdP99     float64            `json:"decision_cold_p99_us"`
	DecisionParts       map[string]float64 `json:"decision_parts"`
	DecisionSamples     int                `json:"decision_samples"`
	DecisionColdSamples int                `json:"decision_cold_samples"`
	DecisionFallbacks   int                `json:"decision_fallbacks"`
	DecisionMatchedFrac float64            `json:"decision_matched_fraction"`
	SessionPromptTokens float64            `json:"decision_session_prompt_tokens_mean"`
	ExplainRoundTripP50 float64            `json:"explain_round_trip_p50_us"`
	DecisionMethod      string             `json:"decision_method"`

	// The same decisions on the router with a local replica of the
	// directory (--follow-log); LocalDecisionOtherSource counts the warm
	// ones not answered by the replica.
	LocalDecisionP50         float64            `json:"decision_local_p50_us"`
	LocalDecisionP99         float64            `json:"decision_local_p99_us"`
	LocalDecisionColdP50     float64            `json:"decision_local_cold_p50_us"`
	LocalDecisionColdP99     float64            `json:"decision_local_cold_p99_us"`
	LocalDecisionParts       map[string]float64 `json:"decision_local_parts"`
	LocalDecisionSamples     int                `json:"decision_local_samples"`
	LocalDecisionFallbacks   int                `json:"decision_local_fallbacks"`
	LocalDecisionOtherSource int                `json:"decision_local_other_source"`
	LocalDecisionMatchedFrac float64            `json:"decision_local_matched_fraction"`

	DirectP50               float64 `json:"direct_p50_us"`
	ProxyOverheadP50        float64 `json:"proxy_overhead_p50_us"`
	KVDirProxyOverheadP50   float64 `json:"kvdir_proxy_overhead_p50_us"`
	HAProxyOverheadP50      float64 `json:"haproxy_overhead_p50_us"`
	OverheadRatio           float64 `json:"overhead_ratio_vs_haproxy"`
	KVDirOverheadRatio      float64 `json:"kvdir_overhead_ratio_vs_haproxy"`
	LatencyRequestsPerPath  int     `json:"latency_requests_per_path"`
	RequestsPerSec          float64 `json:"requests_per_sec"`
	SessionHashRequestsPerS float64 `json:"session_hash_requests_per_sec"`
	HAProxyRequestsPerSec   float64 `json:"haproxy_requests_per_sec"`
	DirectRequestsPerSec    float64 `json:"direct_requests_per_sec"`
	RequestErrors           int64   `json:"request_errors"`
	HAProxyVersion          string  `json:"haproxy_version"`
	RPSClients              int     `json:"rps_clients"`
	OverheadMethod          string  `json:"overhead_method"`
}

// Details are the envelope's details: sample counts and how each phase
// was measured.
type Details struct {
	DecisionSamples     int     `json:"decision_samples,omitempty"`
	DecisionColdSamples int     `json:"decision_cold_samples,omitempty"`
	DecisionFallbacks   int     `json:"decision_fallbacks"`
	SessionPromptTokens float64 `json:"decision_session_prompt_tokens_mean,omitempty"`
	DecisionMethod      string  `json:"decision_method,omitempty"`
	// The router with a local replica: its warm samples, fallbacks, and
	// warm decisions whose match did not come from the replica.
	LocalDecisionSamples     int `json:"decision_local_samples,omitempty"`
	LocalDecisionFallbacks   int `json:"decision_local_fallbacks"`
	LocalDecisionOtherSource int `json:"decision_local_other_source"`

	LatencyRequestsPerPath int    `json:"latency_requests_per_path,omitempty"`
	RequestErrors          int64  `json:"request_errors"`
	HAProxyVersion         string `json:"haproxy_version,omitempty"`
	// RPSClients is the closed-loop clients of each throughput run.
	RPSClients     int    `json:"rps_clients,omitempty"`
	OverheadMethod string `json:"overhead_method,omitempty"`
}

// PartsPrefix starts the names of the decision's parts (render, hash,
// match, score); LocalPartsPrefix those of the router with a local
// replica.
const (
	PartsPrefix      = "decision_parts."
	LocalPartsPrefix = "decision_local_parts."
)

// Results fills res (from benchjson.New) with m's figures and details; a
// phase that did not run has no figures.
func (m *Measures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	if m.DecisionSamples > 0 {
		res.Figures = append(res.Figures,
			fig{Name: "decision_p50_us", Unit: "µs", Measured: m.DecisionP50,
				Note: "placement decision for one more turn of a long session, warm, as the router times it, on the router asking a directory node for every match, p50"},
			fig{Name: "decision_p99_us", Unit: "µs", Target: benchjson.Max(1000), Measured: m.DecisionP99, Note: "same, p99"},
			fig{Name: "decision_cold_p50_us", Unit: "µs", Measured: m.DecisionColdP50, Note: "the whole prompt under a new session id, p50"},
			fig{Name: "decision_cold_p99_us", Unit: "µs", Measured: m.DecisionColdP99, Note: "same, p99"})
		res.Figures = append(res.Figures, partFigures(PartsPrefix, "", m.DecisionParts)...)
		res.Figures = append(res.Figures,
			fig{Name: "decision_matched_fraction", Unit: "fraction", Measured: m.DecisionMatchedFrac,
				Note: "warm decisions whose pick held directory blocks of the session"},
			fig{Name: "explain_round_trip_p50_us", Unit: "µs", Measured: m.ExplainRoundTripP50,
				Note: "the explain request's round trip at the client, p50"})
	}
	if m.LocalDecisionSamples > 0 {
		res.Figures = append(res.Figures,
			fig{Name: "decision_local_p50_us", Unit: "µs", Measured: m.LocalDecisionP50,
				Note: "the same warm decision on the router answering matches from its local replica of the directory (--follow-log), p50"},
			fig{Name: "decision_local_p99_us", Unit: "µs", Target: benchjson.Max(300), Measured: m.LocalDecisionP99, Note: "same, p99"},
			fig{Name: "decision_local_cold_p50_us", Unit: "µs", Measured: m.LocalDecisionColdP50,
				Note: "the whole prompt under a new session id on the router with the local replica, p50"},
			fig{Name: "decision_local_cold_p99_us", Unit: "µs", Measured: m.LocalDecisionColdP99, Note: "same, p99"})
		res.Figures = append(res.Figures, partFigures(LocalPartsPrefix, " on the router with the local replica", m.LocalDecisionParts)...)
		res.Figures = append(res.Figures,
			fig{Name: "decision_local_matched_fraction", Unit: "fraction", Measured: m.LocalDecisionMatchedFrac,
				Note: "warm decisions on the router with the local replica whose pick held directory blocks of the session"})
	}
	if m.LatencyRequestsPerPath > 0 {
		res.Figures = append(res.Figures,
			fig{Name: "direct_p50_us", Unit: "µs", Measured: m.DirectP50, Note: "small request straight to the upstream, p50"},
			fig{Name: "proxy_overhead_p50_us", Unit: "µs", Measured: m.ProxyOverheadP50, Note: "added by the router (session-hash, static list), p50"},
			fig{Name: "kvdir_proxy_overhead_p50_us", Unit: "µs", Measured: m.KVDirProxyOverheadP50, Note: "added by the router (kvdir, a directory match per request), p50"},
			fig{Name: "haproxy_overhead_p50_us", Unit: "µs", Measured: m.HAProxyOverheadP50, Note: "added by HAProxy, p50"},
			fig{Name: "overhead_ratio_vs_haproxy", Unit: "ratio", Target: benchjson.Max(1.5), Measured: m.OverheadRatio,
				Note: "the router's session-hash overhead / HAProxy's"},
			fig{Name: "kvdir_overhead_ratio_vs_haproxy", Unit: "ratio", Measured: m.KVDirOverheadRatio, Note: "the router's kvdir overhead / HAProxy's"},
			fig{Name: "requests_per_sec", Unit: "requests/s", Measured: m.RequestsPerSec, Note: "small requests through the kvdir router, closed loop"},
			fig{Name: "session_hash_requests_per_sec", Unit: "requests/s", Measured: m.SessionHashRequestsPerS, Note: "same through the session-hash router"},
			fig{Name: "haproxy_requests_per_sec", Unit: "requests/s", Measured: m.HAProxyRequestsPerSec, Note: "same through HAProxy"},
			fig{Name: "direct_requests_per_sec", Unit: "requests/s", Measured: m.DirectRequestsPerSec, Note: "same straight to an upstream"})
	}
	return res.SetDetails(Details{DecisionSamples: m.DecisionSamples, DecisionColdSamples: m.DecisionColdSamples,
		DecisionFallbacks: m.DecisionFallbacks, SessionPromptTokens: m.SessionPromptTokens, DecisionMethod: m.DecisionMethod,
		LocalDecisionSamples: m.LocalDecisionSamples, LocalDecisionFallbacks: m.LocalDecisionFallbacks, LocalDecisionOtherSource: m.LocalDecisionOtherSource,
		LatencyRequestsPerPath: m.LatencyRequestsPerPath, RequestErrors: m.RequestErrors, HAProxyVersion: m.HAProxyVersion,
		RPSClients: m.RPSClients, OverheadMethod: m.OverheadMethod})
}

// partFigures returns the figures of a decision's parts (render, hash,
// match, score at p50 and p99) under prefix.
func partFigures(prefix, where string, parts map[string]float64) []benchjson.Figure {
	var out []benchjson.Figure
	for _, part := range []string{"render", "hash", "match", "score"} {
		for _, q := range []string{"p50", "p99"} {
			key := part + "_" + q + "_us"
			if v, ok := parts[key]; ok {
				out = append(out, benchjson.Figure{Name: prefix + key, Unit: "µs", Measured: v,
					Note: fmt.Sprintf("the %s part of the warm decision%s, %s", part, where, q)})
			}
		}
	}
	return out
}

// Run starts the fleet, measures and returns the results (without their
// command, which the caller knows). Every process it starts is stopped
// before it returns.
func Run(ctx context.Context, opts Options) (*benchjson.Results, error) {
	return benchjson.Measure(Tool, func() (*Measures, error) { return measure(ctx, opts.withDefaults()) })
}

func measure(ctx context.Context, c Options) (*Measures, error) {
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "routerbench-")
		if err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(d)
		c.Dir = d
	}
	log := c.Log
	res := &Measures{}
	log.Info("starting a fleet: 3 directory nodes, 4 enginesims with agents, 2 routers (kvdir policy; the second with --follow-log)")
	f, err := fleet.Start(ctx, fleet.Config{Dir: c.Dir, Engines: 4, Routers: 2,
		EngineArgs:    []string{"--time-scale", "0", "--default-max-tokens", "1"},
		RouterArgs:    []string{"--policy", "kvdir"},
		PerRouterArgs: [][]string{nil, {"--follow-log"}}})
	if err != nil {
		return nil, fmt.Errorf("start the fleet: %w", err)
	}
	defer f.Stop()
	if !c.SkipDecision {
		if err := benchDecision(ctx, log, c, f, res); err != nil {
			return nil, fmt.Errorf("decision phase: %w\n%s", err, f.Logs(20))
		}
		log.Info("decision", "warm_p99_us", res.DecisionP99, "cold_p99_us", res.DecisionColdP99,
			"local_warm_p99_us", res.LocalDecisionP99, "local_cold_p99_us", res.LocalDecisionColdP99)
	}
	if !c.SkipOverhead {
		if err := benchOverhead(ctx, log, c, f, res); err != nil {
			return nil, fmt.Errorf("overhead phase: %w\n%s", err, f.Logs(20))
		}
		log.Info("overhead", "router_p50_us", res.ProxyOverheadP50, "haproxy_p50_us", res.HAProxyOverheadP50,
			"ratio", res.OverheadRatio, "kvdir_router_requests_per_sec", res.RequestsPerSec)
	}
	return res, nil
}
