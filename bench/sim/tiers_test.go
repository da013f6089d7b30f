package sim

import (
	"context"
	"testing"

	"github.com/kvdir/kvdir/internal/placement"
)

// tierSpy wraps a policy and counts the candidates it was given with
// blocks beyond the GPU run.
type tierSpy struct {
	placement.Policy
	host, disk int
}

func (s *tierSpy) Pick(req placement.Request, cands []placement.Candidate) (placement.Decision, error) {
	for _, c := range cands {
		if c.HostBlocks > 0 {
			s.host++
		}
		if c.DiskBlocks > 0 {
			s.disk++
		}
	}
	return s.Policy.Pick(req, cands)
}

// With an offload tier and a GPU cache smaller than the working set, the
// directory sees the tier's blocks on their medium, the policy gets them
// as host (or disk) blocks, and reuse from the tier shows in the hit rate:
// counting only the GPU-held run loses it.
func TestOffloadTierReachesThePolicy(t *testing.T) {
	recs, ideal := smallTrace(t)
	run := func(medium, tiers string, offload int) (float64, *tierSpy) {
		t.Helper()
		cfg := config(t, "kvdir", 600)
		cfg.OffloadBlocks, cfg.OffloadMedium, cfg.Tiers = offload, medium, tiers
		pol, err := placement.New("kvdir", placement.Options{Seed: cfg.Seed, Profile: cfg.Profile})
		if err != nil {
			t.Fatal(err)
		}
		spy := &tierSpy{Policy: pol}
		cfg.Impl = spy
		p, err := Run(context.Background(), recs, ideal, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p.HitRate, spy
	}
	none, spy := run("", TiersPriced, 0)
	if spy.host+spy.disk != 0 {
		t.Fatalf("without a tier: %d host, %d disk candidates", spy.host, spy.disk)
	}
	priced, spy := run("CPU", TiersPriced, 2400)
	if spy.host == 0 || spy.disk != 0 {
		t.Fatalf("CPU tier: %d host, %d disk candidates; want host ones only", spy.host, spy.disk)
	}
	_, spy = run("Disk", TiersPriced, 2400)
	if spy.disk == 0 || spy.host != 0 {
		t.Fatalf("disk tier: %d host, %d disk candidates; want disk ones only", spy.host, spy.disk)
	}
	asGPU, spy := run("CPU", TiersAsGPU, 2400)
	if spy.host+spy.disk != 0 {
		t.Fatalf("as-gpu: %d host, %d disk candidates", spy.host, spy.disk)
	}
	gpuOnly, _ := run("CPU", TiersGPUOnly, 2400)
	t.Logf("hit rate: no tier %.3f, priced %.3f, as-gpu %.3f, gpu-only %.3f", none, priced, asGPU, gpuOnly)
	if priced <= none+0.05 || asGPU <= none+0.05 || gpuOnly >= priced-0.02 {
		t.Fatalf("hit rate: no tier %.3f, priced %.3f, as-gpu %.3f, gpu-only %.3f", none, priced, asGPU, gpuOnly)
	}
}
