package dirbench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// BenchmarkPublishPools publishes the same workload through an in-process
// 3-node directory (real nodes and Raft, in-memory transport and stores) by
// 64 and by 1,024 workers with the same batches in flight in all: the
// in-process twin of kvbench directory --worker-pools, for a CPU profile of
// the nodes (go test -cpuprofile).
func BenchmarkPublishPools(b *testing.B) {
	for _, pool := range []int{64, 1024} {
		b.Run(fmt.Sprintf("workers=%d", pool), func(b *testing.B) {
			shape := radixtest.Full.Scaled(0.05)
			shape.Workers = pool
			wl := radixtest.Generate(shape)
			for range b.N {
				b.StopTimer()
				c := dirtest.New(b, Nodes, func(_ int, cfg *node.Config) {
					cfg.Lease, cfg.HeartbeatTimeout, cfg.ElectionTimeout = time.Hour, time.Second, time.Second
				})
				conn := c.Conn(c.Leader())
				work := Batches(wl, 256)
				if err := RegisterAll(context.Background(), conn, work); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				res := &Measures{}
				if err := publishRegistered(context.Background(), conn, work, max(1, 64*16/pool), res); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(res.EventsPerSec, "events/s")
			}
		})
	}
}
