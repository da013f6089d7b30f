package report

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/kvdir/kvdir/internal/benchjson"
)

// Markdown writes r as a Markdown section: the settings, then one table row
// per policy in r's order. The pooled bound and each policy's reuse against
// it are shown when r has the bound (results written before it existed
// render as they did).
func Markdown(w io.Writer, r *Report) error {
	var b strings.Builder
	pooled := r.PooledHitRate > 0
	fmt.Fprintf(&b, "`%s`\n\n", CommandLine(r.Command))
	fmt.Fprintf(&b, "Mode %s; trace `%s` (%d requests over %.1f min, ideal hit rate %.1f %%, hot working set %s tokens); "+
		"%d replicas of `%s`, %d KV blocks of %d tokens each (cluster KV %s tokens = %.2fx the working set",
		r.Mode, r.Trace, r.TraceStats.Requests, r.TraceStats.DurationSec/60, 100*r.TraceStats.IdealHitRate,
		human(float64(r.TraceStats.HotWorkingSetTokens)), r.Replicas, r.Profile, r.KVBlocks, r.BlockSize,
		human(float64(r.ClusterKVTokens)), r.KVToWorkingSet)
	if pooled {
		fmt.Fprintf(&b, "; one pooled LRU cache of that size would hit %.1f %%", 100*r.PooledHitRate)
	}
	fmt.Fprintf(&b, "); seed %d.\n\n", r.Seed)
	head, rule := "| policy | hit rate | reuse captured |", "|---|---:|---:|"
	if pooled {
		head, rule = head+" vs pooled |", rule+"---:|"
	}
	b.WriteString(head + " TTFT p50 | TTFT p90 | TTFT p99 | e2e p90 | throughput (tok/s) | prefill tokens | max share | peak queue | rejected |\n")
	b.WriteString(rule + "---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		fmt.Fprintf(&b, "| %s | %.1f %% | %.3f |", p.Name, 100*p.HitRate, p.ReuseCaptured)
		if pooled {
			fmt.Fprintf(&b, " %.3f |", p.ReuseVsPooled)
		}
		fmt.Fprintf(&b, " %s | %s | %s | %s | %s | %s | %.3f | %d | %d |\n",
			secs(p.TTFTP50Ms), secs(p.TTFTP90Ms), secs(p.TTFTP99Ms),
			secs(p.E2EP90Ms), human(p.ThroughputTokensPerSec), human(float64(p.PrefillTokensComputed)),
			p.MaxReplicaShare, p.MaxPeakQueue, p.Rejected)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// secs formats milliseconds as seconds with three significant digits.
func secs(ms float64) string {
	s := ms / 1000
	switch {
	case s >= 100:
		return fmt.Sprintf("%.0f s", s)
	case s >= 10:
		return fmt.Sprintf("%.1f s", s)
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// human formats a count with a k/M/G suffix.
func human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2f G", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2f M", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1f k", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// CommandLine joins argv for display, quoting the arguments a shell would
// split or expand.
func CommandLine(argv []string) string {
	args := slices.Clone(argv)
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$") {
			args[i] = fmt.Sprintf("%q", a)
		}
	}
	return strings.Join(args, " ")
}

// Figures are r's headline numbers, per policy (named policy.field).
func (r *Report) Figures() []benchjson.Figure {
	var out []benchjson.Figure
	for _, p := range r.Policies {
		add := func(field, unit string, v float64, note string) {
			out = append(out, benchjson.Figure{Name: p.Name + "." + field, Unit: unit, Measured: v, Note: note})
		}
		add("hit_rate", "fraction", p.HitRate, "prompt tokens served from the engines' prefix caches")
		add("reuse_captured", "fraction", p.ReuseCaptured, "hit tokens / what one unlimited cache would have hit")
		if r.PooledHitRate > 0 {
			add("reuse_vs_pooled", "fraction", p.ReuseVsPooled, "hit rate / what one LRU cache of the cluster's KV would have hit")
		}
		add("ttft_p50_ms", "ms", p.TTFTP50Ms, "time to first token, p50")
		add("ttft_p90_ms", "ms", p.TTFTP90Ms, "time to first token, p90")
		add("ttft_p99_ms", "ms", p.TTFTP99Ms, "time to first token, p99")
		add("e2e_p90_ms", "ms", p.E2EP90Ms, "end-to-end latency, p90")
		add("throughput_tokens_per_sec", "tokens/s", p.ThroughputTokensPerSec, "(prompt + output tokens) / (last finish - first arrival)")
		add("prefill_tokens_computed", "tokens", float64(p.PrefillTokensComputed), "prompt tokens the engines computed")
		add("rejected", "requests", float64(p.Rejected), "requests the engines refused")
	}
	return out
}

// ReadFile reads a report written by WriteJSON.
func ReadFile(path string) (*Report, error) {
	var r Report
	res, err := benchjson.ReadDetails(path, &r)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	r.Tool, r.Command, r.Machine, r.Started = res.Tool, res.Command, res.Machine, res.Started
	return &r, nil
}

var spaces = regexp.MustCompile(`\s+`)

// numberArray matches a JSON array of numbers spread over several lines.
var numberArray = regexp.MustCompile(`\[\s*-?[0-9][0-9.eE+-]*(?:,\s*-?[0-9][0-9.eE+-]*)*\s*\]`)

// WriteJSON writes r as a results envelope, indented, with arrays of numbers
// kept on one line (the CDFs and queue series would otherwise take a line
// per value).
func WriteJSON(path string, r *Report) error {
	res := &benchjson.Results{Tool: r.Tool, Command: r.Command, Machine: r.Machine, Started: r.Started, Figures: r.Figures()}
	if err := res.SetDetails(r); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := res.Validate(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	b, err := benchjson.Encode(res)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	b = numberArray.ReplaceAllFunc(b, func(m []byte) []byte {
		return spaces.ReplaceAll(m, nil)
	})
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
