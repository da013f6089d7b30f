package node_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestClusterPublishThroughFollower(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	cc := c.Conn(c.Follower())
	agent := kvdirv1.NewAgentServiceClient(cc)
	ctx := context.Background()
	reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w1", BlockSize: 16, Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := agent.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain := []uint64{11, 12, 13, 14}
	if err := stream.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
		WorkerId: "w1", Epoch: reg.Epoch, FirstSeq: 1, LastSeq: 1,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}},
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		t.Fatalf("publish: %v", resp)
	}
	stream.CloseSend()
	c.Converged()
	for i := range c.Size() {
		m, err := kvdirv1.NewDirectoryServiceClient(c.Conn(i)).Match(ctx, &kvdirv1.MatchRequest{
			Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chain, BlockSize: 16}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Matches) != 1 || m.Matches[0].WorkerId != "w1" || m.Matches[0].Blocks != 4 || m.Matches[0].Tokens != 64 {
			t.Fatalf("node %d match: %v", i, m)
		}
	}
}

func TestShutdownEndsIdleStreams(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	for round := range 2 { // the leader's stream, then a follower's piped one
		i := c.Leader()
		if round == 1 {
			i = c.Follower()
		}
		testkit.Eventually(t, 10*time.Second, "the node to know the leader's API", func() (bool, string) {
			_, ok := node.LeaderAPI(c.Node(i))
			return ok, ""
		})
		s, err := kvdirv1.NewAgentServiceClient(c.Conn(i)).Publish(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Opened and idle: no batch sent yet; make sure the handler runs.
		s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{WorkerId: "nobody", Epoch: 1, FirstSeq: 1, LastSeq: 1}})
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.Stop(i)
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("shutting down node %d took %v with an idle publish stream", i, d)
		}
		if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("idle stream after shutdown: %v, want Unavailable", err)
		}
		c.Restart(i)
		c.Leader()
	}
}
