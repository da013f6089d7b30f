package follow_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// running is a Follower whose Run goroutine the test can stop.
type running struct {
	*follow.Follower
	stop func()
}

// start creates a follower of addrs and runs it until stop or the test's
// end.
func start(t *testing.T, addrs []string) *running {
	t.Helper()
	f, err := follow.New(follow.Config{Addrs: addrs, RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r := &running{Follower: f}
	r.run(t)
	return r
}

func (r *running) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	}
	t.Cleanup(r.stop)
}

// publish sends n batches through each publisher.
func publish(t *testing.T, n int, pubs ...*dirtest.Publisher) {
	t.Helper()
	for range n {
		for _, p := range pubs {
			if err := p.Publish(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// caughtUp waits until f has applied what the running nodes applied and
// holds the same state, after the nodes converged.
func caughtUp(t *testing.T, c *dirtest.Cluster, f *running) {
	t.Helper()
	c.Converged()
	n := c.Nodes()[0]
	testkit.Eventually(t, 15*time.Second, "the follower to catch up with the directory", func() (bool, string) {
		want, wantD, wantI := n.FSM().AppliedIndex(), n.FSM().Digest(), n.FSM().IndexDigest()
		got, gotD, gotI := f.AppliedIndex(), f.Digest(), f.IndexDigest()
		v := f.View()
		viewOK := v.Synced && v.Node != "" && v.AppliedIndex == want && v.Digest == wantD && v.IndexDigest == wantI && v.LagEntries == 0
		return got == want && gotD == wantD && gotI == wantI && f.Lag() == 0 && viewOK,
			fmt.Sprintf("node %s %d/%016x/%016x, follower %d/%016x/%016x lag %d, view %+v", n.ID(), want, wantD, wantI, got, gotD, gotI, f.Lag(), v)
	})
}

// matchesAcked checks that the follower's local Match finds every
// acknowledged batch of each publisher on its worker.
func matchesAcked(t *testing.T, f *running, pubs ...*dirtest.Publisher) {
	t.Helper()
	for _, p := range pubs {
		for _, chain := range p.Acked() {
			ms, _, err := f.FSM().Match(nil, chain)
			if err != nil || len(ms) != 1 || ms[0].Worker != p.Worker() || ms[0].Blocks != len(chain) {
				t.Fatalf("follower lost an acknowledged batch of %s: match %v %v", p.Worker(), ms, err)
			}
		}
	}
}

func TestFollowerEqualsNodeAfterTraffic(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p1, p2 := c.NewPublisher("w1", 1), c.NewPublisher("w2", 2)
	publish(t, 10, p1, p2)
	// One follower joins after traffic (snapshot first), one before more.
	late := start(t, []string{c.APIAddr(c.Follower())})
	publish(t, 20, p1, p2)
	caughtUp(t, c, late)
	matchesAcked(t, late, p1, p2)
	if late.Snapshots() != 1 {
		t.Fatalf("follower restored %d snapshots, want 1 (to start)", late.Snapshots())
	}
	leader := start(t, []string{c.APIAddr(c.Leader())})
	publish(t, 10, p1, p2)
	caughtUp(t, c, leader)
	caughtUp(t, c, late)
	matchesAcked(t, leader, p1, p2)
}

func TestFollowerAcrossLeaderChange(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	old := c.Leader()
	f := start(t, []string{c.APIAddr(old)})
	publish(t, 10, p)
	caughtUp(t, c, f)
	if err := c.Node(old).Raft().LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "a new leader", func() (bool, string) {
		l := c.Leader()
		return l != old, fmt.Sprint("leader ", l)
	})
	publish(t, 10, p)
	caughtUp(t, c, f)
	matchesAcked(t, f, p)
	if f.Snapshots() != 1 {
		t.Fatalf("follower restored %d snapshots across a leader change, want 1", f.Snapshots())
	}
}

func TestFollowerMovesToAnotherNode(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	c.WaitMembers()
	p := c.NewPublisher("w1", 1)
	i := c.Follower()
	addrs := []string{c.APIAddr(i)}
	for j := range c.Size() {
		if j != i {
			addrs = append(addrs, c.APIAddr(j))
		}
	}
	f := start(t, addrs)
	publish(t, 10, p)
	caughtUp(t, c, f)
	if f.Node() != c.APIAddr(i) {
		t.Fatalf("follower streams from %q, want node %d at %s", f.Node(), i, c.APIAddr(i))
	}
	c.Stop(i)
	publish(t, 10, p)
	caughtUp(t, c, f)
	matchesAcked(t, f, p)
	if got := f.Node(); got == addrs[0] {
		t.Fatalf("follower still streams from the stopped node %s", got)
	}
	// The feed of the new node holds the entries after the follower's
	// index, so it resumed without a snapshot.
	if f.Snapshots() != 1 {
		t.Fatalf("follower restored %d snapshots after moving nodes, want 1", f.Snapshots())
	}
}

func TestFollowerResumeBeforeFeedTakesSnapshot(t *testing.T) {
	const feed = 8
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.FollowFeedEntries = feed })
	p := c.NewPublisher("w1", 1)
	f := start(t, []string{c.APIAddr(c.Leader())})
	publish(t, 3, p)
	caughtUp(t, c, f)
	if f.Snapshots() != 1 {
		t.Fatalf("follower restored %d snapshots, want 1", f.Snapshots())
	}
	f.stop()
	resume := f.AppliedIndex()
	publish(t, 3*feed, p) // the feed moves past the follower's index

	// A raw stream from the follower's index starts with a snapshot of
	// an index past it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := kvdirv1.NewDirectoryServiceClient(c.Conn(c.Leader())).Follow(ctx, &kvdirv1.FollowRequest{AfterIndex: resume})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	snap := resp.GetSnapshot()
	if snap == nil || snap.Index <= resume {
		t.Fatalf("first answer to a resume from %d (older than the feed): %v, want a snapshot past it", resume, resp)
	}
	cancel()

	f.run(t)
	caughtUp(t, c, f)
	matchesAcked(t, f, p)
	if f.Snapshots() != 2 {
		t.Fatalf("follower restored %d snapshots, want 2 (start, resume from before the feed)", f.Snapshots())
	}
}

func TestFollowResumeInsideFeedSendsEntries(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	publish(t, 3, p)
	c.Converged()
	n := c.Leader()
	resume := c.Node(n).FSM().AppliedIndex()
	publish(t, 2, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := kvdirv1.NewDirectoryServiceClient(c.Conn(n)).Follow(ctx, &kvdirv1.FollowRequest{AfterIndex: resume})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	es := resp.GetEntries().GetEntries()
	if len(es) == 0 || es[0].Index <= resume || len(es[0].Data) == 0 {
		t.Fatalf("first answer to a resume from %d (inside the feed): %v, want entries after it", resume, resp)
	}
	for i := 1; i < len(es); i++ {
		if es[i].Index <= es[i-1].Index {
			t.Fatalf("entries out of order: %d after %d", es[i].Index, es[i-1].Index)
		}
	}
	if resp.CommitIndex < es[len(es)-1].Index {
		t.Fatalf("commit index %d below the last entry sent %d", resp.CommitIndex, es[len(es)-1].Index)
	}
}

func TestFollowerOfNodeThatInstallsSnapshot(t *testing.T) {
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.SnapshotThreshold = 32
		cfg.TrailingLogs = 8
		cfg.SnapshotInterval = 50 * time.Millisecond
	})
	p := c.NewPublisher("w1", 1)
	i := c.Follower()
	f := start(t, []string{c.APIAddr(i)})
	publish(t, 3, p)
	caughtUp(t, c, f)
	c.Isolate(i)
	publish(t, 100, p)
	l := c.Leader()
	if err := c.Node(l).Raft().Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		t.Fatal(err)
	}
	if first, _ := c.Store(l).FirstIndex(); first <= c.Node(i).FSM().AppliedIndex()+1 {
		t.Fatalf("leader's log still starts at %d; node %d applied %d", first, i, c.Node(i).FSM().AppliedIndex())
	}
	c.Heal()
	// Node i catches up by installing a snapshot, which replaces its state
	// and empties its feed: the follower on it needs a snapshot too.
	caughtUp(t, c, f)
	matchesAcked(t, f, p)
	if snaps, _ := c.Snapshots(i).List(); len(snaps) == 0 {
		t.Fatal("node caught up without installing a snapshot")
	}
	if f.Snapshots() != 2 {
		t.Fatalf("follower restored %d snapshots, want 2 (start, after its node installed one)", f.Snapshots())
	}
}

// TestMatchChainAnswersAsTheNode checks the router's matcher: once the
// follower caught up, MatchChain answers every acknowledged chain (whole,
// and cut short) as the node's own Match does, over and over (its rows
// are reused between calls); it refuses consistent reads, and answers
// nothing before its first snapshot.
func TestMatchChainAnswersAsTheNode(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	p1, p2 := c.NewPublisher("w1", 1), c.NewPublisher("w2", 2)
	publish(t, 5, p1, p2)
	cold, err := follow.New(follow.Config{Addrs: c.APIAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Close()
	if _, err := cold.MatchChain(t.Context(), p1.Acked()[0], 16, false); !errors.Is(err, follow.ErrNotSynced) {
		t.Fatalf("a follower that never ran: %v, want ErrNotSynced", err)
	}
	f := start(t, c.APIAddrs())
	caughtUp(t, c, f)
	dir := kvdirv1.NewDirectoryServiceClient(c.Conn(0))
	for round := range 3 {
		for _, p := range []*dirtest.Publisher{p1, p2} {
			for _, chain := range p.Acked() {
				for _, q := range [][]uint64{chain, chain[:3], append(slices.Clone(chain[:5]), 42)} {
					got, err := f.MatchChain(t.Context(), q, 16, false)
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					want, err := dir.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: q, BlockSize: 16}}})
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					if got.GetChainBlocks() != want.GetChainBlocks() || len(got.GetMatches()) != len(want.GetMatches()) {
						t.Fatalf("round %d: local %v, node %v", round, got, want)
					}
					for i, m := range got.GetMatches() {
						if !proto.Equal(m, want.GetMatches()[i]) {
							t.Fatalf("round %d: local match %v, node %v", round, m, want.GetMatches()[i])
						}
					}
				}
			}
		}
	}
	if _, err := f.MatchChain(t.Context(), p1.Acked()[0], 16, true); !errors.Is(err, follow.ErrConsistent) {
		t.Fatalf("consistent read: %v, want ErrConsistent", err)
	}
}
