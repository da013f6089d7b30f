package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// TestBlockSizeMisconfigured runs agents told --block-size 16 beside
// engines that use 64: routing still finds turn 1's blocks (the routers
// hash with the size learned from the events), and within 30 s of traffic
// "kvdirctl status" flags the workers and names the cause.
func TestBlockSizeMisconfigured(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4", "--block-size", "64"},
		AgentArgs:  []string{"--block-size", "16"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "200ms", "--share-intents=false"}})
	start := time.Now()
	for i := range 2 {
		turnTwoFollowsTurnOne(t, ctx, f.Routers[0].URL, f.Routers[1].URL, fmt.Sprintf("bs-%d", i), i,
			turnCheck{BlockSize: 64, SystemRepeat: 3})
	}
	const cause = "agent --block-size 16, engine sends 64: set --block-size 64 or leave it unset"
	var flagged map[string]bool
	testkit.Eventually(t, 30*time.Second-time.Since(start), "kvdirctl status to flag a worker's block size", func() (bool, string) {
		out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "status", "-o", "json")
		if code != 0 {
			return false, fmt.Sprintf("exit %d: %s", code, errOut)
		}
		var st ctlview.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return false, err.Error()
		}
		flagged = map[string]bool{}
		for _, m := range st.BlockSizeMismatches {
			if m.Registered == 16 && len(m.Learned) == 1 && m.Learned[0] == 64 && strings.Contains(m.Detail, cause) {
				flagged[m.Worker] = true
			}
		}
		return len(flagged) > 0, out
	})
	t.Logf("kvdirctl status flagged %d workers %v after the traffic started", len(flagged), time.Since(start).Round(time.Millisecond))
	// The text output names the worker and the cause too.
	out, _, code := ctl(t, "--directory", f.DirectoryAddrs(), "status")
	if code != 0 || !strings.Contains(out, cause) {
		t.Fatalf("kvdirctl status (exit %d) does not name the cause:\n%s", code, out)
	}
	for w := range flagged {
		if !strings.Contains(out, "worker "+w+" block size") {
			t.Fatalf("kvdirctl status does not name worker %s:\n%s", w, out)
		}
	}
	// And workers shows the learned size.
	out, _, code = ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
	var wl ctlview.WorkerList
	if code != 0 || json.Unmarshal([]byte(out), &wl) != nil {
		t.Fatalf("kvdirctl workers (exit %d):\n%s", code, out)
	}
	for _, w := range wl.Workers {
		if flagged[w.ID] && (w.BlockSize != 16 || len(w.BlockSizes) != 1 || w.BlockSizes[0] != 64 || len(w.Groups) == 0) {
			t.Fatalf("worker %s: registered %d, learned %v, groups %v; want 16, [64] and a group", w.ID, w.BlockSize, w.BlockSizes, w.Groups)
		}
	}
}
