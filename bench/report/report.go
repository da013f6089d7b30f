// Package report holds kvbench's result schema and its renderings: the JSON
// file, a Markdown comparison table and PNG charts.
//
// Both ways of running a comparison fill the same schema: the discrete-event
// simulator (kvbench sim) and the live replay through real processes
// (kvbench replay). Each produces one Sample per request, in whatever way it
// observes them (the simulator from the engine model's results, a replay from
// the responses' timing and usage.prompt_tokens_details.cached_tokens), and
// Summarize turns them into a Policy entry; what only one mode can measure
// (prefill tokens computed, queue depth over time) is filled in by that mode.
package report

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/loadgen"
)

// Report is one comparison: a trace run under several policies with the same
// cluster. On disk it is a results envelope (internal/benchjson): Tool,
// Command, Machine and Started are the envelope's, each policy's headline
// numbers its figures (Figures), and the rest of the report its details.
// The details' field names are a fixed schema: tools that read
// bench/results/ depend on them.
type Report struct {
	Tool    string            `json:"-"` // "sim" or "replay"
	Command []string          `json:"-"` // the argv that produced it
	Machine benchjson.Machine `json:"-"`
	Started time.Time         `json:"-"`

	Mode      string  `json:"mode"`  // "sim" or "replay"
	Trace     string  `json:"trace"` // trace file
	Replicas  int     `json:"replicas"`
	Profile   string  `json:"profile"`   // engine timing profile
	KVBlocks  int     `json:"kv_blocks"` // KV-cache blocks per replica
	BlockSize int     `json:"block_size"`
	TimeScale float64 `json:"time_scale"` // trace timestamps were multiplied by this
	Seed      int64   `json:"seed"`
	// Settings holds mode-specific parameters (event lag, speculative TTL, ...).
	Settings map[string]any `json:"settings,omitempty"`
	// TraceStats describes the trace (see workload.Stats).
	TraceStats TraceStats `json:"trace_stats"`
	// ClusterKVTokens is Replicas × KVBlocks × BlockSize.
	ClusterKVTokens int64 `json:"cluster_kv_tokens"`
	// KVToWorkingSet is ClusterKVTokens / TraceStats.HotWorkingSetTokens.
	KVToWorkingSet float64 `json:"kv_to_working_set"`
	// PooledHitTokens is what one LRU prefix cache of ClusterKVTokens would
	// hit serving the whole trace in order, compute ignored
	// (workload.PooledHits): the cluster's KV pooled into one cache.
	// PooledHitRate is that over TraceStats.InputTokens.
	PooledHitTokens int64    `json:"pooled_hit_tokens"`
	PooledHitRate   float64  `json:"pooled_hit_rate"`
	Policies        []Policy `json:"policies"`
}

// TraceStats describes the trace a report ran.
type TraceStats struct {
	Requests            int     `json:"requests"`
	DurationSec         float64 `json:"duration_sec"` // after time scaling
	InputTokens         int64   `json:"input_tokens"`
	OutputTokens        int64   `json:"output_tokens"`
	UniqueBlocks        int     `json:"unique_blocks"`
	HotWorkingSetTokens int64   `json:"hot_working_set_tokens"`
	// IdealHitTokens is what one unlimited engine cache would hit, running
	// the trace in order; IdealHitRate is that over InputTokens.
	IdealHitTokens int64   `json:"ideal_hit_tokens"`
	IdealHitRate   float64 `json:"ideal_hit_rate"`
}

// Policy is one policy's results.
type Policy struct {
	Name string `json:"name"` // as the router's --policy flag spells it
	// Requests is the number of requests that completed; Rejected were
	// refused by the engine (e.g. longer than a replica's KV cache).
	Requests int `json:"requests"`
	Rejected int `json:"rejected"`
	// Held counts the requests late binding held at the router before
	// placing them (PeakHeld: the most at once); AdmissionRejected those
	// of Rejected its queue refused (full, or held too long).
	Held              int `json:"held,omitempty"`
	PeakHeld          int `json:"peak_held,omitempty"`
	AdmissionRejected int `json:"admission_rejected,omitempty"`
	// PromptTokens and HitTokens are summed over completed requests, HitTokens
	// from the engines' own accounting (cached tokens at first scheduling).
	PromptTokens int64 `json:"prompt_tokens"`
	HitTokens    int64 `json:"hit_tokens"`
	// HitRate is HitTokens / PromptTokens.
	HitRate float64 `json:"hit_rate"`
	// ReuseCaptured is HitTokens / the ideal hit tokens of the same requests.
	ReuseCaptured float64 `json:"reuse_captured"`
	// ReuseVsPooled is HitRate / the report's PooledHitRate: the share of
	// what one pooled cache of the cluster's KV would hit (0 when the
	// bound is unknown; it can exceed 1, LRU not being optimal).
	ReuseVsPooled float64 `json:"reuse_vs_pooled"`
	TTFTP50Ms     float64 `json:"ttft_p50_ms"`
	TTFTP90Ms     float64 `json:"ttft_p90_ms"`
	TTFTP99Ms     float64 `json:"ttft_p99_ms"`
	TTFTMeanMs    float64 `json:"ttft_mean_ms"`
	E2EP50Ms      float64 `json:"e2e_p50_ms"`
	E2EP90Ms      float64 `json:"e2e_p90_ms"`
	E2EP99Ms      float64 `json:"e2e_p99_ms"`
	// ThroughputTokensPerSec is (prompt + output tokens of completed
	// requests) / (last finish − first arrival); OutputTokensPerSec counts
	// only generated tokens.
	ThroughputTokensPerSec float64 `json:"throughput_tokens_per_sec"`
	OutputTokensPerSec     float64 `json:"output_tokens_per_sec"`
	DurationSec            float64 `json:"duration_sec"`
	// PrefillTokensComputed counts prompt tokens the engines computed,
	// recomputation after preemption included (replay: prompt − cached).
	PrefillTokensComputed int64 `json:"prefill_tokens_computed"`
	Preemptions           int64 `json:"preemptions"`
	// MaxReplicaShare is the largest fraction of the requests one replica
	// served (1/Replicas is perfectly even).
	MaxReplicaShare float64 `json:"max_replica_share"`
	// MaxPeakQueue is the largest engine queue (waiting requests) any replica
	// had.
	MaxPeakQueue int       `json:"max_peak_queue"`
	Replicas     []Replica `json:"per_replica"`
	// TTFTCDFMs holds the TTFT quantiles 0, 1, ..., 100 % in milliseconds.
	TTFTCDFMs []float64 `json:"ttft_cdf_ms"`
	// Queue is each replica's engine queue depth over time, if measured.
	Queue *QueueSeries `json:"queue_depth,omitempty"`
	// DirectoryProblems counts engine events the agent's translator could
	// not carry to the directory, by kind (empty when all were carried).
	DirectoryProblems map[string]uint64 `json:"directory_problems,omitempty"`
	// Calibration is how well the policy's online-calibrated profile
	// followed the engines' (sim --calibrate only).
	Calibration *Calibration `json:"calibration,omitempty"`
	// WallSec is how long the run took on the wall clock.
	WallSec float64 `json:"wall_sec"`
}

// Calibration measures a run's online calibration of the policy's cost
// model (costmodel.Calibrator) against the engines' true profile: relative
// prefill error over costmodel.ShapeGrid, at a checkpoint and at the end.
// With several routers, each calibrates on its own and the errors are the
// worst router's.
type Calibration struct {
	Prior  string `json:"prior"`  // the policy's starting profile
	Engine string `json:"engine"` // the engines' profile, the truth
	// PriorErrorMax is the prior's largest relative error on the grid.
	PriorErrorMax float64 `json:"prior_error_max"`
	// CheckpointSec is the virtual time after the first arrival at which
	// the Checkpoint figures were taken (0 if the run ended before it).
	CheckpointSec          float64 `json:"checkpoint_sec"`
	CheckpointObservations uint64  `json:"checkpoint_observations"`
	CheckpointErrorMax     float64 `json:"checkpoint_error_max"`
	CheckpointErrorMean    float64 `json:"checkpoint_error_mean"`
	// Observations were fitted, Skipped were not clean (the worker had
	// work queued at placement) or refused by the calibrator.
	Observations   uint64  `json:"observations"`
	Skipped        uint64  `json:"skipped"`
	FinalErrorMax  float64 `json:"final_error_max"`
	FinalErrorMean float64 `json:"final_error_mean"`
	// Scales are router 0's fitted corrections (costmodel.CalibratorStats).
	Scales []float64 `json:"scales"`
}

// Replica is one replica's share of a policy's run.
type Replica struct {
	ID           string  `json:"id"`
	Requests     int     `json:"requests"`
	Share        float64 `json:"share"`
	PromptTokens int64   `json:"prompt_tokens"`
	HitTokens    int64   `json:"hit_tokens"`
	HitRate      float64 `json:"hit_rate"`
	PeakQueue    int     `json:"peak_queue"`
}

// QueueSeries is the largest engine queue of each replica in consecutive
// intervals (internal/loadgen measures it on live runs).
type QueueSeries = loadgen.QueueSeries

// Sample is one request as a run observed it (internal/loadgen observes
// live runs, bench/sim simulated ones).
type Sample = loadgen.Sample

// Summarize computes a Policy from the samples of one run over replicas
// named ids. It fills every field except PrefillTokensComputed, Preemptions,
// Queue and WallSec, and the per-replica PeakQueue (the caller measures
// them; MaxPeakQueue is derived from the replicas by Finish).
func Summarize(name string, ids []string, samples []Sample) (Policy, error) {
	p := Policy{Name: name, Replicas: make([]Replica, len(ids))}
	for i, id := range ids {
		p.Replicas[i].ID = id
	}
	var ttft, e2e []float64
	var ideal, output int64
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	for i := range samples {
		s := &samples[i]
		if s.Replica < 0 || s.Replica >= len(ids) {
			return Policy{}, fmt.Errorf("report: sample %d: replica %d out of range [0, %d)", i, s.Replica, len(ids))
		}
		if s.Rejected {
			p.Rejected++
			continue
		}
		if s.CachedTokens < 0 || s.CachedTokens > s.PromptTokens {
			return Policy{}, fmt.Errorf("report: sample %d: %d cached of %d prompt tokens", i, s.CachedTokens, s.PromptTokens)
		}
		r := &p.Replicas[s.Replica]
		r.Requests++
		r.PromptTokens += int64(s.PromptTokens)
		r.HitTokens += int64(s.CachedTokens)
		p.Requests++
		p.PromptTokens += int64(s.PromptTokens)
		p.HitTokens += int64(s.CachedTokens)
		ideal += int64(s.IdealCached)
		output += int64(s.OutputTokens)
		ttft = append(ttft, ms(s.FirstToken-s.Arrival))
		e2e = append(e2e, ms(s.Finish-s.Arrival))
		first = min(first, s.Arrival)
		last = max(last, s.Finish)
	}
	p.HitRate = ratio(float64(p.HitTokens), float64(p.PromptTokens))
	p.ReuseCaptured = ratio(float64(p.HitTokens), float64(ideal))
	for i := range p.Replicas {
		r := &p.Replicas[i]
		r.Share = ratio(float64(r.Requests), float64(p.Requests))
		r.HitRate = ratio(float64(r.HitTokens), float64(r.PromptTokens))
		p.MaxReplicaShare = max(p.MaxReplicaShare, r.Share)
	}
	if p.Requests > 0 {
		slices.Sort(ttft)
		slices.Sort(e2e)
		p.TTFTP50Ms, p.TTFTP90Ms, p.TTFTP99Ms = Quantile(ttft, 0.5), Quantile(ttft, 0.9), Quantile(ttft, 0.99)
		p.E2EP50Ms, p.E2EP90Ms, p.E2EP99Ms = Quantile(e2e, 0.5), Quantile(e2e, 0.9), Quantile(e2e, 0.99)
		sum := 0.0
		for _, v := range ttft {
			sum += v
		}
		p.TTFTMeanMs = sum / float64(len(ttft))
		p.TTFTCDFMs = make([]float64, 101)
		for q := range p.TTFTCDFMs {
			p.TTFTCDFMs[q] = Quantile(ttft, float64(q)/100)
		}
		p.DurationSec = (last - first).Seconds()
		p.ThroughputTokensPerSec = ratio(float64(p.PromptTokens+output), p.DurationSec)
		p.OutputTokensPerSec = ratio(float64(output), p.DurationSec)
	}
	return p, nil
}

// Finish derives the fields that depend on per-replica measurements filled
// in after Summarize (MaxPeakQueue).
func (p *Policy) Finish() {
	p.MaxPeakQueue = 0
	for _, r := range p.Replicas {
		p.MaxPeakQueue = max(p.MaxPeakQueue, r.PeakQueue)
	}
}

// RelateToPooled sets every policy's ReuseVsPooled from the report's
// PooledHitRate.
func (r *Report) RelateToPooled() {
	for i := range r.Policies {
		r.Policies[i].ReuseVsPooled = ratio(r.Policies[i].HitRate, r.PooledHitRate)
	}
}

// Quantile returns the q-quantile (0..1) of sorted values, interpolating
// linearly between order statistics; 0 for no values.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := q * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	f := pos - float64(lo)
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Validate checks that r has the schema's required content: every policy
// named, its rates in range and its quantiles ordered.
func (r *Report) Validate() error {
	if r.Replicas < 1 {
		return fmt.Errorf("report: replicas %d, want >= 1", r.Replicas)
	}
	if r.Trace == "" || r.Profile == "" {
		return fmt.Errorf("report: trace and profile must be set")
	}
	seen := make(map[string]bool)
	for i, p := range r.Policies {
		switch {
		case p.Name == "":
			return fmt.Errorf("report: policy %d has no name", i)
		case seen[p.Name]:
			return fmt.Errorf("report: policy %q appears twice", p.Name)
		case p.HitRate < 0 || p.HitRate > 1 || p.ReuseCaptured < 0 || p.ReuseCaptured > 1:
			return fmt.Errorf("report: policy %q: hit rate %v, reuse captured %v out of [0, 1]", p.Name, p.HitRate, p.ReuseCaptured)
		case p.TTFTP50Ms > p.TTFTP90Ms || p.TTFTP90Ms > p.TTFTP99Ms:
			return fmt.Errorf("report: policy %q: TTFT quantiles not ordered", p.Name)
		case len(p.Replicas) != r.Replicas:
			return fmt.Errorf("report: policy %q: %d replicas, want %d", p.Name, len(p.Replicas), r.Replicas)
		}
		seen[p.Name] = true
	}
	return nil
}
