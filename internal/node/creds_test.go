package node_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

var credTokens = node.Tokens{Router: "router-secret-0123456789", Admin: "admin-secret-0123456789"}

var testCreds = []node.Credential{
	{Name: "alice", Token: "alice-secret-0123456789", Patterns: []string{"a-*"}},
	{Name: "bob", Token: "bob-secret-0123456789", Patterns: []string{"b-*", "shared-*"}},
	{Name: "carol", Token: "carol-secret-0123456789", Patterns: []string{"shared-*"}},
}

func credCluster(t *testing.T, more func(i int, c *node.Config)) *dirtest.Cluster {
	return dirtest.New(t, 3, func(i int, c *node.Config) {
		c.Tokens, c.AgentCredentials = credTokens, testCreds
		if more != nil {
			more(i, c)
		}
	})
}

// as returns a context carrying a bearer token and, if set, a worker token.
func as(bearer, workerToken string) context.Context {
	ctx := withToken(context.Background(), bearer)
	if workerToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, node.MDWorkerToken, workerToken)
	}
	return ctx
}

func spec(id string) *kvdirv1.WorkerSpec {
	return &kvdirv1.WorkerSpec{Id: id, BlockSize: 16, Model: "m"}
}

// publishOne sends one batch on a new stream and returns the answer or the
// stream's error.
func publishOne(ctx context.Context, agent kvdirv1.AgentServiceClient, b *kvdirv1.EventBatch) (*kvdirv1.PublishResponse, error) {
	s, err := agent.Publish(ctx)
	if err != nil {
		return nil, err
	}
	defer s.CloseSend()
	if err := s.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
		return nil, err
	}
	return s.Recv()
}

func storedBatch(id string, epoch, seq uint64, hashes ...uint64) *kvdirv1.EventBatch {
	return &kvdirv1.EventBatch{WorkerId: id, Epoch: epoch, FirstSeq: seq, LastSeq: seq,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: hashes}}}}}
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func TestCredentialsBindWorkers(t *testing.T) {
	c := credCluster(t, nil)
	agent := kvdirv1.NewAgentServiceClient(c.Conn(c.Follower()))
	alice, bob, carol := testCreds[0].Token, testCreds[1].Token, testCreds[2].Token

	ra, err := agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec("a-1")})
	if err != nil || len(ra.WorkerToken) != 64 {
		t.Fatalf("alice registers a-1: %v %v", ra, err)
	}
	_, err = agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec("b-1")})
	wantCode(t, "alice registers outside her patterns", err, codes.PermissionDenied)
	rb, err := agent.Register(as(bob, ""), &kvdirv1.RegisterRequest{Worker: spec("b-1")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := publishOne(as(alice, ra.WorkerToken), agent, storedBatch("a-1", ra.Epoch, 1, 1, 2, 3)); err != nil {
		t.Fatalf("alice publishes for a-1: %v", err)
	}
	c.Converged()
	before := c.Node(0).FSM().Digest()
	wa, _ := c.Node(0).FSM().Worker("a-1")

	// Bob, even holding a-1's worker token, cannot act for it.
	for _, tok := range []string{rb.WorkerToken, ra.WorkerToken} {
		ctx := as(bob, tok)
		_, err = agent.Heartbeat(ctx, &kvdirv1.HeartbeatRequest{WorkerId: "a-1", Epoch: ra.Epoch})
		wantCode(t, "bob heartbeats for a-1", err, codes.PermissionDenied)
		_, err = publishOne(ctx, agent, storedBatch("a-1", ra.Epoch, 2, 9))
		wantCode(t, "bob publishes for a-1", err, codes.PermissionDenied)
		_, err = agent.Deregister(ctx, &kvdirv1.DeregisterRequest{WorkerId: "a-1", Epoch: ra.Epoch})
		wantCode(t, "bob deregisters a-1", err, codes.PermissionDenied)
	}
	// Neither may alice with a forged token, nor with bob's worker's.
	for _, tok := range []string{"", strings.Repeat("0", 64), rb.WorkerToken} {
		ctx := as(alice, tok)
		_, err = agent.Heartbeat(ctx, &kvdirv1.HeartbeatRequest{WorkerId: "a-1", Epoch: ra.Epoch})
		wantCode(t, "alice heartbeats with a forged token", err, codes.PermissionDenied)
		_, err = publishOne(ctx, agent, storedBatch("a-1", ra.Epoch, 2, 9))
		wantCode(t, "alice publishes with a forged token", err, codes.PermissionDenied)
		_, err = agent.Deregister(ctx, &kvdirv1.DeregisterRequest{WorkerId: "a-1", Epoch: ra.Epoch})
		wantCode(t, "alice deregisters with a forged token", err, codes.PermissionDenied)
	}
	// Bob cannot register (hijack) alice's id either: outside his patterns.
	_, err = agent.Register(as(bob, ""), &kvdirv1.RegisterRequest{Worker: spec("a-1")})
	wantCode(t, "bob registers a-1", err, codes.PermissionDenied)
	// Nothing changed, on any node.
	c.Converged()
	for i := range c.Size() {
		if d := c.Node(i).FSM().Digest(); d != before {
			t.Fatalf("node %d: refused calls changed the state", i)
		}
	}
	if w, _ := c.Node(0).FSM().Worker("a-1"); w.Epoch != wa.Epoch || w.AppliedSeq != 1 || w.Blocks != 3 || w.Owner != "alice" {
		t.Fatalf("a-1 after the refused calls: epoch %d seq %d blocks %d owner %q", w.Epoch, w.AppliedSeq, w.Blocks, w.Owner)
	}

	// A live worker of shared patterns is not taken over by another
	// credential; the refusal names both.
	rs, err := agent.Register(as(bob, ""), &kvdirv1.RegisterRequest{Worker: spec("shared-1")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = agent.Register(as(carol, ""), &kvdirv1.RegisterRequest{Worker: spec("shared-1")})
	wantCode(t, "carol takes over bob's live worker", err, codes.PermissionDenied)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `"bob"`) || !strings.Contains(msg, `"carol"`) {
		t.Fatalf("refusal %q does not name both credentials", msg)
	}

	// Alice re-registers a-1 (her agent restarted after kill -9): a new
	// epoch and token; the old token no longer opens it.
	ra2, err := agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec("a-1")})
	if err != nil || ra2.Epoch != ra.Epoch+1 || ra2.WorkerToken == ra.WorkerToken {
		t.Fatalf("alice re-registers a-1: %v %v", ra2, err)
	}
	_, err = agent.Heartbeat(as(alice, ra.WorkerToken), &kvdirv1.HeartbeatRequest{WorkerId: "a-1", Epoch: ra2.Epoch})
	wantCode(t, "heartbeat with the old epoch's token", err, codes.PermissionDenied)
	_, err = publishOne(as(alice, ra.WorkerToken), agent, storedBatch("a-1", ra2.Epoch, 1, 7))
	wantCode(t, "publish with the old epoch's token", err, codes.PermissionDenied)
	if hb, err := agent.Heartbeat(as(alice, ra2.WorkerToken), &kvdirv1.HeartbeatRequest{WorkerId: "a-1", Epoch: ra2.Epoch}); err != nil || !hb.Known {
		t.Fatalf("heartbeat with the new token: %v %v", hb, err)
	}
	if r, err := publishOne(as(alice, ra2.WorkerToken), agent, storedBatch("a-1", ra2.Epoch, 1, 7)); err != nil || r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		t.Fatalf("publish with the new token: %v %v", r, err)
	}
	// Once bob's worker is gone, carol may register the id.
	if _, err := agent.Deregister(as(bob, rs.WorkerToken), &kvdirv1.DeregisterRequest{WorkerId: "shared-1", Epoch: rs.Epoch}); err != nil {
		t.Fatalf("bob deregisters his worker: %v", err)
	}
	if _, err := agent.Register(as(carol, ""), &kvdirv1.RegisterRequest{Worker: spec("shared-1")}); err != nil {
		t.Fatalf("carol registers the gone worker: %v", err)
	}
	// The administrator acts for any worker without its token.
	if _, err := agent.Deregister(as(credTokens.Admin, ""), &kvdirv1.DeregisterRequest{WorkerId: "b-1", Epoch: rb.Epoch}); err != nil {
		t.Fatalf("admin deregisters b-1: %v", err)
	}
	// Publishing for a worker that is gone answers UNKNOWN_WORKER, token
	// or not, and proposes nothing.
	if r, err := publishOne(as(bob, rb.WorkerToken), agent, storedBatch("b-1", rb.Epoch, 1, 5)); err != nil || r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER {
		t.Fatalf("publish for a gone worker: %v %v", r, err)
	}
	c.Converged()
	for i := range c.Size() {
		w, _ := c.Node(i).FSM().Worker("shared-1")
		if w.Owner != "carol" {
			t.Fatalf("node %d: shared-1 owned by %q", i, w.Owner)
		}
	}
	// Routers see owners but never token hashes.
	ws, err := kvdirv1.NewDirectoryServiceClient(c.Conn(0)).ListWorkers(as(credTokens.Router, ""), &kvdirv1.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Workers {
		if len(w.TokenHash) != 0 || w.Owner == "" {
			t.Fatalf("listed worker %s: owner %q token hash %x", w.Spec.Id, w.Owner, w.TokenHash)
		}
	}
}

func TestAgentTokenStaysACredential(t *testing.T) {
	tokens := credTokens
	tokens.Agent = "agent-secret-0123456789"
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.Tokens = tokens })
	agent := kvdirv1.NewAgentServiceClient(c.Conn(c.Follower()))
	r, err := agent.Register(as(tokens.Agent, ""), &kvdirv1.RegisterRequest{Worker: spec("anything")})
	if err != nil {
		t.Fatal(err)
	}
	c.Converged()
	if w, _ := c.Node(0).FSM().Worker("anything"); w.Owner != node.AgentTokenName {
		t.Fatalf("owner %q, want %q", w.Owner, node.AgentTokenName)
	}
	if hb, err := agent.Heartbeat(as(tokens.Agent, r.WorkerToken), &kvdirv1.HeartbeatRequest{WorkerId: "anything", Epoch: r.Epoch}); err != nil || !hb.Known {
		t.Fatalf("heartbeat: %v %v", hb, err)
	}
}

func TestCredentialLimits(t *testing.T) {
	regs := make([]*prometheus.Registry, 3)
	c := credCluster(t, func(i int, cfg *node.Config) {
		cfg.MaxWorkersPerCredential = 2
		cfg.MaxStreamsPerCredential = 2
		regs[i] = prometheus.NewRegistry()
		cfg.Registerer = regs[i]
	})
	agent := kvdirv1.NewAgentServiceClient(c.Conn(c.Follower()))
	alice := testCreds[0].Token
	for _, id := range []string{"a-1", "a-2"} {
		if _, err := agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec(id)}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	_, err := agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec("a-3")})
	wantCode(t, "a third worker of one credential", err, codes.ResourceExhausted)
	if _, err := agent.Register(as(alice, ""), &kvdirv1.RegisterRequest{Worker: spec("a-1")}); err != nil {
		t.Fatalf("re-registering an owned worker at the limit: %v", err)
	}
	if _, err := agent.Register(as(testCreds[1].Token, ""), &kvdirv1.RegisterRequest{Worker: spec("b-1")}); err != nil {
		t.Fatalf("another credential at alice's limit: %v", err)
	}

	// Streams: two per holder on one node; the third is refused and counted.
	i := c.Follower()
	dir := kvdirv1.NewDirectoryServiceClient(c.Conn(i))
	ctx, cancel := context.WithCancel(as(credTokens.Router, ""))
	defer cancel()
	for range 2 {
		s, err := dir.WatchWorkers(ctx, &kvdirv1.WatchWorkersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil { // the first snapshot: the stream is open
			t.Fatalf("watch: %v", err)
		}
	}
	s, err := dir.WatchWorkers(ctx, &kvdirv1.WatchWorkersRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, "a third WatchWorkers stream", err, codes.ResourceExhausted)
	if n := (sumCounter(t, regs[i], "kvdir_stream_limit_refusals_total")); n != 1 {
		t.Fatalf("refusals counted: %v, want 1", n)
	}
	// The administrator's streams count apart.
	if s, err := dir.WatchWorkers(as(credTokens.Admin, ""), &kvdirv1.WatchWorkersRequest{}); err != nil {
		t.Fatal(err)
	} else if _, err := s.Recv(); err != nil {
		t.Fatalf("admin watch: %v", err)
	}
	// Closing streams frees their slots.
	cancel()
	testkit.Eventually(t, 10*time.Second, "a freed stream slot", func() (bool, string) {
		s, err := dir.WatchWorkers(as(credTokens.Router, ""), &kvdirv1.WatchWorkersRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err == nil, status.Convert(err).Message()
	})

	// Publish streams: an agent credential's count apart, up to
	// PublishStreamsPerWorker per worker it may own (8 here, past the 2 of
	// the other streams). A stream is open once it answered a batch (one
	// for an unregistered worker is answered at once, without a token).
	limit := node.PublishStreamLimit(2, 2)
	if limit != 2*node.PublishStreamsPerWorker {
		t.Fatalf("PublishStreamLimit(2, 2) = %d", limit)
	}
	pub := kvdirv1.NewAgentServiceClient(c.Conn(i))
	// openPublish opens a Publish stream as bearer for worker id; cancel
	// closes it.
	openPublish := func(bearer, id string) (cancel context.CancelFunc, err error) {
		ctx, cancel := context.WithCancel(as(bearer, ""))
		t.Cleanup(cancel)
		s, err := pub.Publish(ctx)
		if err == nil {
			// A refused stream may fail the send with io.EOF; its status
			// comes from the receive, which is read either way.
			_ = s.Send(&kvdirv1.PublishRequest{Batch: storedBatch(id, 1, 1, 1)})
		}
		var r *kvdirv1.PublishResponse
		if err == nil {
			r, err = s.Recv()
		}
		if err != nil {
			cancel()
			return nil, err
		}
		if r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER {
			t.Fatalf("publish for an unregistered worker: %v", r)
		}
		return cancel, nil
	}
	var closers []context.CancelFunc
	for n := range limit {
		cl, err := openPublish(alice, "a-9")
		if err != nil {
			t.Fatalf("publish stream %d of %d: %v", n+1, limit, err)
		}
		closers = append(closers, cl)
	}
	refused := sumCounter(t, regs[i], "kvdir_stream_limit_refusals_total")
	_, err = openPublish(alice, "a-9")
	wantCode(t, "a Publish stream past the limit", err, codes.ResourceExhausted)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, fmt.Sprintf("holds %d Publish streams", limit)) ||
		!strings.Contains(msg, "--max-workers-per-credential") {
		t.Fatalf("refusal %q names not the limit and the flag", msg)
	}
	if n := sumCounter(t, regs[i], "kvdir_stream_limit_refusals_total"); n != refused+1 {
		t.Fatalf("refusals counted: %v, want %v", n, refused+1)
	}
	// Another credential's Publish streams count apart.
	if _, err := openPublish(testCreds[1].Token, "b-9"); err != nil {
		t.Fatalf("bob at alice's Publish limit: %v", err)
	}
	// Closing one frees a slot, once its handler returned (on this node and
	// on the leader it forwards to).
	closers[0]()
	testkit.Eventually(t, 10*time.Second, "a freed Publish slot", func() (bool, string) {
		_, err := openPublish(alice, "a-9")
		return err == nil, status.Convert(err).Message()
	})
}

// sumCounter sums the named metric family's counters.
func sumCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			var sum float64
			for _, m := range f.Metric {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestWorkerBlockQuota(t *testing.T) {
	const quota = 100
	regs := make([]*prometheus.Registry, 3)
	c := dirtest.New(t, 3, func(i int, cfg *node.Config) {
		cfg.WorkerBlockQuota = quota
		regs[i] = prometheus.NewRegistry()
		cfg.Registerer = regs[i]
		// One leader throughout: the stream below goes to one node and an
		// election under a loaded race-detector run would end it. The
		// default test timeouts (100 ms) are for tests of elections.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = time.Second, time.Second
	})
	agent := kvdirv1.NewAgentServiceClient(c.Conn(c.Follower()))
	r, err := agent.Register(context.Background(), &kvdirv1.RegisterRequest{Worker: spec("w")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := agent.Publish(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for seq := uint64(1); seq <= 3; seq++ {
		hashes := make([]uint64, 60)
		for i := range hashes {
			hashes[i] = next
			next++
		}
		b := storedBatch("w", r.Epoch, seq, hashes...)
		b.Events[0].GetStored().Parent = hashes[0] - 1
		if seq == 1 {
			b.Events[0].GetStored().Parent = 0
		}
		if err := s.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			t.Fatalf("batch %d: %v %v (over-quota batches are still acknowledged)", seq, resp, err)
		}
	}
	s.CloseSend()
	c.Converged()
	for i := range c.Size() {
		w, _ := c.Node(i).FSM().Worker("w")
		if w.Blocks != quota || w.DroppedBlocks != 180-quota || w.BlockQuota != quota || w.AppliedSeq != 3 {
			t.Fatalf("node %d: blocks %d dropped %d quota %d seq %d", i, w.Blocks, w.DroppedBlocks, w.BlockQuota, w.AppliedSeq)
		}
		if st := c.Node(i).FSM().Counters(); st.Blocks > quota {
			t.Fatalf("node %d: the index holds %d blocks", i, st.Blocks)
		}
		if n := sumCounter(t, regs[i], "kvdir_fsm_quota_dropped_blocks_total"); n != 180-quota {
			t.Fatalf("node %d: drops counted %v, want %d", i, n, 180-quota)
		}
	}
	// A batch over the batch limits is refused before it is proposed.
	last := c.Node(c.Leader()).FSM().AppliedIndex()
	big := storedBatch("w", r.Epoch, 4, make([]uint64, 5)...)
	big.LastSeq = 1 << 40
	if resp, err := publishOne(context.Background(), agent, big); err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED || resp.RaftIndex != 0 {
		t.Fatalf("impossible batch: %v %v", resp, err)
	}
	zero := storedBatch("w", r.Epoch, 4, 0)
	if resp, err := publishOne(context.Background(), agent, zero); err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED || resp.RaftIndex != 0 {
		t.Fatalf("batch with the reserved hash: %v %v", resp, err)
	}
	if now := c.Node(c.Leader()).FSM().AppliedIndex(); now != last {
		t.Fatalf("refused batches reached the log: applied %d -> %d", last, now)
	}
}

func TestRegisterRefusesControlCharacters(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	agent := kvdirv1.NewAgentServiceClient(c.Conn(0))
	last := c.Node(0).FSM().AppliedIndex()
	for _, sp := range []*kvdirv1.WorkerSpec{
		{Id: "w\x1b[31mred"},
		{Id: "w\n2"},
		{Id: "w\u200b"},
		{Id: "w", Model: "m\x00"},
		{Id: "w", Address: "http://h\r\nX-Evil: 1"},
		{Id: "w", Labels: map[string]string{"zone": "a\tb"}},
	} {
		_, err := agent.Register(context.Background(), &kvdirv1.RegisterRequest{Worker: sp})
		wantCode(t, "register "+strings.ToValidUTF8(sp.String(), "?"), err, codes.InvalidArgument)
	}
	if now := c.Node(0).FSM().AppliedIndex(); now != last {
		t.Fatalf("refused registrations reached the log")
	}
	if _, err := agent.Register(context.Background(), &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "pod-7/dp0", Model: "Llama 3 8B", Address: "http://10.0.0.7:8000"}}); err != nil {
		t.Fatalf("a plain registration: %v", err)
	}
}

// TestRegisterRefusesOversizedSpecs checks that a spec past the state
// machine's bounds is refused with InvalidArgument before it is proposed,
// with a message that does not grow with it.
func TestRegisterRefusesOversizedSpecs(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	agent := kvdirv1.NewAgentServiceClient(c.Conn(0))
	last := c.Node(0).FSM().AppliedIndex()
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprint("k", i)] = "v"
	}
	rank := uint32(256)
	for _, sp := range []*kvdirv1.WorkerSpec{
		{Id: strings.Repeat("w", 257)},
		{Id: strings.Repeat("w", 1<<20) + "\x1b"},
		{Id: "w", Address: strings.Repeat("a", 2049)},
		{Id: "w", Model: strings.Repeat("m", 1025)},
		{Id: "w", Labels: map[string]string{strings.Repeat("k", 257): "v"}},
		{Id: "w", Labels: map[string]string{strings.Repeat("k", 1<<20): "\t"}},
		{Id: "w", Labels: many},
		{Id: "w", BlockSize: 1<<16 + 1},
		{Id: "w", DataParallelRank: &rank},
	} {
		_, err := agent.Register(context.Background(), &kvdirv1.RegisterRequest{Worker: sp})
		wantCode(t, fmt.Sprintf("register %.80s", sp), err, codes.InvalidArgument)
		if msg := status.Convert(err).Message(); len(msg) > 1024 {
			t.Errorf("a %d-byte refusal: %.200s", len(msg), msg)
		}
	}
	if now := c.Node(0).FSM().AppliedIndex(); now != last {
		t.Fatalf("refused registrations reached the log")
	}
}

func TestHeartbeatClampsBadLoads(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := dirtest.New(t, 1, func(_ int, cfg *node.Config) {
		cfg.LoadInterval = 20 * time.Millisecond
		cfg.Registerer = reg
	})
	agent := kvdirv1.NewAgentServiceClient(c.Conn(0))
	r, err := agent.Register(context.Background(), &kvdirv1.RegisterRequest{Worker: spec("w")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want float64 }{{math.NaN(), 0}, {math.Inf(1), 1}, {-0.5, 0}, {math.Inf(-1), 0}, {0.25, 0.25}} {
		hb, err := agent.Heartbeat(context.Background(), &kvdirv1.HeartbeatRequest{WorkerId: "w", Epoch: r.Epoch, Load: &kvdirv1.Load{KvUsage: tc.in, Running: 3}})
		if err != nil || !hb.Known {
			t.Fatalf("heartbeat with usage %v: %v %v", tc.in, hb, err)
		}
		testkit.Eventually(t, 5*time.Second, "the load to be recorded", func() (bool, string) {
			w, _ := c.Node(0).FSM().Worker("w")
			u := w.GetLoad().GetKvUsage()
			return w.GetLoad() != nil && u == tc.want, w.GetLoad().String()
		})
	}
	if n := (sumCounter(t, reg, "kvdir_heartbeat_loads_clamped_total")); n != 4 {
		t.Fatalf("clamped loads counted: %v, want 4", n)
	}
}
