package node_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// A batch whose sequence range spans more numbers than its events is
// refused by the leader before it is proposed (nothing reaches the Raft
// log), with a message, and the worker's honest batches still apply.
func TestPublishRefusesWideSeqRangeBeforeProposing(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	l := c.Leader()
	epoch := c.Register("w")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := kvdirv1.NewAgentServiceClient(c.Conn(l)).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(h uint64) []*kvdirv1.Event {
		return []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: []uint64{h}}}}}
	}
	before, err := c.Store(l).LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
		WorkerId: "w", Epoch: epoch, FirstSeq: 1, LastSeq: math.MaxUint64, Events: ev(1)}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil || r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED || r.Message == "" || r.RaftIndex != 0 {
		t.Fatalf("wide range: %v %v, want REJECTED with a message and no raft index", r, err)
	}
	if after, _ := c.Store(l).LastIndex(); after != before {
		t.Fatalf("raft log grew from %d to %d: the refused batch was proposed", before, after)
	}
	if err := s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
		WorkerId: "w", Epoch: epoch, FirstSeq: 1, LastSeq: 1, Events: ev(2)}}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err != nil || r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED || r.AppliedSeq != 1 {
		t.Fatalf("honest batch after the refused one: %v %v, want APPLIED at 1", r, err)
	}
}
