package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// startDirectory starts a directory cluster of size cmd/directory
// processes with extra flags; it stops at the end of t, after logging the
// tail of every node's output if t failed (or TEST_DUMP_LOGS is set).
func startDirectory(t *testing.T, size int, extra ...string) *fleet.Directory {
	t.Helper()
	bin := testkit.Binary(t, "directory")
	d, err := fleet.StartDirectory(bin, t.TempDir(), size, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() || os.Getenv("TEST_DUMP_LOGS") != "" {
			t.Log(d.Logs(150))
		}
	})
	return d
}

// waitLeader waits until the running nodes agree on a running leader that
// is ready, and returns its index.
func waitLeader(t *testing.T, d *fleet.Directory, timeout time.Duration) int {
	t.Helper()
	l, err := d.WaitLeader(timeout)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
