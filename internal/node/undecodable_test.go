package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestUndecodableEntryStopsThenSkipped: a committed entry no node can
// decode (raw bytes put in the log past the node's encoding, as a forged
// Raft message would) stops every node's state machine at the entry before
// it, with reads refused; restarted as they were, the nodes refuse to start
// and name the index; restarted with that index in
// SkipUndecodableEntries, they apply it as a no-op (counted), agree, and
// take writes again.
func TestUndecodableEntryStopsThenSkipped(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	regs := map[int]*prometheus.Registry{}
	c := dirtest.New(t, 3, func(i int, cfg *node.Config) {
		regs[i] = prometheus.NewRegistry()
		cfg.Registerer = regs[i]
	})
	p := c.NewPublisher("w1", 1)
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	f := c.Node(c.Leader()).Raft().Apply([]byte{0xff, 0x01, 0x02}, 5*time.Second)
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	bad := f.Index()

	for i := range c.Size() {
		n := c.Node(i)
		select {
		case <-n.Failed():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not stop at the undecodable entry %d (applied %d)", n.ID(), bad, n.FSM().AppliedIndex())
		}
		var ue *node.UndecodableEntryError
		if !errors.As(n.Err(), &ue) || ue.Index != bad {
			t.Fatalf("%s: Err() = %v, want an UndecodableEntryError at %d", n.ID(), n.Err(), bad)
		}
		if a := n.FSM().AppliedIndex(); a >= bad {
			t.Fatalf("%s applied %d, past the undecodable entry %d", n.ID(), a, bad)
		}
		if err := node.Ready(n); err == nil || !strings.Contains(err.Error(), "cannot be decoded") {
			t.Fatalf("%s ready: %v, want the undecodable entry", n.ID(), err)
		}
		_, err := kvdirv1.NewDirectoryServiceClient(c.Conn(i)).ListWorkers(context.Background(), &kvdirv1.ListWorkersRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cannot be decoded") {
			t.Fatalf("%s: read after the stop: %v, want Unavailable naming the entry", n.ID(), err)
		}
	}

	for i := range c.Size() {
		c.Stop(i)
	}
	for i := range c.Size() {
		err := c.TryRestart(i)
		var ue *node.UndecodableEntryError
		if !errors.As(err, &ue) || ue.Index != bad || !strings.Contains(err.Error(), "SkipUndecodableEntries") {
			t.Fatalf("restart of node %d as it was: %v, want a refusal naming entry %d and the way past it", i, err, bad)
		}
	}

	c.Configure(func(_ int, cfg *node.Config) { cfg.SkipUndecodableEntries = []uint64{bad} })
	for i := range c.Size() {
		c.Restart(i)
	}
	c.Converged()
	for i, n := range c.Nodes() {
		if a := n.FSM().AppliedIndex(); a < bad {
			t.Fatalf("%s applied %d, not past the skipped entry %d", n.ID(), a, bad)
		}
		if n.Err() != nil {
			t.Fatalf("%s: %v", n.ID(), n.Err())
		}
		if got := counterSum(t, regs[i], "kvdir_raft_skipped_entries_total"); got != 1 {
			t.Fatalf("%s counted %v skipped entries, want 1", n.ID(), got)
		}
	}
	p.UseNode(c.Leader()) // a new stream: the old one went with the restarts
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	c.Check(p)
}
