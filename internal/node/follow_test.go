package node_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestFollowNeedsRouterRole(t *testing.T) {
	tokens := node.Tokens{Agent: "agent-secret", Router: "router-secret", Admin: "admin-secret"}
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) { cfg.Tokens = tokens })
	dir := kvdirv1.NewDirectoryServiceClient(c.Conn(0))
	for _, tc := range []struct {
		token string
		want  codes.Code
	}{{"", codes.Unauthenticated}, {tokens.Agent, codes.PermissionDenied}, {tokens.Router, codes.OK}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if tc.token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.token)
		}
		s, err := dir.Follow(ctx, &kvdirv1.FollowRequest{})
		if err == nil {
			var resp *kvdirv1.FollowResponse
			resp, err = s.Recv()
			if err == nil && resp.GetSnapshot() == nil {
				t.Fatalf("token %q: first answer from 0 is %v, want a snapshot", tc.token, resp)
			}
		}
		cancel()
		if status.Code(err) != tc.want {
			t.Fatalf("token %q: %v, want %v", tc.token, err, tc.want)
		}
	}
}

// TestFollowFromACutOffNode follows a follower node, then cuts it off
// from its peers: it stops sending keepalives (its clients' views age)
// and ends the stream once it has not heard from a leader for
// MaxStaleness, as it refuses other reads; a current node keeps
// answering.
func TestFollowFromACutOffNode(t *testing.T) {
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.MaxStaleness = 4 * time.Second })
	i := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kvdirv1.NewDirectoryServiceClient(c.Conn(i)).Follow(ctx, &kvdirv1.FollowRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot, then at least one keepalive while the node is current.
	for keepalives := 0; keepalives == 0; {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("stream from a current node: %v", err)
		}
		if e := resp.GetEntries(); e != nil && len(e.Entries) == 0 {
			keepalives++
		}
	}
	c.Isolate(i)
	cut := time.Now()
	var last time.Time
	for {
		resp, err := s.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stream from a cut-off node ended with %v, want Unavailable", err)
			}
			break
		}
		if e := resp.GetEntries(); e != nil && len(e.Entries) == 0 {
			last = time.Now()
		}
	}
	if ended := time.Since(cut); ended < 4*time.Second {
		t.Fatalf("stream ended %v after the cut, before MaxStaleness", ended)
	}
	// Keepalives stop within a heartbeat timeout plus followCurrentWithin
	// (2 s) of the cut: the in-process cluster's heartbeat timeout is far
	// below a second.
	if !last.IsZero() && last.Sub(cut) > 3*time.Second {
		// (MaxStaleness is 4 s: without the rule they would go on until then.)
		t.Fatalf("a cut-off node sent a keepalive %v after the cut", last.Sub(cut))
	}
}
