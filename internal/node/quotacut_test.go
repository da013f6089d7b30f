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

// lastPublish decodes the newest publish command in node i's Raft log.
func lastPublish(t *testing.T, c *dirtest.Cluster, i int) (*kvdirv1.PublishCommand, int) {
	t.Helper()
	last, err := c.Store(i).LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	for idx := last; idx > 0; idx-- {
		var l raft.Log
		if err := c.Store(i).GetLog(idx, &l); err != nil || l.Type != raft.LogCommand {
			continue
		}
		d, err := raftfsm.Decode(l.Data)
		if err != nil {
			t.Fatal(err)
		}
		if pc, ok := d.Payload.(*kvdirv1.PublishCommand); ok {
			return pc, len(l.Data)
		}
	}
	t.Fatal("no publish command in the log")
	return nil, 0
}

// Once a worker went over its block quota, the leader cuts the blocks past
// it before proposing (they never reach the Raft log), and every replica
// counts them as dropped as if it had cut them; blocks a batch in flight
// removes are room.
func TestLeaderCutsPastQuotaBeforeProposing(t *testing.T) {
	const quota = 100
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.WorkerBlockQuota = quota })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := c.Leader()
	leader := kvdirv1.NewAgentServiceClient(c.Conn(l))
	r, err := leader.Register(ctx, &kvdirv1.RegisterRequest{Worker: spec("w")})
	if err != nil {
		t.Fatal(err)
	}
	next, seq := uint64(1), uint64(0)
	chain := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	send := func(agent kvdirv1.AgentServiceClient, b *kvdirv1.EventBatch) *kvdirv1.PublishResponse {
		t.Helper()
		resp, err := publishOne(ctx, agent, b)
		if err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			t.Fatalf("batch %d: %v %v", b.FirstSeq, resp, err)
		}
		return resp
	}
	stored := func(n int) *kvdirv1.EventBatch {
		seq++
		return storedBatch("w", r.Epoch, seq, chain(n)...)
	}
	// The state machine cuts the first time; then the leader, once it has
	// seen the log applied in its term.
	send(leader, stored(quota+20))
	var dropped uint64 = 20
	if err := testkit.Poll(ctx, 10*time.Second, "the leader cutting", func() (bool, string) {
		send(leader, stored(1))
		dropped++
		pc, _ := lastPublish(t, c, l)
		return len(pc.QuotaCut) == 1 && pc.QuotaCut[0] == 1, fmt.Sprint(pc.QuotaCut)
	}); err != nil {
		t.Fatal(err)
	}
	// A large batch through a follower: none of its blocks is logged.
	resp := send(kvdirv1.NewAgentServiceClient(c.Conn(c.Follower())), stored(10_000))
	dropped += 10_000
	if !strings.Contains(resp.Message, "10000 blocks past the worker's quota") {
		t.Fatalf("message %q", resp.Message)
	}
	pc, size := lastPublish(t, c, l)
	if len(pc.QuotaCut) != 1 || pc.QuotaCut[0] != 10_000 || len(pc.Batches[0].Events[0].GetStored().GetHashes()) != 0 || size > 1000 {
		t.Fatalf("logged: cut %v, %d hashes, %d bytes; want all 10000 cut",
			pc.QuotaCut, len(pc.Batches[0].Events[0].GetStored().GetHashes()), size)
	}

	// A removal in flight is room for the batch behind it on the stream.
	s, err := leader.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seq++
	rm := &kvdirv1.EventBatch{WorkerId: "w", Epoch: r.Epoch, FirstSeq: seq, LastSeq: seq, Events: []*kvdirv1.Event{
		{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}}}}}
	for _, b := range []*kvdirv1.EventBatch{rm, stored(15)} {
		if err := s.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if resp, err := s.Recv(); err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			t.Fatalf("pipelined: %v %v", resp, err)
		}
	}
	s.CloseSend()
	dropped += 5

	c.Converged()
	for i := range c.Size() {
		w, _ := c.Node(i).FSM().Worker("w")
		if w.Blocks != quota || w.DroppedBlocks != dropped {
			t.Fatalf("node %d: blocks %d dropped %d, want %d, %d", i, w.Blocks, w.DroppedBlocks, quota, dropped)
		}
	}
}
