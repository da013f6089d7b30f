package dirbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// timeMatches times Match of size-block chains against node n, interleaved
// with the cheapest call there is (a gRPC health check) as the baseline of
// what any call costs on this machine.
func timeMatches(ctx context.Context, n *fleet.DirNode, wl *radixtest.Workload, size, count int) (p50, p99, base50, base99 float64, err error) {
	var chains [][]uint64
	for i := range wl.Sessions {
		if c := wl.Chain(i, size); len(c) == size {
			chains = append(chains, c)
		}
	}
	if len(chains) == 0 {
		return 0, 0, 0, 0, errors.New("no chain long enough to match")
	}
	dir := kvdirv1.NewDirectoryServiceClient(n.Conn())
	health := healthpb.NewHealthClient(n.Conn())
	var lat, base []time.Duration
	for i := range count + count/10 {
		req := &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chains[i%len(chains)], BlockSize: 16}}}
		t := time.Now()
		resp, err := dir.Match(ctx, req)
		d := time.Since(t)
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("match: %w", err)
		}
		if len(resp.Matches) == 0 {
			return 0, 0, 0, 0, errors.New("match found no worker for a published chain")
		}
		t = time.Now()
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			return 0, 0, 0, 0, fmt.Errorf("health check: %w", err)
		}
		h := time.Since(t)
		if i >= count/10 { // the first tenth warms the connection up
			lat = append(lat, d)
			base = append(base, h)
		}
	}
	return pct(lat, 0.5), pct(lat, 0.99), pct(base, 0.5), pct(base, 0.99), nil
}

// pct returns the q-quantile of ds in microseconds.
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1e3
}
