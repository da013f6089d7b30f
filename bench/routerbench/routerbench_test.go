package routerbench

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// TestRunTiny runs both phases on a fleet of processes at a tiny size and
// checks the envelope.
func TestRunTiny(t *testing.T) {
	testkit.SkipIfShort(t, "starts a fleet of directory, enginesim, agent, router and HAProxy processes")
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Skip("HAProxy, the overhead phase's baseline, is not installed (make deps installs it)")
	}
	res, err := Run(context.Background(), Options{Sessions: 1, SessionTokens: 2048, TurnTokens: 512, Warm: 3, Cold: 2,
		LatencyRequests: 100, RPSDuration: 300 * time.Millisecond, RPSClients: 2, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res.Command = []string{"kvbench", "router"}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"decision_p50_us", "decision_p99_us", "decision_cold_p99_us", PartsPrefix + "match_p50_us",
		"decision_local_p50_us", "decision_local_p99_us", "decision_local_cold_p99_us", LocalPartsPrefix + "match_p50_us",
		"direct_p50_us", "haproxy_overhead_p50_us", "overhead_ratio_vs_haproxy", "requests_per_sec", "haproxy_requests_per_sec"} {
		if f, ok := res.Figure(name); !ok || f.Measured == 0 {
			t.Errorf("figure %s: %+v, present %v", name, f, ok)
		}
	}
	var d Details
	if err := res.DecodeDetails(&d); err != nil {
		t.Fatal(err)
	}
	if d.DecisionSamples != 2 || d.DecisionColdSamples != 2 || d.LocalDecisionSamples != 2 || d.LocalDecisionOtherSource != 0 ||
		d.LatencyRequestsPerPath != 100 || d.RPSClients != 2 || d.HAProxyVersion == "" {
		t.Fatalf("details %+v", d)
	}
}
