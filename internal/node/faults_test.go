package node_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestLeaderLossWhilePublishing(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	c := dirtest.New(t, 3, nil)
	c.Leader()
	pubs := []*dirtest.Publisher{c.NewPublisher("w1", 1), c.NewPublisher("w2", 2)}
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	stop := make(chan struct{})
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := p.Publish(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	testkit.Eventually(t, 10*time.Second, "some batches", func() (bool, string) { return len(pubs[0].Acked()) > 20, "" })
	old := c.Leader()
	c.Stop(old)
	testkit.Eventually(t, 10*time.Second, "a new leader", func() (bool, string) {
		for _, n := range c.Nodes() {
			if n != nil && n.IsLeader() {
				return true, ""
			}
		}
		return false, ""
	})
	before := len(pubs[0].Acked())
	testkit.Eventually(t, 20*time.Second, "publishing to resume", func() (bool, string) { return len(pubs[0].Acked()) > before+20, "" })
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	c.Check(pubs...)
	// The old leader comes back and catches up.
	c.Restart(old)
	c.Check(pubs...)
}

func TestMinorityPartitionAndHeal(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	// Timeouts three times the kit's: on a loaded machine the 50 ms leader
	// lease of the default ran out with the partition and the leader
	// stepped down under the writes this test needs the majority to commit.
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	p := c.NewPublisher("w1", 1)
	for range 10 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	f := c.Follower()
	c.Isolate(f)
	for range 30 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	// The isolated node cannot have seen the later writes.
	if got := c.Node(f).FSM().AppliedIndex(); got >= c.Node(c.Leader()).FSM().AppliedIndex() {
		t.Fatalf("isolated node applied %d, as far as the leader", got)
	}
	// Only Raft is cut: a write sent to the isolated node is forwarded over
	// gRPC to the leader and committed by the majority, though the isolated
	// node itself does not see it until the partition heals. That holds
	// also once the isolated node has given up on its leader and is
	// campaigning: it forwards to the last leader it knew.
	testkit.Eventually(t, 10*time.Second, "the isolated node to forget its leader", func() (bool, string) {
		addr, id := c.Node(f).Raft().LeaderWithID()
		return addr == "" && id == "", string(id)
	})
	if _, err := kvdirv1.NewAgentServiceClient(c.Conn(f)).Register(context.Background(),
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w9", BlockSize: 16}}); err != nil {
		t.Fatalf("write through the isolated node: %v", err)
	}
	if _, ok := c.Node(f).FSM().Worker("w9"); ok {
		t.Fatal("isolated node applied a write")
	}
	// Cut off for longer than MaxStaleness, it refuses reads; healed, it
	// answers again.
	read := func() error {
		_, err := kvdirv1.NewDirectoryServiceClient(c.Conn(f)).ListWorkers(context.Background(), &kvdirv1.ListWorkersRequest{})
		return err
	}
	testkit.Eventually(t, 10*time.Second, "the isolated node to refuse reads", func() (bool, string) { return status.Code(read()) == codes.Unavailable, "" })
	c.Heal()
	testkit.Eventually(t, 10*time.Second, "the healed node to answer reads", func() (bool, string) { return read() == nil, "" })
	c.Check(p)
	if _, ok := c.Node(f).FSM().Worker("w9"); !ok {
		t.Fatal("healed node lacks the forwarded write")
	}
}

func TestIsolatedLeaderStepsDown(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	old := c.Leader()
	c.Isolate(old)
	// A write sent to the cut-off leader cannot commit: it fails, it is
	// never acknowledged.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := kvdirv1.NewAgentServiceClient(c.Conn(old)).Register(ctx,
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "lost", BlockSize: 16}})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write to an isolated leader: %v, want Unavailable", err)
	}
	testkit.Eventually(t, 10*time.Second, "a leader on the majority side", func() (bool, string) {
		for i := range c.Size() {
			if i != old && c.Node(i).IsLeader() {
				return true, ""
			}
		}
		return false, ""
	})
	p.UseNode(old + 1) // publish on the majority side
	for range 10 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the old leader to step down", func() (bool, string) { return !c.Node(old).IsLeader(), "" })
	c.Heal()
	c.Check(p)
	if _, ok := c.Node(old).FSM().Worker("lost"); ok {
		t.Fatal("a write refused by the isolated leader was applied after healing")
	}
}

func TestSnapshotInstalledOnLaggingFollower(t *testing.T) {
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.SnapshotThreshold = 32
		cfg.TrailingLogs = 8
		cfg.SnapshotInterval = 50 * time.Millisecond
	})
	p := c.NewPublisher("w1", 1)
	f := c.Follower()
	c.Isolate(f)
	for range 100 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	l := c.Leader()
	if err := c.Node(l).Raft().Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		t.Fatal(err)
	}
	// The log the follower lacks is compacted away: it needs the snapshot.
	first, _ := c.Store(l).FirstIndex()
	if first <= c.Node(f).FSM().AppliedIndex()+1 {
		t.Fatalf("leader's log still starts at %d; follower applied %d", first, c.Node(f).FSM().AppliedIndex())
	}
	c.Heal()
	c.Check(p)
	if snaps, _ := c.Snapshots(f).List(); len(snaps) == 0 {
		t.Fatal("follower caught up without installing a snapshot")
	}
}

func TestRestartFromStores(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	for range 20 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.Size() {
		c.Stop(i)
	}
	for i := range c.Size() {
		c.Restart(i)
	}
	c.Leader()
	c.Check(p)
	for range 5 { // and it goes on
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	c.Check(p)
}

func TestWipedNodeRejoins(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	for range 20 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	f := c.Follower()
	join := []string{c.Node(c.Leader()).APIAddr()}
	c.Stop(f)
	c.Wipe(f)
	c.Configure(func(i int, cfg *node.Config) {
		if i == f {
			cfg.Join = join
		}
	})
	c.Restart(f)
	c.Check(p)
}

func TestDuplicateDroppedAndStaleEpochFenced(t *testing.T) {
	c := dirtest.New(t, 3, nil)
	p := c.NewPublisher("w1", 1)
	if err := p.Publish(); err != nil {
		t.Fatal(err)
	}
	c.Converged()
	digest := c.Node(0).FSM().Digest()
	// Re-send batch 1 on a new stream: dropped.
	s, err := kvdirv1.NewAgentServiceClient(c.Conn(c.Follower())).Publish(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	send := func(b *kvdirv1.EventBatch) *kvdirv1.PublishResponse {
		t.Helper()
		if err := s.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	dup := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.Epoch(), FirstSeq: 1, LastSeq: 1, Events: []*kvdirv1.Event{
		{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: []uint64{777}}}},
	}}
	if r := send(dup); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE {
		t.Fatalf("re-sent batch: %v", r)
	}
	gap := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.Epoch(), FirstSeq: 5, LastSeq: 5}
	if r := send(gap); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_GAP || r.AppliedSeq != 1 {
		t.Fatalf("gap: %v", r)
	}
	c.Converged()
	if d := c.Node(0).FSM().Digest(); d != digest {
		t.Fatal("a dropped batch changed the state")
	}
	// A new incarnation registers: the old epoch is fenced and its blocks gone.
	epoch2 := c.Register("w1")
	if epoch2 != p.Epoch()+1 {
		t.Fatalf("new epoch %d, want %d", epoch2, p.Epoch()+1)
	}
	stale := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.Epoch(), FirstSeq: 2, LastSeq: 2}
	if r := send(stale); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH || r.CurrentEpoch != epoch2 {
		t.Fatalf("stale epoch: %v", r)
	}
	c.Converged()
	for _, n := range c.Nodes() {
		if w, _ := n.FSM().Worker("w1"); w.Blocks != 0 {
			t.Fatalf("node %s: re-registered worker still holds %d blocks", n.ID(), w.Blocks)
		}
	}
}

func TestLeaseExpiryAndLeaderChange(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	const lease = 600 * time.Millisecond
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.Lease = lease
		cfg.LoadInterval = 100 * time.Millisecond
	})
	alive := c.NewPublisher("alive", 2)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // alive heartbeats through any node, with load
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for j := range c.Size() {
				n := c.Node((i + j) % c.Size())
				if n == nil {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := kvdirv1.NewAgentServiceClient(c.Conn((i+j)%c.Size())).Heartbeat(ctx, &kvdirv1.HeartbeatRequest{
					WorkerId: "alive", Epoch: alive.Epoch(), Load: &kvdirv1.Load{Running: uint32(i % 7)},
				})
				cancel()
				if err == nil {
					break
				}
			}
		}
	}()
	silent := c.NewPublisher("silent", 1)
	for _, p := range []*dirtest.Publisher{silent, alive} {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the silent worker to expire", func() (bool, string) {
		w, _ := c.Node(c.Leader()).FSM().Worker("silent")
		return w.State == kvdirv1.WorkerState_WORKER_STATE_EXPIRED, ""
	})
	testkit.Eventually(t, 10*time.Second, "the alive worker's load", func() (bool, string) {
		w, _ := c.Node(c.Leader()).FSM().Worker("alive")
		return w.Load != nil && w.LoadTimeUnixNano > 0, ""
	})
	// A leader change must not expire workers that keep heartbeating.
	old := c.Leader()
	c.Stop(old)
	c.Leader()
	// Watch for three leases: an absence can only be observed over time.
	time.Sleep(3 * lease)
	l := c.Node(c.Leader())
	if w, _ := l.FSM().Worker("alive"); w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE {
		t.Fatalf("heartbeating worker is %v after a leader change", w.State)
	}
	c.Converged()
	for _, n := range c.Nodes() {
		if n == nil {
			continue
		}
		if w, _ := n.FSM().Worker("silent"); w.Blocks != 0 || w.State != kvdirv1.WorkerState_WORKER_STATE_EXPIRED {
			t.Fatalf("node %s: expired worker %v", n.ID(), w)
		}
		if ms, _, _ := n.FSM().Match(nil, silent.Acked()[0]); len(ms) != 0 {
			t.Fatalf("node %s still matches an expired worker's blocks: %v", n.ID(), ms)
		}
	}
}

func TestMembershipChange(t *testing.T) {
	testkit.SkipIfShort(t, "a fault scenario on an in-process cluster, several seconds long")
	// Timeouts three times the kit's: on a loaded machine the 50 ms leader
	// lease of the default ran out with the partition and the leader
	// stepped down under the writes this test needs the majority to commit.
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	p := c.NewPublisher("w1", 1)
	for range 10 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth node joins through a follower.
	join := c.Node(c.Follower()).APIAddr()
	c.Configure(func(i int, cfg *node.Config) {
		if i == 3 {
			cfg.Join = []string{join}
		}
	})
	if added := c.Add(); added != 3 {
		t.Fatalf("added node %d, want 3", added)
	}
	testkit.Eventually(t, 10*time.Second, "four voters", func() (bool, string) {
		return len(c.Node(c.Leader()).Raft().GetConfiguration().Configuration().Servers) == 4, ""
	})
	c.Check(p)
	// Remove a follower through the admin API; the rest goes on.
	victim := c.Follower()
	if _, err := kvdirv1.NewAdminServiceClient(c.Conn(c.Leader())).RemoveMember(context.Background(),
		&kvdirv1.RemoveMemberRequest{Id: c.Node(victim).ID()}); err != nil {
		t.Fatal(err)
	}
	// The removed node no longer hears from a leader; once that lasts
	// longer than MaxStaleness it refuses reads rather than answer from a
	// state that no longer follows the log.
	testkit.Eventually(t, 10*time.Second, "the removed node to refuse reads", func() (bool, string) {
		_, err := kvdirv1.NewDirectoryServiceClient(c.Conn(victim)).ListWorkers(context.Background(), &kvdirv1.ListWorkersRequest{})
		return status.Code(err) == codes.Unavailable, ""
	})
	c.Stop(victim)
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	c.Check(p)
	if n := len(c.Node(c.Leader()).Raft().GetConfiguration().Configuration().Servers); n != 3 {
		t.Fatalf("%d members after removal", n)
	}
}

// failingStore is a log store whose writes fail while failing is set, as a
// full or broken disk's would.
type failingStore struct {
	*raft.InmemStore
	failing atomic.Bool
}

var errDiskFull = errors.New("write raft.db: no space left on device")

func (s *failingStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *failingStore) StoreLogs(logs []*raft.Log) error {
	if s.failing.Load() {
		return errDiskFull
	}
	return s.InmemStore.StoreLogs(logs)
}

func TestFailingDiskRefusesWrites(t *testing.T) {
	var bad *failingStore
	c := dirtest.New(t, 3, func(i int, cfg *node.Config) {
		if i == 0 && bad == nil {
			bad = &failingStore{InmemStore: raft.NewInmemStore()}
			cfg.LogStore = bad
		}
	})
	p := c.NewPublisher("w1", 1)
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	// Make the node with the bad disk the leader, then break its disk.
	if l := c.Leader(); l != 0 {
		if err := c.Node(l).Raft().LeadershipTransferToServer("n0", c.RaftAddr(0)).Error(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "n0 to lead", func() (bool, string) { return c.Node(0).IsLeader(), "" })
	bad.failing.Store(true)
	_, err := kvdirv1.NewAgentServiceClient(c.Conn(0)).Register(context.Background(),
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "never", BlockSize: 16}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write on a leader whose disk fails: %v, want Unavailable", err)
	}
	// It says so, and is not ready.
	st, err := kvdirv1.NewAdminServiceClient(c.Conn(0)).Status(context.Background(), &kvdirv1.StatusRequest{})
	if err != nil || !strings.Contains(st.WriteError, "no space left") {
		t.Fatalf("status of the failing node: %v %v", st, err)
	}
	if err := node.Ready(c.Node(0)); err == nil {
		t.Fatal("a node whose writes fail reports ready")
	}
	// The others take over; acknowledged writes survive; the refused one
	// was never applied anywhere.
	testkit.Eventually(t, 10*time.Second, "a healthy leader", func() (bool, string) {
		return c.Node(1).IsLeader() || c.Node(2).IsLeader(), ""
	})
	p.UseNode(1)
	for range 5 {
		if err := p.Publish(); err != nil {
			t.Fatal(err)
		}
	}
	bad.failing.Store(false) // the disk is replaced
	c.Check(p)
	for _, n := range c.Nodes() {
		if _, ok := n.FSM().Worker("never"); ok {
			t.Fatalf("node %s applied a write that was refused", n.ID())
		}
	}
}
