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
