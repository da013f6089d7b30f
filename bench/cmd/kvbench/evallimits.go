package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/kvdir/kvdir/bench/capacity"
)

// evalLimits are a member's figures that say what limits kvdir's capacity
// there, all read off the member's sweep: how much reuse is left to win,
// whether the best baseline's spread leaves load to even out, and how much
// prefill work reuse saves against round-robin.
type evalLimits struct {
	// PooledHitRate is the pooled bound (one LRU cache of the cluster's KV).
	PooledHitRate float64 `json:"pooled_hit_rate"`
	// MaxHitRate is the highest hit rate of any run of any policy in the
	// sweep, at any rate; MaxHitPolicy the policy.
	MaxHitRate   float64 `json:"max_hit_rate"`
	MaxHitPolicy string  `json:"max_hit_policy"`
	// KvdirLightHitRate is kvdir's hit rate in its run at the lowest rate
	// swept (KvdirLightMultiplier times the trace's), KvdirHitRate at its
	// capacity.
	KvdirLightHitRate    float64 `json:"kvdir_light_hit_rate"`
	KvdirLightMultiplier float64 `json:"kvdir_light_multiplier"`
	KvdirHitRate         float64 `json:"kvdir_hit_rate"`
	// ReuseHeadroom is (1 − h) / (1 − pooled), h the best baseline's hit
	// rate at its capacity: at most how much less prefill a placement
	// hitting as often as the pooled bound would compute there.
	ReuseHeadroom *float64 `json:"reuse_headroom,omitempty"`
	// BestBusiest is the best baseline's busiest replica's share of the
	// requests times the replicas (1: an even spread).
	BestBusiest *float64 `json:"best_baseline_busiest_x_replicas,omitempty"`
	// RRWorkVsKvdir is (1 − h_rr) / (1 − h_kvdir), each at its capacity:
	// the prefill round-robin computes per token kvdir computes; absent
	// when round-robin has no capacity. RRWorkVsPooled is the same against
	// the pooled bound, which no placement's reuse beats by much.
	RRWorkVsKvdir  *float64 `json:"round_robin_prefill_vs_kvdir,omitempty"`
	RRWorkVsPooled *float64 `json:"round_robin_prefill_vs_pooled,omitempty"`
	// KvdirP90VsLowest is kvdir's p90 TTFT at the best baseline's capacity
	// over the lowest of any policy there (LowestP90Policy; 1: kvdir's is
	// the lowest).
	KvdirP90VsLowest *float64 `json:"kvdir_p90_vs_lowest_at_best_baseline,omitempty"`
	LowestP90Policy  string   `json:"lowest_p90_policy"`
}

// limitsOf reads res's limits; kvdir and the best baseline may be missing
// (their figures are then absent or zero).
func limitsOf(res *capacity.Result) evalLimits {
	l := evalLimits{PooledHitRate: res.PooledHitRate, LowestP90Policy: res.LowestP90AtBestBaseline}
	for _, p := range res.Policies {
		for _, pt := range p.Points {
			if pt.HitRate > l.MaxHitRate {
				l.MaxHitRate, l.MaxHitPolicy = pt.HitRate, p.Name
			}
		}
	}
	workOver := func(h, than float64) *float64 {
		if than >= 1 {
			return nil
		}
		v := (1 - h) / (1 - than)
		return &v
	}
	if b, ok := res.Policy(res.BestBaseline); ok {
		l.ReuseHeadroom = workOver(b.HitRate, res.PooledHitRate)
		v := b.MaxReplicaShare * float64(res.Replicas)
		l.BestBusiest = &v
	}
	k, ok := res.Policy("kvdir")
	if !ok {
		return l
	}
	l.KvdirHitRate = k.HitRate
	if len(k.Points) > 0 {
		light := slices.MinFunc(k.Points, func(a, b capacity.Point) int { return cmp.Compare(a.Multiplier, b.Multiplier) })
		l.KvdirLightMultiplier, l.KvdirLightHitRate = light.Multiplier, light.HitRate
	}
	if rr, ok := res.Policy(capacity.RoundRobin); ok && rr.CapacityRPS > 0 {
		l.RRWorkVsKvdir = workOver(rr.HitRate, k.HitRate)
		l.RRWorkVsPooled = workOver(rr.HitRate, res.PooledHitRate)
	}
	if low, ok := res.Policy(res.LowestP90AtBestBaseline); ok && k.TTFTP90AtBestBaselineMs != nil &&
		low.TTFTP90AtBestBaselineMs != nil && *low.TTFTP90AtBestBaselineMs > 0 {
		v := *k.TTFTP90AtBestBaselineMs / *low.TTFTP90AtBestBaselineMs
		l.KvdirP90VsLowest = &v
	}
	return l
}

// limitsMarkdown writes the limits table of s's rows.
func limitsMarkdown(b *strings.Builder, s *evalSummary) {
	b.WriteString("\nWhat limits kvdir on each member, from the same results: the pooled bound; the highest hit rate of any policy's run at any rate; kvdir's at the lowest rate swept and at its capacity; the best baseline's reuse headroom, (1 − its hit rate) / (1 − pooled), and its busiest replica's share × replicas; the prefill round-robin computes per prompt token kvdir computes, (1 − round-robin's hit rate) / (1 − kvdir's), each at its capacity, and per token the pooled bound computes; kvdir's p90 TTFT at the best baseline's capacity over the lowest there.\n\n")
	b.WriteString("| member | pooled bound | highest hit rate (policy) | kvdir: lowest rate / capacity | best's reuse headroom | best's busiest × replicas | round-robin's prefill / kvdir's | / pooled's | kvdir p90 / lowest (policy) |\n")
	b.WriteString("|---|---:|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range s.Rows {
		l := r.Limits
		light := "–"
		if l.KvdirLightMultiplier > 0 {
			light = fmt.Sprintf("%s (%.3gx) / %s", pct(l.KvdirLightHitRate), l.KvdirLightMultiplier, pct(l.KvdirHitRate))
		}
		p90 := "–"
		if l.KvdirP90VsLowest != nil {
			p90 = fmt.Sprintf("%.2f (%s)", *l.KvdirP90VsLowest, l.LowestP90Policy)
		}
		fmt.Fprintf(b, "| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", r.Member, pct(l.PooledHitRate),
			pct(l.MaxHitRate), or(l.MaxHitPolicy, "–"), light, num2(l.ReuseHeadroom), num2(l.BestBusiest),
			num2(l.RRWorkVsKvdir), num2(l.RRWorkVsPooled), p90)
	}
}

func pct(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

func num2(v *float64) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", *v)
}
