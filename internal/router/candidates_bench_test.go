package router

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// candidatesOut is where BenchmarkDecisionCandidates writes its figures as
// a kvbench results file (make bench-router-candidates); empty: nowhere.
var candidatesOut = flag.String("candidates-out", "", "BenchmarkDecisionCandidates: write the figures as JSON to this file")

// CandidatesTool is the name of BenchmarkDecisionCandidates's results.
const CandidatesTool = "router-candidates"

// BenchmarkDecisionCandidates times the warm decision of
// BenchmarkDecisionWarm32k with 4 and with 1,024 candidate workers for the
// model, side by side: two routers, each over its own one-node directory
// and local replica, decisions alternating between them (so both share
// the machine's load). Run it once (-benchtime Nx, N decisions per
// router); with -candidates-out it writes the figures.
func BenchmarkDecisionCandidates(b *testing.B) {
	sizes := []int{4, 1024}
	fx := make([]*decisionFixture, len(sizes))
	for i, n := range sizes {
		fx[i] = newDecisionFixtureWorkers(b, n, true)
	}
	ctx := context.Background()
	times := make([][]float64, len(sizes))
	parts := make([]map[string][]float64, len(sizes))
	for i := range parts {
		parts[i] = map[string][]float64{}
	}
	b.ResetTimer()
	for it := range b.N {
		for k := range fx {
			j := (it + k) % len(fx) // alternate which goes first
			f := fx[j]
			d, aerr := f.s.decide(ctx, f.request(it+1, true), nil)
			if aerr != nil {
				b.Fatal(aerr)
			}
			if d.matchSource != f.want || d.pick.Worker != "w0" || len(d.workers) != sizes[j] {
				b.Fatalf("%d workers, iteration %d: source %s, pick %s over %d candidates", sizes[j], it, d.matchSource, d.pick.Worker, len(d.workers))
			}
			times[j] = append(times[j], us(d.renderDur+d.hashDur+d.matchDur+d.scoreDur))
			parts[j]["render"] = append(parts[j]["render"], us(d.renderDur))
			parts[j]["hash"] = append(parts[j]["hash"], us(d.hashDur))
			parts[j]["match"] = append(parts[j]["match"], us(d.matchDur))
			parts[j]["score"] = append(parts[j]["score"], us(d.scoreDur))
			d.compact(f.s) // as placing it does
		}
	}
	b.StopTimer()
	q := func(xs []float64, p float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	last := len(sizes) - 1
	b.ReportMetric(q(times[last], 0.50), "p50-µs")
	b.ReportMetric(q(times[last], 0.99), "p99-µs")
	b.ReportMetric(q(times[0], 0.50), "4w-p50-µs")
	b.ReportMetric(q(times[0], 0.99), "4w-p99-µs")
	if *candidatesOut == "" {
		return
	}
	res := benchjson.New(CandidatesTool)
	res.Command = append([]string{"go", "test", "./internal/router"}, os.Args[1:]...)
	type fig = benchjson.Figure
	details := map[string]any{"samples_per_size": b.N, "candidates": sizes, "session_tokens": 32768, "block_size": 16,
		"method": "BenchmarkDecisionCandidates (internal/router): a router over a real one-node directory, matching from its local replica " +
			"(follow.Follower), one model served by N workers of which w0 holds the session's ~32 k-token chain in the directory and " +
			"speculatively; each decision is the session plus a new ~60-token user message (render, hash, match, kvdir score), timed by " +
			"the router as the explain endpoint's decision_us; the two sizes alternate decision by decision in one process, with every " +
			"engine an in-process HTTP server scraped at 1 s for 1,024 workers (20 ms for 4)"}
	for j, n := range sizes {
		p99 := fig{Name: fmt.Sprintf("decision_p99_us_%d_workers", n), Unit: "µs", Measured: q(times[j], 0.99),
			Note: fmt.Sprintf("warm decision for one more turn of a 32 k-token session over %d candidate workers, p99", n)}
		if n == 1024 {
			p99.Target = benchjson.Max(500)
		}
		res.Figures = append(res.Figures,
			fig{Name: fmt.Sprintf("decision_p50_us_%d_workers", n), Unit: "µs", Measured: q(times[j], 0.50),
				Note: fmt.Sprintf("same over %d candidate workers, p50", n)}, p99)
		for _, part := range []string{"render", "hash", "match", "score"} {
			details[fmt.Sprintf("%s_p50_us_%d_workers", part, n)] = q(parts[j][part], 0.50)
			details[fmt.Sprintf("%s_p99_us_%d_workers", part, n)] = q(parts[j][part], 0.99)
		}
	}
	if err := res.SetDetails(details); err != nil {
		b.Fatal(err)
	}
	if err := res.Validate(); err != nil {
		b.Fatal(err)
	}
	if err := benchjson.Write(*candidatesOut, res); err != nil {
		b.Fatal(err)
	}
}
