package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/raftfsm"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// pipeline sends batches on one stream without waiting, and says whether
// each was applied.
func pipeline(ctx context.Context, agent kvdirv1.AgentServiceClient, bs []*kvdirv1.EventBatch) bool {
	s, err := agent.Publish(ctx)
	if err != nil {
		return false
	}
	defer s.CloseSend()
	for _, b := range bs {
		if s.Send(&kvdirv1.PublishRequest{Batch: b}) != nil {
			return false
		}
	}
	for range bs {
		if resp, err := s.Recv(); err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			return false
		}
	}
	return true
}

// logged finds, in node i's Raft log, the publish command that first
// carried the batch of sequence number seq, and its encoded size.
func logged(t *testing.T, c *dirtest.Cluster, i int, seq uint64) (*kvdirv1.PublishCommand, int, bool) {
	t.Helper()
	last, err := c.Store(i).LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	first, _ := c.Store(i).FirstIndex()
	var found *kvdirv1.PublishCommand
	var size int
	for idx := last; idx >= max(first, 1); idx-- {
		var l raft.Log
		if err := c.Store(i).GetLog(idx, &l); err != nil || l.Type != raft.LogCommand {
			continue
		}
		d, err := raftfsm.Decode(l.Data)
		if err != nil {
			t.Fatal(err)
		}
		if pc, ok := d.Payload.(*kvdirv1.PublishCommand); ok && len(pc.Batches) == 1 && pc.Batches[0].FirstSeq == seq {
			found, size = pc, len(l.Data)
		}
	}
	return found, size, found != nil
}

// cutAll says whether the command cut every block of its one batch.
func cutAll(pc *kvdirv1.PublishCommand, n uint64) bool {
	return len(pc.QuotaCut) == 1 && pc.QuotaCut[0] == n && len(pc.Batches[0].Events[0].GetStored().GetHashes()) == 0
}

// Once a worker went over its block quota, the leader cuts the blocks past
// it before proposing (they never reach the Raft log), and every replica
// counts them as dropped as if it had cut them; blocks a batch in flight
// removes are room.
func TestLeaderCutsPastQuotaBeforeProposing(t *testing.T) {
	const quota = 100
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.WorkerBlockQuota = quota })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	epoch := c.Register("w")
	next, seq := uint64(1), uint64(0)
	chain := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	// send publishes b through node at (a follower forwards it) until it is
	// acknowledged, as an agent re-sends across leader changes; a re-sent
	// batch that had applied is a DUPLICATE.
	send := func(at func() int, b *kvdirv1.EventBatch) *kvdirv1.PublishResponse {
		t.Helper()
		var resp *kvdirv1.PublishResponse
		testkit.Eventually(t, 20*time.Second, fmt.Sprintf("batch %d acknowledged", b.FirstSeq), func() (bool, string) {
			r, err := publishOne(ctx, kvdirv1.NewAgentServiceClient(c.Conn(at())), b)
			if err != nil {
				return false, err.Error()
			}
			resp = r
			return r.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED || r.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE, r.String()
		})
		return resp
	}
	stored := func(n int) *kvdirv1.EventBatch {
		seq++
		return storedBatch("w", epoch, seq, chain(n)...)
	}
	// The state machine cuts the first time; then the leader, once it has
	// seen the log applied in its term.
	send(c.Leader, stored(quota+20))
	var dropped uint64 = 20
	// A large batch through a follower: none of its blocks is logged (a
	// leader elected meanwhile cuts once it has applied its log: send
	// another).
	testkit.Eventually(t, 30*time.Second, "a batch past the quota cut by the leader", func() (bool, string) {
		b := stored(10_000)
		resp := send(c.Follower, b)
		dropped += 10_000
		if resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED && !strings.Contains(resp.Message, "10000 blocks past the worker's quota") {
			t.Fatalf("message %q", resp.Message)
		}
		pc, size, ok := logged(t, c, c.Leader(), b.FirstSeq)
		if !ok {
			return false, "not in the leader's log"
		}
		if cutAll(pc, 10_000) && size > 1000 {
			t.Fatalf("a cut batch took %d bytes in the log", size)
		}
		return cutAll(pc, 10_000), fmt.Sprintf("cut %v", pc.QuotaCut)
	})

	// A removal in flight is room for the batch behind it on the stream
	// (and, re-sent one by one after a failure, the removal applied is).
	seq++
	rm := &kvdirv1.EventBatch{WorkerId: "w", Epoch: epoch, FirstSeq: seq, LastSeq: seq, Events: []*kvdirv1.Event{
		{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}}}}}
	pair := []*kvdirv1.EventBatch{rm, stored(15)}
	if !pipeline(ctx, kvdirv1.NewAgentServiceClient(c.Conn(c.Leader())), pair) {
		for _, b := range pair {
			send(c.Leader, b)
		}
	}
	dropped += 5

	c.Converged()
	for i := range c.Size() {
		w, _ := c.Node(i).FSM().Worker("w")
		if w.Blocks != quota || w.DroppedBlocks != dropped {
			t.Fatalf("node %d: blocks %d dropped %d, want %d, %d", i, w.Blocks, w.DroppedBlocks, quota, dropped)
		}
	}
}
