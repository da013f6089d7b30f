package node_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

func TestRolesAreEnforced(t *testing.T) {
	tokens := node.Tokens{Agent: "agent-secret", Router: "router-secret", Admin: "admin-secret"}
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.Tokens = tokens })
	cc := c.Conn(c.Follower())
	agent, dir, admin := kvdirv1.NewAgentServiceClient(cc), kvdirv1.NewDirectoryServiceClient(cc), kvdirv1.NewAdminServiceClient(cc)
	bg := context.Background()
	spec := &kvdirv1.WorkerSpec{Id: "w1", BlockSize: 16, Model: "m"}
	code := func(err error) codes.Code { return status.Code(err) }

	// No token, a wrong token.
	if _, err := dir.ListWorkers(bg, &kvdirv1.ListWorkersRequest{}); code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	if _, err := dir.ListWorkers(withToken(bg, "nope"), &kvdirv1.ListWorkersRequest{}); code(err) != codes.Unauthenticated {
		t.Fatalf("unknown token: %v", err)
	}
	// The agent registers and publishes for its worker only.
	actx := withToken(bg, tokens.Agent)
	reg, err := agent.Register(actx, &kvdirv1.RegisterRequest{Worker: spec})
	if err != nil || reg.WorkerToken == "" {
		t.Fatalf("agent register: %v %v", reg, err)
	}
	if _, err := agent.Heartbeat(actx, &kvdirv1.HeartbeatRequest{WorkerId: "w1", Epoch: reg.Epoch}); code(err) != codes.PermissionDenied {
		t.Fatalf("heartbeat without the worker token: %v", err)
	}
	wctx := metadata.AppendToOutgoingContext(actx, node.MDWorkerToken, reg.WorkerToken)
	if hb, err := agent.Heartbeat(wctx, &kvdirv1.HeartbeatRequest{WorkerId: "w1", Epoch: reg.Epoch}); err != nil || !hb.Known {
		t.Fatalf("heartbeat with the worker token: %v %v", hb, err)
	}
	reg2, err := agent.Register(actx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w2", BlockSize: 16}})
	if err != nil {
		t.Fatal(err)
	}
	// w1's token does not open w2.
	if _, err := agent.Heartbeat(wctx, &kvdirv1.HeartbeatRequest{WorkerId: "w2", Epoch: reg2.Epoch}); code(err) != codes.PermissionDenied {
		t.Fatalf("heartbeat for another worker: %v", err)
	}
	s, err := agent.Publish(wctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{WorkerId: "w2", Epoch: reg2.Epoch, FirstSeq: 1, LastSeq: 1}})
	if _, err := s.Recv(); code(err) != codes.PermissionDenied {
		t.Fatalf("publish for another worker: %v", err)
	}
	if _, err := dir.ListWorkers(actx, &kvdirv1.ListWorkersRequest{}); code(err) != codes.PermissionDenied {
		t.Fatalf("agent reading the directory: %v", err)
	}
	// The router reads and records sessions, nothing else.
	rctx := withToken(bg, tokens.Router)
	if _, err := dir.ListWorkers(rctx, &kvdirv1.ListWorkersRequest{}); err != nil {
		t.Fatalf("router read: %v", err)
	}
	if _, err := dir.RecordSessions(rctx, &kvdirv1.RecordSessionsRequest{Sessions: []*kvdirv1.SessionRecord{{SessionId: "s", WorkerId: "w1"}}}); err != nil {
		t.Fatalf("router records a session: %v", err)
	}
	if _, err := admin.Status(rctx, &kvdirv1.StatusRequest{}); err != nil {
		t.Fatalf("router status: %v", err)
	}
	if _, err := agent.Register(rctx, &kvdirv1.RegisterRequest{Worker: spec}); code(err) != codes.PermissionDenied {
		t.Fatalf("router registering: %v", err)
	}
	for name, call := range map[string]func(context.Context) error{
		"drain": func(ctx context.Context) error {
			_, err := admin.DrainWorker(ctx, &kvdirv1.DrainWorkerRequest{WorkerId: "w1"})
			return err
		},
		"remove": func(ctx context.Context) error {
			_, err := admin.RemoveMember(ctx, &kvdirv1.RemoveMemberRequest{Id: "n9"})
			return err
		},
		"add": func(ctx context.Context) error {
			_, err := admin.AddMember(ctx, &kvdirv1.AddMemberRequest{Id: "n9", RaftAddress: "x"})
			return err
		},
	} {
		if err := call(rctx); code(err) != codes.PermissionDenied {
			t.Fatalf("router %s: %v", name, err)
		}
		if err := call(actx); code(err) != codes.PermissionDenied {
			t.Fatalf("agent %s: %v", name, err)
		}
	}
	// The administrator may do everything.
	if _, err := admin.DrainWorker(withToken(bg, tokens.Admin), &kvdirv1.DrainWorkerRequest{WorkerId: "w1"}); err != nil {
		t.Fatalf("admin drain: %v", err)
	}
}

func TestDirectoryReadsAndWatch(t *testing.T) {
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.HTTPAddr = "127.0.0.1:0" })
	f := c.Follower()
	cc := c.Conn(f)
	dir := kvdirv1.NewDirectoryServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	watch, err := dir.WatchWorkers(ctx, &kvdirv1.WatchWorkersRequest{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := watch.Recv()
	if err != nil || !first.Snapshot || len(first.Workers) != 0 {
		t.Fatalf("first watch message: %v %v", first, err)
	}

	// A worker holds a prompt's blocks, hashed as the router would.
	h, err := blockhash.New(blockhash.Namespace{Model: "m", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 16*10+5)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	chain := h.Chain(nil, tokens, nil)
	epoch := c.Register("w1")
	s, err := kvdirv1.NewAgentServiceClient(cc).Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{WorkerId: "w1", Epoch: epoch, FirstSeq: 1, LastSeq: 1,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain[:6]}}}}}})
	if r, err := s.Recv(); err != nil || r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		t.Fatalf("publish: %v %v", r, err)
	}
	// The watch sees the registration.
	ev, err := watch.Recv()
	if err != nil || len(ev.Workers) != 1 || ev.Workers[0].Spec.Id != "w1" {
		t.Fatalf("watch event: %v %v", ev, err)
	}
	// Match by tokens (consistent, through the leader) and by chain.
	m, err := dir.Match(ctx, &kvdirv1.MatchRequest{Consistent: true, Query: &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{
		TokenIds: tokens, Namespace: &kvdirv1.Namespace{Model: "m", BlockSize: 16}}}})
	if err != nil || m.ChainBlocks != 10 || len(m.Matches) != 1 || m.Matches[0].Blocks != 6 || m.Matches[0].Tokens != 96 {
		t.Fatalf("token match: %v %v", m, err)
	}
	if !m.Read.FromLeader {
		t.Fatal("consistent read not served by the leader")
	}
	if _, err := dir.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{TokenIds: tokens}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("token match without namespace: %v", err)
	}
	// Sessions and who-holds.
	if _, err := dir.RecordSessions(ctx, &kvdirv1.RecordSessionsRequest{Sessions: []*kvdirv1.SessionRecord{
		{SessionId: "chat-1", Tail: chain[5], Blocks: 6, WorkerId: "w1", BlockSize: 16, PromptTokens: 100, CachedTokens: 64},
		{SessionId: "chat-2", Tail: chain[2], Blocks: 3, WorkerId: "w1", BlockSize: 16},
		{SessionId: "other", Tail: 12345, Blocks: 1, WorkerId: "w1", BlockSize: 16},
	}}); err != nil {
		t.Fatal(err)
	}
	c.Converged()
	who, err := dir.WhoHolds(ctx, &kvdirv1.WhoHoldsRequest{Target: &kvdirv1.WhoHoldsRequest_SessionId{SessionId: "chat-1"}})
	if err != nil || len(who.Sessions) != 1 || len(who.Sessions[0].Holders) != 1 || who.Sessions[0].Holders[0].Tokens != 96 {
		t.Fatalf("who-holds: %v %v", who, err)
	}
	who, err = dir.WhoHolds(ctx, &kvdirv1.WhoHoldsRequest{Target: &kvdirv1.WhoHoldsRequest_SessionPrefix{SessionPrefix: "chat-"}})
	if err != nil || len(who.Sessions) != 2 {
		t.Fatalf("who-holds by prefix: %v %v", who, err)
	}
	if _, err := dir.WhoHolds(ctx, &kvdirv1.WhoHoldsRequest{Target: &kvdirv1.WhoHoldsRequest_SessionId{SessionId: "nope"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("who-holds unknown session: %v", err)
	}
	ls, err := dir.ListSessions(ctx, &kvdirv1.ListSessionsRequest{SessionPrefix: "chat"})
	if err != nil || len(ls.Sessions) != 2 || ls.Total != 3 {
		t.Fatalf("list sessions: %v %v", ls, err)
	}
	gw, err := dir.GetWorker(ctx, &kvdirv1.GetWorkerRequest{WorkerId: "w1", TopChains: 5})
	if err != nil || gw.Worker.Blocks != 6 || len(gw.Chains) != 1 || gw.Chains[0].Blocks != 6 || gw.Chains[0].Tail != chain[5] {
		t.Fatalf("get worker: %v %v", gw, err)
	}
	if _, err := dir.GetWorker(ctx, &kvdirv1.GetWorkerRequest{WorkerId: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get unknown worker: %v", err)
	}
	// Drain shows in the watch.
	if _, err := kvdirv1.NewAdminServiceClient(cc).DrainWorker(ctx, &kvdirv1.DrainWorkerRequest{WorkerId: "w1"}); err != nil {
		t.Fatal(err)
	}
	ev, err = watch.Recv()
	if err != nil || ev.Workers[0].State != kvdirv1.WorkerState_WORKER_STATE_DRAINING {
		t.Fatalf("watch drain: %v %v", ev, err)
	}
	// Status names every member, the leader, and equal digests.
	st, err := kvdirv1.NewAdminServiceClient(cc).Status(ctx, &kvdirv1.StatusRequest{})
	if err != nil || len(st.Members) != 3 || st.LeaderId == "" || st.LeaderAddress == "" || st.Counters.Entries != 6 {
		t.Fatalf("status: %v %v", st, err)
	}
	// Responses name the leader's API for clients.
	var hdr metadata.MD
	if _, err := dir.ListWorkers(ctx, &kvdirv1.ListWorkersRequest{}, grpc.Header(&hdr)); err != nil || len(hdr.Get(node.MDLeader)) != 1 {
		t.Fatalf("leader header: %v %v", hdr, err)
	}
	// HTTP: metrics with the project's names, health and readiness.
	body := httpGet(t, "http://"+c.Node(f).HTTPAddr()+"/metrics")
	for _, name := range []string{"kvdir_raft_leader", "kvdir_raft_term", "kvdir_raft_applied_index", "kvdir_fsm_apply_seconds",
		"kvdir_fsm_events_applied_total", "kvdir_index_entries", "kvdir_index_bytes", "kvdir_workers", "kvdir_match_seconds",
		"kvdir_match_depth_blocks", "kvdir_grpc_server_handled_total"} {
		if !strings.Contains(body, name) {
			t.Errorf("metrics lack %s", name)
		}
	}
	if b := httpGet(t, "http://"+c.Node(f).HTTPAddr()+"/readyz"); !strings.Contains(b, "ready") {
		t.Fatalf("readyz: %q", b)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	return string(b)
}
