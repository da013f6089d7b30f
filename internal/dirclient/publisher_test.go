package dirclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func stored(parent uint64, hashes ...uint64) *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Parent: parent, Hashes: hashes}}}
}

// chainHash is block i of the test chain (never 0).
func chainHash(i int) uint64 { return 0x9e3779b97f4a7c15*uint64(i+1) | 1 }

// sendChain publishes blocks [from, to) of the test chain, one per batch.
func sendChain(t *testing.T, ctx context.Context, p *Publisher, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		var parent uint64
		if i > 0 {
			parent = chainHash(i - 1)
		}
		seq, err := p.Send(ctx, []*kvdirv1.Event{stored(parent, chainHash(i))})
		if err != nil {
			t.Errorf("send %d: %v", i, err)
			return
		}
		if seq != uint64(i+1) {
			t.Errorf("send %d: sequence %d", i, seq)
			return
		}
	}
}

// checkDelivered checks that every running node applied exactly n batches
// of the worker and holds the n-block chain.
func checkDelivered(t *testing.T, c *dirtest.Cluster, cl *Client, p *Publisher, n int) {
	t.Helper()
	if got := p.Acked(); got != uint64(n) {
		t.Fatalf("acked %d, want %d", got, n)
	}
	st := p.Stats()
	if st.Applied+st.Duplicate != uint64(n) || st.Unexpected != 0 || p.Pending() != 0 {
		t.Fatalf("stats %+v, pending %d: want %d acknowledgements", st, p.Pending(), n)
	}
	t.Logf("publisher stats: %+v", st)
	chain := make([]uint64, n)
	for i := range chain {
		chain[i] = chainHash(i)
	}
	for i := range c.Size() {
		nd := c.Node(i)
		if nd == nil {
			continue
		}
		testkit.Eventually(t, 10*time.Second, "the node to apply every batch", func() (bool, string) {
			w, ok := nd.FSM().Worker(p.WorkerID())
			return ok && w.AppliedSeq == uint64(n), ""
		})
		ms, _, err := nd.FSM().Match(nil, chain)
		if err != nil || len(ms) != 1 || ms[0].Blocks != n {
			t.Fatalf("node %d holds %v (%v), want %d blocks", i, ms, err, n)
		}
	}
	ctx := testCtx(t, 10*time.Second)
	m, err := cl.MatchChain(ctx, chain, 16, true)
	if err != nil || len(m.Matches) != 1 || m.Matches[0].Blocks != uint32(n) {
		t.Fatalf("match: %v %v", m, err)
	}
	gw, err := cl.GetWorker(ctx, p.WorkerID(), 0)
	if err != nil || gw.Worker.AppliedSeq != uint64(n) || gw.Worker.Blocks != uint64(n) {
		t.Fatalf("worker: %v %v", gw, err)
	}
}

func TestPublisherDeliversEveryBatchOnce(t *testing.T) {
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	cl := newClient(t, Config{Addrs: c.APIAddrs()})
	ctx := testCtx(t, 30*time.Second)
	reg, err := cl.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	p := cl.NewPublisher("w1", reg.Epoch)
	defer p.Close()
	const n = 1000
	sendChain(t, ctx, p, 0, n)
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, c, cl, p, n)
	if st := p.Stats(); st.Resent != 0 || st.Duplicate != 0 {
		t.Fatalf("re-sends without a failure: %+v", st)
	}
}

func TestPublisherSurvivesLeaderShutdown(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	cl := newClient(t, Config{Addrs: c.APIAddrs()})
	ctx := testCtx(t, 40*time.Second)
	reg, err := cl.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	l := learnLeader(t, c, cl)
	p := cl.NewPublisher("w1", reg.Epoch)
	defer p.Close()
	const n = 1000
	sendChain(t, ctx, p, 0, n/2)
	testkit.Eventually(t, 10*time.Second, "some batches acknowledged", func() (bool, string) { return p.Acked() >= n/5, "" })

	// Shut the leader down while the rest are being sent.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		sendChain(t, ctx, p, n/2, n)
	}()
	t.Logf("shutting the leader down at acked=%d", p.Acked())
	c.Stop(l)
	<-sent
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, c, cl, p, n)
	if st := p.Stats(); st.Streams < 2 {
		t.Fatalf("the publisher did not reconnect: %+v", st)
	}
	if cl.Leader() == c.APIAddr(l) || cl.Leader() == "" {
		t.Fatalf("leader after shutdown: %q", cl.Leader())
	}
}

func TestPublisherStaleEpoch(t *testing.T) {
	c := dirtest.New(t, 3, dirConfig(node.Tokens{}))
	c.WaitMembers()
	cl := newClient(t, Config{Addrs: c.APIAddrs()})
	ctx := testCtx(t, 30*time.Second)
	reg1, err := cl.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	p1 := cl.NewPublisher("w1", reg1.Epoch)
	defer p1.Close()
	sendChain(t, ctx, p1, 0, 5)
	if err := p1.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// A new incarnation registers: the old publisher's next batch is
	// refused and the publisher stops.
	reg2, err := cl.Register(ctx, spec("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p1.Send(ctx, []*kvdirv1.Event{stored(chainHash(4), chainHash(5))}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p1.Done():
	case <-ctx.Done():
		t.Fatal("the stale publisher did not stop")
	}
	var re *RefusedError
	if !errors.As(p1.Err(), &re) || re.Status() != kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH ||
		re.Response.CurrentEpoch != reg2.Epoch {
		t.Fatalf("stale publisher: %v", p1.Err())
	}
	if err := p1.Flush(ctx); !errors.As(err, &re) {
		t.Fatalf("flush of the stale publisher: %v", err)
	}
	if _, err := p1.Send(ctx, nil); !errors.As(err, &re) {
		t.Fatalf("send on the stale publisher: %v", err)
	}
	if p1.Acked() != 5 {
		t.Fatalf("acked %d", p1.Acked())
	}

	// The new epoch starts again at sequence 1.
	p2 := cl.NewPublisher("w1", reg2.Epoch)
	defer p2.Close()
	sendChain(t, ctx, p2, 0, 3)
	if err := p2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if p2.Acked() != 3 {
		t.Fatalf("new publisher acked %d", p2.Acked())
	}
}

func TestPublisherQueueLimitAndClose(t *testing.T) {
	dead := deadAddr(t)
	cl := newClient(t, Config{Addrs: []string{dead}})
	p := cl.NewPublisher("w1", 1, WithQueueLimit(3))
	ctx := testCtx(t, 10*time.Second)
	for i := range 3 {
		if _, err := p.Send(ctx, []*kvdirv1.Event{stored(0, uint64(i+1))}); err != nil {
			t.Fatal(err)
		}
	}
	// Full: Send blocks until its context ends.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.Send(short, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send on a full queue: %v", err)
	}
	if err := p.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush with nothing reachable: %v", err)
	}
	// Close unblocks a blocked Send.
	errc := make(chan error, 1)
	go func() { _, err := p.Send(ctx, nil); errc <- err }()
	p.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if !errors.Is(p.Err(), ErrClosed) || p.Pending() != 3 {
		t.Fatalf("closed publisher: %v, pending %d", p.Err(), p.Pending())
	}
	// Publishers of a closed client are stopped.
	cl.Close()
	if p2 := cl.NewPublisher("w2", 1); !errors.Is(p2.Err(), ErrClosed) {
		t.Fatalf("publisher of a closed client: %v", p2.Err())
	}
}
