package chaos

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// TestSynthetic runs the synthetic worker against an in-process directory:
// its acknowledged block events grow at about its rate, the directory holds
// at most its resident set, and the directory has applied every batch the
// worker counts as acknowledged.
func TestSynthetic(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	c.Leader()
	dc, err := dirclient.New(dirclient.Config{Addrs: c.APIAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	ctx := context.Background()
	const rate, resident = 20000, 4096
	s, err := NewSynthetic(ctx, SyntheticConfig{Client: dc, WorkerID: "synthetic", Rate: rate, Resident: resident})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	s.Resume()
	testkit.Eventually(t, 20*time.Second, "acknowledged block events", func() (bool, string) {
		n := s.Acked()
		return n >= rate, "acked " + itoa(n)
	})
	if err := s.Pause(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start).Seconds()
	if got := float64(s.Acked()) / el; got > 1.2*rate {
		t.Fatalf("%.0f block events/s acknowledged, more than the rate %d", got, rate)
	}
	ws, err := dc.ListWorkers(ctx, "", false)
	if err != nil {
		t.Fatal(err)
	}
	epoch, seq := s.Position()
	if len(ws.Workers) != 1 {
		t.Fatalf("%d workers", len(ws.Workers))
	}
	w := ws.Workers[0]
	if w.Epoch != epoch || w.AppliedSeq < seq || seq == 0 {
		t.Fatalf("directory: epoch %d applied_seq %d; worker acknowledged %d in epoch %d", w.Epoch, w.AppliedSeq, seq, epoch)
	}
	if w.Blocks > resident+chainLen || w.Blocks < resident/2 {
		t.Fatalf("directory holds %d blocks of the worker; resident set %d", w.Blocks, resident)
	}
	if regs, stops, lost := s.Stats(); regs != 1 || stops != 0 || lost != 0 {
		t.Fatalf("registrations %d, stops %d, lost %d; problems %v", regs, stops, lost, s.TakeProblems())
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
