package node

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestPeerRelaysDoNotTakeRouterStreams checks that the Share streams other
// nodes open to relay their routers' intents (with the router token, marked
// with the relaying node) count under each node, so that a router still
// gets its --max-streams-per-credential streams on a node with peers, and
// that a relay claimed for a non-member counts as the router's own.
func TestPeerRelaysDoNotTakeRouterStreams(t *testing.T) {
	a, err := newAuthorizer(Tokens{Router: "router-secret-0123456789", Admin: "admin-secret-0123456789", Agent: "agent-secret-0123456789"},
		nil, 2, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.member = func(id string) bool { return id == "n1" || id == "n2" }
	ctx := func(relay ...string) context.Context {
		md := metadata.Pairs("authorization", "Bearer router-secret-0123456789")
		for _, r := range relay {
			md.Append(kvdirv1.MetadataRelay, r)
		}
		return metadata.NewIncomingContext(context.Background(), md)
	}
	acquire := func(what string, c context.Context, method string) error {
		t.Helper()
		_, err := a.acquireStream(c, method)
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: %v", what, err)
		}
		return err
	}
	for _, peer := range []string{"n1", "n2"} {
		if err := acquire("relay from "+peer, ctx(peer), shareMethod); err != nil {
			t.Fatalf("relay from %s: %v", peer, err)
		}
	}
	for i := range 2 {
		if err := acquire("router stream", ctx(), "/kvdir.v1.DirectoryService/Follow"); err != nil {
			t.Fatalf("router stream %d of 2 beside two peers' relays: %v", i+1, err)
		}
	}
	if err := acquire("third router stream", ctx(), shareMethod); err == nil {
		t.Fatal("a third router stream was not refused")
	}
	// Claims of a non-member, or of several nodes at once, are the router's.
	for _, claim := range [][]string{{"n9"}, {"n1", "n2"}} {
		if err := acquire("relay claim", ctx(claim...), shareMethod); err == nil {
			t.Fatalf("a relay claimed for %v was not counted as the router's", claim)
		}
	}
	// A peer's relays are bounded too.
	if err := acquire("second relay from n1", ctx("n1"), shareMethod); err != nil {
		t.Fatalf("second relay from n1: %v", err)
	}
	if err := acquire("third relay from n1", ctx("n1"), shareMethod); err == nil {
		t.Fatal("a third relay stream from n1 was not refused")
	}
}
