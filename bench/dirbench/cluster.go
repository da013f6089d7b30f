package dirbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// Converge waits until every running node has the same applied index and
// digest.
func Converge(ctx context.Context, c *fleet.Directory, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		var applied uint64
		var digest uint64
		same, first := true, true
		last = ""
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			st, err := n.Status(ctx)
			if err != nil {
				same = false
				break
			}
			last += fmt.Sprintf("%s:%d/%016x ", n.ID, st.AppliedIndex, st.Digest)
			if first {
				applied, digest, first = st.AppliedIndex, st.Digest, false
			} else if st.AppliedIndex != applied || st.Digest != digest {
				same = false
			}
		}
		if same && !first {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("nodes did not converge: %s", last)
}

func newestSnapshotSize(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return 0
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() && !strings.HasSuffix(e.Name(), ".tmp") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names) // term-index-time names sort by age
	if len(names) == 0 {
		return 0
	}
	return fleet.DirSize(filepath.Join(dir, names[len(names)-1]))
}

// restartCatchup kills a follower, restarts it on its data directory and
// times how long until it has applied what the leader had committed.
func restartCatchup(ctx context.Context, c *fleet.Directory, follower int) (float64, error) {
	n := c.Nodes[follower]
	n.Kill9()
	var target uint64
	for _, o := range c.Nodes {
		if o.Running() {
			if st, err := o.Status(ctx); err == nil && st.State == "Leader" {
				target = st.CommitIndex
			}
		}
	}
	if target == 0 {
		return 0, errors.New("no leader to catch up with")
	}
	start := time.Now()
	if err := n.Start(); err != nil {
		return 0, fmt.Errorf("restart %s: %w", n.ID, err)
	}
	deadline := start.Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if st, err := n.Status(ctx); err == nil && st.AppliedIndex >= target {
			return time.Since(start).Seconds(), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, errors.New("restarted follower did not catch up in 5 minutes")
}
