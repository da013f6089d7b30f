package dirclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// attempts records the addresses a client tries, per operation.
type attempts struct {
	mu  sync.Mutex
	log []string // "op addr"
}

func (a *attempts) hook(op, addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log = append(a.log, op+" "+addr)
}

func (a *attempts) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.log
	a.log = nil
	return out
}

func spec(id string) *kvdirv1.WorkerSpec {
	return &kvdirv1.WorkerSpec{Id: id, Model: "m", BlockSize: 16, Address: "http://" + id}
}

func TestNewNeedsAnAddress(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Config.Addrs") {
		t.Fatalf("New without addresses: %v", err)
	}
}

func TestFailoverFromDeadAddress(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	dead := deadAddr(t)
	ctx := testCtx(t, 20*time.Second)

	// A read: the dead address is preferred at first, then skipped.
	rc := newClient(t, Config{Addrs: append([]string{dead}, c.APIAddrs()...)})
	var at attempts
	rc.onAttempt = at.hook
	if _, err := rc.ListWorkers(ctx, "", false); err != nil {
		t.Fatalf("read with a dead first address: %v", err)
	}
	if got := at.take(); len(got) < 2 || got[0] != "list workers "+dead {
		t.Fatalf("read attempts: %v", got)
	}
	// Now the node that answered is preferred.
	if _, err := rc.Status(ctx); err != nil {
		t.Fatal(err)
	}
	if got := at.take(); len(got) != 1 || strings.HasSuffix(got[0], dead) {
		t.Fatalf("second read attempts: %v", got)
	}

	// A write from a fresh client, which knows no leader yet.
	wc := newClient(t, Config{Addrs: append([]string{dead}, c.APIAddrs()...)})
	wc.onAttempt = at.hook
	reg, err := wc.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatalf("write with a dead first address: %v", err)
	}
	if reg.Epoch == 0 {
		t.Fatalf("register: %v", reg)
	}
	if got := at.take(); len(got) < 2 || got[0] != "register "+dead {
		t.Fatalf("write attempts: %v", got)
	}

	// Nothing reachable: a clear error naming the addresses, quickly.
	dead2 := deadAddr(t)
	nc := newClient(t, Config{Addrs: []string{dead, dead2}, CallTimeout: 300 * time.Millisecond})
	for _, call := range []func() error{
		func() error { _, err := nc.ListWorkers(context.Background(), "", false); return err },
		func() error { _, err := nc.Register(context.Background(), spec("w2")); return err },
	} {
		start := time.Now()
		err := call()
		if !errors.Is(err, ErrUnreachable) || status.Code(err) != codes.Unavailable {
			t.Fatalf("unreachable: %v (code %v)", err, status.Code(err))
		}
		var ue *UnreachableError
		if !errors.As(err, &ue) || len(ue.Attempts) != 2 {
			t.Fatalf("unreachable error: %#v", err)
		}
		if msg := err.Error(); !strings.Contains(msg, dead) || !strings.Contains(msg, dead2) || !strings.Contains(msg, "Config.Addrs") {
			t.Fatalf("error does not name the addresses: %v", msg)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("unreachable took %v", d)
		}
	}
}

// learnLeader waits until the client's leader hint names the cluster's
// leader, and returns the leader's index.
func learnLeader(t *testing.T, c *dirtest.Cluster, cl *Client) int {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	l := -1
	testkit.Eventually(t, 10*time.Second, "the client to learn the leader", func() (bool, string) {
		if _, err := cl.Status(ctx); err != nil {
			t.Fatal(err)
		}
		l = c.Leader()
		return cl.Leader() == c.APIAddr(l), ""
	})
	return l
}

func TestWritesPreferLeader(t *testing.T) {
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	l := c.Leader()
	fs := c.Followers()
	addrs := []string{c.APIAddr(fs[0]), c.APIAddr(fs[1]), c.APIAddr(l)}
	cl := newClient(t, Config{Addrs: addrs})
	var at attempts
	cl.onAttempt = at.hook
	ctx := testCtx(t, 20*time.Second)

	// The first write goes to the first address (a follower, which
	// forwards it); the answer names the leader.
	reg, err := cl.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := at.take(); len(got) != 1 || got[0] != "register "+addrs[0] {
		t.Fatalf("first write attempts: %v", got)
	}
	if cl.Leader() == "" {
		t.Fatal("no leader learned from the first write")
	}
	// Later writes go to the leader first.
	writes := func() {
		t.Helper()
		for range 3 {
			lead := cl.Leader()
			if _, err := cl.Heartbeat(ctx, "w1", reg.Epoch, &kvdirv1.Load{Running: 1}); err != nil {
				t.Fatal(err)
			}
			if got := at.take(); len(got) == 0 || got[0] != "heartbeat "+lead {
				t.Fatalf("write attempts with leader %s known: %v", lead, got)
			}
		}
	}
	l = learnLeader(t, c, cl)
	at.take()
	writes()

	// After the leader goes, writes find the new one.
	c.Stop(l)
	if _, err := cl.RecordSessions(ctx, []*kvdirv1.SessionRecord{{SessionId: "s1", Tail: 1, Blocks: 1, WorkerId: "w1"}}); err != nil {
		t.Fatal(err)
	}
	nl := learnLeader(t, c, cl)
	if nl == l {
		t.Fatal("the stopped node still leads")
	}
	at.take()
	writes()
}

func TestDirectoryAndAdminCalls(t *testing.T) {
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	cl := newClient(t, Config{Addrs: c.APIAddrs()})
	ctx := testCtx(t, 30*time.Second)

	ns := blockhash.Namespace{Model: "m", BlockSize: 4}
	h, err := blockhash.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	chain := h.Chain(nil, tokens, nil)

	reg, err := cl.Register(ctx, &kvdirv1.WorkerSpec{Id: "w1", Model: "m", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := cl.NewPublisher("w1", reg.Epoch)
	defer p.Close()
	if _, err := p.Send(ctx, []*kvdirv1.Event{stored(0, chain...)}); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := cl.MatchTokens(ctx, tokens, &kvdirv1.Namespace{Model: "m", BlockSize: 4}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Matches) != 1 || m.Matches[0].Blocks != 3 || m.Matches[0].Tokens != 12 || !m.Read.FromLeader {
		t.Fatalf("match tokens: %v", m)
	}
	if _, err := cl.MatchTokens(ctx, tokens, nil, false); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("match without namespace: %v", err)
	}

	if _, err := cl.RecordSessions(ctx, []*kvdirv1.SessionRecord{
		{SessionId: "s1", Tail: chain[2], Blocks: 3, WorkerId: "w1", BlockSize: 4},
		{SessionId: "s2", Tail: chain[1], Blocks: 2, WorkerId: "w1", BlockSize: 4},
	}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "sessions on the read node", func() (bool, string) {
		ls, err := cl.ListSessions(ctx, "s", "w1", 0)
		if err != nil {
			t.Fatal(err)
		}
		return ls.Total == 2, ""
	})
	wh, err := cl.WhoHolds(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(wh.Sessions) != 1 || len(wh.Sessions[0].Holders) != 1 || wh.Sessions[0].Holders[0].Blocks != 3 {
		t.Fatalf("who holds: %v", wh)
	}
	if wh, err := cl.WhoHoldsPrefix(ctx, "s", 10); err != nil || len(wh.Sessions) != 2 {
		t.Fatalf("who holds prefix: %v %v", wh, err)
	}
	if _, err := cl.WhoHolds(ctx, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("who holds unknown session: %v", err)
	}

	if _, err := cl.DrainWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the worker to drain", func() (bool, string) {
		gw, err := cl.GetWorker(ctx, "w1", 5)
		if err != nil {
			t.Fatal(err)
		}
		return gw.Worker.State == kvdirv1.WorkerState_WORKER_STATE_DRAINING && len(gw.Chains) == 1, ""
	})
	if _, err := cl.ExpireWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the worker to expire", func() (bool, string) {
		lw, err := cl.ListWorkers(ctx, "m", true)
		if err != nil {
			t.Fatal(err)
		}
		return len(lw.Workers) == 1 && lw.Workers[0].State == kvdirv1.WorkerState_WORKER_STATE_EXPIRED, ""
	})
	if _, err := cl.GetWorker(ctx, "nope", 0); status.Code(err) != codes.NotFound {
		t.Fatalf("get unknown worker: %v", err)
	}
	reg2, err := cl.Register(ctx, &kvdirv1.WorkerSpec{Id: "w2", Model: "m", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Deregister(ctx, "w2", reg2.Epoch); err != nil {
		t.Fatal(err)
	}

	// Status of each node, and of whichever answers.
	for i, a := range c.APIAddrs() {
		st, err := cl.StatusOf(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if st.NodeId != c.Node(i).ID() || len(st.Members) != 3 || st.State == "" {
			t.Fatalf("status of %s: %v", a, st)
		}
	}
	if st, err := cl.Status(ctx); err != nil || !slices.Contains(c.APIAddrs(), st.LeaderAddress) {
		t.Fatalf("status: %v %v", st, err)
	}
	l := c.Leader()
	if _, err := cl.StatusOf(ctx, deadAddr(t)); status.Code(err) != codes.Unavailable {
		t.Fatalf("status of a dead address: %v", err)
	}
	if snap, err := cl.Snapshot(ctx, c.APIAddr(l)); err != nil || snap.Index == 0 {
		t.Fatalf("snapshot: %v %v", snap, err)
	}

	// Membership: a non-voter that never answers can be added and removed.
	members := func(want int) func() (bool, string) {
		return func() (bool, string) {
			st, err := cl.StatusOf(ctx, c.APIAddr(c.Leader()))
			if err != nil {
				t.Fatal(err)
			}
			return len(st.Members) == want, fmt.Sprintf("%d members", len(st.Members))
		}
	}
	if _, err := cl.AddMember(ctx, &kvdirv1.AddMemberRequest{Id: "n9", RaftAddress: "raft-9", NonVoter: true}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "four members", members(4))
	if _, err := cl.RemoveMember(ctx, "n9"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "three members", members(3))

	// Leadership transfer: the client forgets the old leader, then learns
	// the new one.
	l = c.Leader()
	target := c.Followers()[0]
	if _, err := cl.TransferLeadership(ctx, c.Node(target).ID()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the new leader to be learned", func() (bool, string) {
		if _, err := cl.RecordSessions(ctx, []*kvdirv1.SessionRecord{{SessionId: "s3", Tail: 1, Blocks: 1}}); err != nil {
			t.Fatal(err)
		}
		nl := c.Leader()
		return nl != l && cl.Leader() == c.APIAddr(nl), ""
	})
	if !slices.Equal(cl.Addrs(), c.APIAddrs()) {
		t.Fatalf("addresses: %v", cl.Addrs())
	}
}

func TestTokens(t *testing.T) {
	tokens := node.Tokens{Agent: "agent-secret", Router: "router-secret", Admin: "admin-secret"}
	c := dirtest.New(t, 3, dirConfig(tokens))
	c.WaitMembers()
	ctx := testCtx(t, 30*time.Second)

	anon := newClient(t, Config{Addrs: c.APIAddrs()})
	_, err := anon.Register(ctx, spec("w1"))
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "Config.Token") {
		t.Fatalf("register without a token: %v", err)
	}
	wrong := newClient(t, Config{Addrs: c.APIAddrs(), Token: "guess"})
	if _, err := wrong.ListWorkers(ctx, "", false); status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(err.Error(), "not one of the directory's tokens") {
		t.Fatalf("read with a wrong token: %v", err)
	}
	router := newClient(t, Config{Addrs: c.APIAddrs(), Token: tokens.Router})
	if _, err := router.Register(ctx, spec("w1")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("register with the router token: %v", err)
	}

	agent := newClient(t, Config{Addrs: c.APIAddrs(), Token: tokens.Agent})
	reg, err := agent.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if reg.WorkerToken == "" {
		t.Fatal("no worker token")
	}
	if hb, err := agent.Heartbeat(ctx, "w1", reg.Epoch, nil); err != nil || !hb.Known {
		t.Fatalf("heartbeat: %v %v", hb, err)
	}
	p := agent.NewPublisher("w1", reg.Epoch)
	defer p.Close()
	for i := range 10 {
		if _, err := p.Send(ctx, []*kvdirv1.Event{stored(uint64(i), uint64(i+1))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("publish with the stored worker token: %v", err)
	}
	m, err := router.MatchChain(ctx, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 16, true)
	if err != nil || len(m.Matches) != 1 || m.Matches[0].Blocks != 10 {
		t.Fatalf("match: %v %v", m, err)
	}

	// Another agent client lacks w1's worker token: refused, with a hint.
	other := newClient(t, Config{Addrs: c.APIAddrs(), Token: tokens.Agent})
	if _, err := other.Heartbeat(ctx, "w1", reg.Epoch, nil); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "worker token") {
		t.Fatalf("heartbeat without the worker token: %v", err)
	}
	op := other.NewPublisher("w1", reg.Epoch)
	defer op.Close()
	if _, err := op.Send(ctx, []*kvdirv1.Event{stored(10, 11)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-op.Done():
	case <-ctx.Done():
		t.Fatal("publisher without the worker token did not stop")
	}
	if status.Code(op.Err()) != codes.PermissionDenied {
		t.Fatalf("publisher without the worker token: %v", op.Err())
	}
	if err := op.Flush(ctx); err == nil {
		t.Fatal("flush of a stopped publisher succeeded")
	}
	// With the token handed over, it works.
	other.SetWorkerToken("w1", reg.WorkerToken)
	if _, err := other.Deregister(ctx, "w1", reg.Epoch); err != nil {
		t.Fatal(err)
	}
}

func TestWatchWorkersReconnects(t *testing.T) {
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	f := c.Followers()[0]
	addrs := []string{c.APIAddr(f)}
	for i, a := range c.APIAddrs() {
		if i != f {
			addrs = append(addrs, a)
		}
	}
	cl := newClient(t, Config{Addrs: addrs})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	msgs := make(chan *kvdirv1.WatchWorkersResponse, 100)
	done := make(chan error, 1)
	go func() {
		done <- cl.WatchWorkers(ctx, "m", func(r *kvdirv1.WatchWorkersResponse) error {
			msgs <- r
			return nil
		})
	}()
	next := func() *kvdirv1.WatchWorkersResponse {
		t.Helper()
		select {
		case r := <-msgs:
			return r
		case err := <-done:
			t.Fatalf("watch ended: %v", err)
		case <-ctx.Done():
			t.Fatal("no watch message")
		}
		return nil
	}
	if r := next(); !r.Snapshot || len(r.Workers) != 0 {
		t.Fatalf("first message: %v", r)
	}
	if _, err := cl.Register(ctx, spec("w1")); err != nil {
		t.Fatal(err)
	}
	if r := next(); r.Snapshot || len(r.Workers) != 1 || r.Workers[0].Spec.Id != "w1" {
		t.Fatalf("change: %v", r)
	}
	// The node serving the watch goes: the watch moves and starts over
	// with a snapshot.
	c.Stop(f)
	r := next()
	if !r.Snapshot || len(r.Workers) != 1 {
		t.Fatalf("after reconnecting: %v", r)
	}
	if _, err := cl.Register(ctx, spec("w2")); err != nil {
		t.Fatal(err)
	}
	for r := next(); !slices.ContainsFunc(r.Workers, func(w *kvdirv1.Worker) bool { return w.Spec.Id == "w2" }); r = next() {
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("watch end: %v", err)
	}

	// A callback's error ends the watch and comes back as is.
	stop := errors.New("enough")
	if err := cl.WatchWorkers(testCtx(t, 10*time.Second), "", func(*kvdirv1.WatchWorkersResponse) error { return stop }); err != stop {
		t.Fatalf("watch with a failing callback: %v", err)
	}
}

// TestDialer checks that a client with a Dialer reaches nodes through it,
// by names that do not resolve: the dialer maps them to the nodes.
func TestDialer(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	c.Leader()
	var dialed []string
	var mu sync.Mutex
	cl, err := New(Config{Addrs: []string{"node-one.invalid:7001"}, Dialer: func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		if addr != "node-one.invalid:7001" {
			return nil, fmt.Errorf("unknown %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", c.APIAddr(0))
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cl.Status(ctx); err != nil {
		t.Fatalf("status through the dialer: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) == 0 {
		t.Fatal("the dialer was not used")
	}
}
