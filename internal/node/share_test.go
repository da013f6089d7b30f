package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// shareClient is a router's Share stream in a test, with what it received.
type shareClient struct {
	stream kvdirv1.DirectoryService_ShareClient
	got    chan *kvdirv1.ShareResponse
	err    chan error
}

func openShare(t *testing.T, c *dirtest.Cluster, i int, first *kvdirv1.ShareRequest) *shareClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := kvdirv1.NewDirectoryServiceClient(c.Conn(i)).Share(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	s := &shareClient{stream: stream, got: make(chan *kvdirv1.ShareResponse, 64), err: make(chan error, 1)}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				s.err <- err
				return
			}
			s.got <- resp
		}
	}()
	return s
}

// next waits for the next message.
func (s *shareClient) next(t *testing.T) *kvdirv1.ShareResponse {
	t.Helper()
	select {
	case r := <-s.got:
		return r
	case err := <-s.err:
		t.Fatalf("share stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no share message within 10 s")
	}
	return nil
}

// waitIntent waits until a message carries the intent id of router.
func (s *shareClient) waitIntent(t *testing.T, router string, id, version uint64) *kvdirv1.PlacementIntent {
	t.Helper()
	for {
		for _, p := range s.next(t).Intents {
			if p.RouterId == router && p.IntentId == id && p.Version == version {
				return p
			}
		}
	}
}

func intent(router string, id, version uint64, worker string, state kvdirv1.IntentState, chain ...uint64) *kvdirv1.PlacementIntent {
	return &kvdirv1.PlacementIntent{RouterId: router, IntentId: id, Version: version, WorkerId: worker, Chain: chain,
		BlockSize: 16, PromptTokens: 4096, UncachedTokens: 1000, State: state,
		Ttl: durationpb.New(30 * time.Second), Hold: durationpb.New(30 * time.Second)}
}

// TestShareRelaysIntentsBetweenNodes connects one router to node 0 and
// another to node 1: each gets the other's intents (relayed from node to
// node), never its own, and each node lists the router it serves.
func TestShareRelaysIntentsBetweenNodes(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	c.WaitMembers()
	a := openShare(t, c, 0, &kvdirv1.ShareRequest{RouterId: "router-a"})
	b := openShare(t, c, 1, &kvdirv1.ShareRequest{RouterId: "router-b"})
	for _, s := range []*shareClient{a, b} {
		if first := s.next(t); !first.Replace {
			t.Fatalf("first message %v does not replace the router's set", first)
		}
	}
	if err := a.stream.Send(&kvdirv1.ShareRequest{Intents: []*kvdirv1.PlacementIntent{
		intent("router-a", 1, 1, "w0", kvdirv1.IntentState_INTENT_STATE_QUEUED, 11, 12, 13)}}); err != nil {
		t.Fatal(err)
	}
	got := b.waitIntent(t, "router-a", 1, 1)
	if got.WorkerId != "w0" || len(got.Chain) != 3 || got.UncachedTokens != 1000 || got.Ttl.AsDuration() <= 0 ||
		got.Ttl.AsDuration() > 30*time.Second {
		t.Fatalf("router b got %v", got)
	}
	// An update, and an intent of b's that a gets; a hears nothing of its own.
	if err := a.stream.Send(&kvdirv1.ShareRequest{Intents: []*kvdirv1.PlacementIntent{
		intent("router-a", 1, 2, "w0", kvdirv1.IntentState_INTENT_STATE_PREFILLED, 11, 12, 13)}}); err != nil {
		t.Fatal(err)
	}
	if got := b.waitIntent(t, "router-a", 1, 2); got.State != kvdirv1.IntentState_INTENT_STATE_PREFILLED {
		t.Fatalf("update reached b as %v", got)
	}
	if err := b.stream.Send(&kvdirv1.ShareRequest{Intents: []*kvdirv1.PlacementIntent{
		intent("", 7, 1, "w1", kvdirv1.IntentState_INTENT_STATE_QUEUED, 21)}}); err != nil {
		t.Fatal(err)
	}
	if got := a.waitIntent(t, "router-b", 7, 1); got.WorkerId != "w1" {
		t.Fatalf("router a got %v", got)
	}
	// Node 2 serves no router, holds both intents (relayed) and a router
	// that connects there now gets both at once.
	late := openShare(t, c, 2, &kvdirv1.ShareRequest{RouterId: "router-c"})
	seen := map[string]bool{}
	for len(seen) < 2 {
		for _, p := range late.next(t).Intents {
			seen[fmt.Sprintf("%s/%d", p.RouterId, p.IntentId)] = true
		}
	}
	if !seen["router-a/1"] || !seen["router-b/7"] {
		t.Fatalf("a router connecting to node 2 got %v", seen)
	}
	for i, want := range []string{"router-a", "router-b", "router-c"} {
		st, err := kvdirv1.NewAdminServiceClient(c.Conn(i)).Status(context.Background(), &kvdirv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routers) != 1 || st.Routers[0].RouterId != want || st.Routers[0].NodeId != c.Node(i).ID() {
			t.Fatalf("node %d lists routers %v, want only %s", i, st.Routers, want)
		}
		if st.Intents != 2 {
			t.Fatalf("node %d holds %d intents, want 2", i, st.Intents)
		}
	}
	// A router that leaves is no longer listed.
	late.stream.CloseSend()
	testkit.Eventually(t, 5*time.Second, "node 2 to forget router-c", func() (bool, string) {
		st, err := kvdirv1.NewAdminServiceClient(c.Conn(2)).Status(context.Background(), &kvdirv1.StatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		return len(st.Routers) == 0, fmt.Sprint(st.Routers)
	})
}

// TestShareChecksRouterDigests: a node compares a following router's
// reported digest with its own at the router's applied index.
func TestShareChecksRouterDigests(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	n := c.Node(0)
	c.Converged()
	idx, dig := n.FSM().AppliedIndex(), n.FSM().Digest()
	openShare(t, c, 0, &kvdirv1.ShareRequest{RouterId: "good", NoIntents: true,
		View: &kvdirv1.RouterView{Follows: true, Synced: true, AppliedIndex: idx, Digest: dig}})
	openShare(t, c, 0, &kvdirv1.ShareRequest{RouterId: "bad", NoIntents: true,
		View: &kvdirv1.RouterView{Follows: true, Synced: true, AppliedIndex: idx, Digest: dig ^ 1}})
	testkit.Eventually(t, 5*time.Second, "both routers checked", func() (bool, string) {
		st, err := kvdirv1.NewAdminServiceClient(c.Conn(0)).Status(context.Background(), &kvdirv1.StatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		if len(st.Routers) != 2 {
			return false, fmt.Sprint(st.Routers)
		}
		for _, r := range st.Routers {
			if !r.DigestChecked || r.CheckedIndex != idx || r.CheckedNodeDigest != dig {
				return false, fmt.Sprint(r)
			}
			if agree := r.CheckedRouterDigest == r.CheckedNodeDigest; agree != (r.RouterId == "good") {
				t.Fatalf("router %s: digests %x vs %x", r.RouterId, r.CheckedRouterDigest, r.CheckedNodeDigest)
			}
		}
		return true, ""
	})
}

func TestShareRefusesBadInput(t *testing.T) {
	tokens := node.Tokens{Agent: "agent-secret", Router: "router-secret", Admin: "admin-secret"}
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) { cfg.Tokens = tokens })
	open := func(token string, first *kvdirv1.ShareRequest, more ...*kvdirv1.ShareRequest) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		s, err := kvdirv1.NewDirectoryServiceClient(c.Conn(0)).Share(ctx)
		if err != nil {
			return err
		}
		for _, m := range append([]*kvdirv1.ShareRequest{first}, more...) {
			if err := s.Send(m); err != nil {
				break // the answer comes from Recv
			}
		}
		for {
			if _, err := s.Recv(); err != nil {
				return err
			}
		}
	}
	hello := &kvdirv1.ShareRequest{RouterId: "r"}
	for _, tc := range []struct {
		name  string
		token string
		msgs  []*kvdirv1.ShareRequest
		want  codes.Code
	}{
		{"no token", "", []*kvdirv1.ShareRequest{hello}, codes.Unauthenticated},
		{"agent token", tokens.Agent, []*kvdirv1.ShareRequest{hello}, codes.PermissionDenied},
		{"no router id", tokens.Router, []*kvdirv1.ShareRequest{{}}, codes.InvalidArgument},
		{"another router's intent", tokens.Router, []*kvdirv1.ShareRequest{hello, {Intents: []*kvdirv1.PlacementIntent{
			intent("other", 1, 1, "w0", kvdirv1.IntentState_INTENT_STATE_QUEUED)}}}, codes.InvalidArgument},
		{"chain too long", tokens.Router, []*kvdirv1.ShareRequest{hello, {Intents: []*kvdirv1.PlacementIntent{
			intent("r", 1, 1, "w0", kvdirv1.IntentState_INTENT_STATE_QUEUED, make([]uint64, node.MaxIntentChain+1)...)}}}, codes.InvalidArgument},
	} {
		err := open(tc.token, tc.msgs[0], tc.msgs[1:]...)
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
