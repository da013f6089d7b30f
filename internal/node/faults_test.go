package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// testPublisher publishes one worker's batches one at a time, moving to the
// next running node and re-sending the batch whenever a node fails it, as a
// real agent does. It records what was acknowledged.
type testPublisher struct {
	t      *testing.T
	c      *testCluster
	worker string
	epoch  uint64
	seq    uint64
	next   uint64 // hash generator

	mu     sync.Mutex
	acked  [][]uint64 // chains of acknowledged batches
	stream kvdirv1.AgentService_PublishClient
	at     int
}

func (c *testCluster) register(worker string) uint64 {
	c.t.Helper()
	var epoch uint64
	waitFor(c.t, "registration", 10*time.Second, func() bool {
		for i, n := range c.nodes {
			if n == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := kvdirv1.NewAgentServiceClient(c.conn(i)).Register(ctx,
				&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: worker, BlockSize: 16, Model: "m"}})
			cancel()
			if err == nil {
				epoch = resp.Epoch
				return true
			}
		}
		return false
	})
	return epoch
}

func newTestPublisher(c *testCluster, worker string, seed uint64) *testPublisher {
	return &testPublisher{t: c.t, c: c, worker: worker, epoch: c.register(worker), next: seed << 32}
}

// publish sends one batch storing a fresh 8-block chain and returns once a
// node acknowledged it (APPLIED or DUPLICATE).
func (p *testPublisher) publish() error {
	p.seq++
	chain := make([]uint64, 8)
	for i := range chain {
		p.next++
		chain[i] = p.next
	}
	batch := &kvdirv1.EventBatch{
		WorkerId: p.worker, Epoch: p.epoch, FirstSeq: p.seq, LastSeq: p.seq,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}},
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := p.sendOnce(batch)
		if err != nil {
			p.stream = nil
			p.at++
			time.Sleep(20 * time.Millisecond) // back off before trying the next node
			continue
		}
		switch resp.Status {
		case kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED, kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE:
			p.mu.Lock()
			p.acked = append(p.acked, chain)
			p.mu.Unlock()
			return nil
		default:
			return fmt.Errorf("batch %d refused: %v %s", p.seq, resp.Status, resp.Message)
		}
	}
	return fmt.Errorf("batch %d not acknowledged in time", p.seq)
}

func (p *testPublisher) sendOnce(b *kvdirv1.EventBatch) (*kvdirv1.PublishResponse, error) {
	if p.stream == nil {
		i := p.at % len(p.c.nodes)
		if p.c.node(i) == nil {
			return nil, errors.New("node down")
		}
		s, err := kvdirv1.NewAgentServiceClient(p.c.conn(i)).Publish(context.Background())
		if err != nil {
			return nil, err
		}
		p.stream = s
	}
	if err := p.stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
		return nil, err
	}
	return p.stream.Recv()
}

func (p *testPublisher) ackedChains() [][]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acked)
}

// checkInvariants: all running nodes converge to one state, and every
// acknowledged batch's blocks are held by its worker on every node.
func (c *testCluster) checkInvariants(pubs ...*testPublisher) {
	c.t.Helper()
	c.converged()
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		for _, p := range pubs {
			for _, chain := range p.ackedChains() {
				// Acknowledged pieces were stored under the root, so
				// each is a chain of its own.
				ms, _, err := n.FSM().Match(nil, chain)
				if err != nil || len(ms) != 1 || ms[0].Worker != p.worker || ms[0].Blocks != len(chain) {
					c.t.Fatalf("node %s lost an acknowledged batch of %s: match %v %v", n.ID(), p.worker, ms, err)
				}
			}
			w, ok := n.FSM().Worker(p.worker)
			if !ok || w.AppliedSeq < uint64(len(p.ackedChains())) {
				c.t.Fatalf("node %s: worker %s applied seq %v, acknowledged %d", n.ID(), p.worker, w, len(p.ackedChains()))
			}
		}
	}
}

func TestLeaderLossWhilePublishing(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	c.leader()
	pubs := []*testPublisher{newTestPublisher(c, "w1", 1), newTestPublisher(c, "w2", 2)}
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
				if err := p.publish(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	waitFor(t, "some batches", 10*time.Second, func() bool { return len(pubs[0].ackedChains()) > 20 })
	old := c.leader()
	c.stop(old)
	waitFor(t, "a new leader", 10*time.Second, func() bool {
		for _, n := range c.nodes {
			if n != nil && n.IsLeader() {
				return true
			}
		}
		return false
	})
	before := len(pubs[0].ackedChains())
	waitFor(t, "publishing to resume", 20*time.Second, func() bool { return len(pubs[0].ackedChains()) > before+20 })
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	c.checkInvariants(pubs...)
	// The old leader comes back and catches up.
	c.restart(old)
	c.checkInvariants(pubs...)
}

func TestMinorityPartitionAndHeal(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	for range 10 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	f := c.follower()
	c.isolate(f)
	for range 30 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	// The isolated node cannot have seen the later writes.
	if got := c.nodes[f].FSM().AppliedIndex(); got >= c.nodes[c.leader()].FSM().AppliedIndex() {
		t.Fatalf("isolated node applied %d, as far as the leader", got)
	}
	// Only Raft is cut: a write sent to the isolated node is forwarded over
	// gRPC to the leader and committed by the majority, though the isolated
	// node itself does not see it until the partition heals.
	if _, err := kvdirv1.NewAgentServiceClient(c.conn(f)).Register(context.Background(),
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w9", BlockSize: 16}}); err != nil {
		t.Fatalf("write through the isolated node: %v", err)
	}
	if _, ok := c.nodes[f].FSM().Worker("w9"); ok {
		t.Fatal("isolated node applied a write")
	}
	// Cut off for longer than MaxStaleness, it refuses reads; healed, it
	// answers again.
	read := func() error {
		_, err := kvdirv1.NewDirectoryServiceClient(c.conn(f)).ListWorkers(context.Background(), &kvdirv1.ListWorkersRequest{})
		return err
	}
	waitFor(t, "the isolated node to refuse reads", 10*time.Second, func() bool { return status.Code(read()) == codes.Unavailable })
	c.connectAll()
	waitFor(t, "the healed node to answer reads", 10*time.Second, func() bool { return read() == nil })
	c.checkInvariants(p)
	if _, ok := c.nodes[f].FSM().Worker("w9"); !ok {
		t.Fatal("healed node lacks the forwarded write")
	}
}

func TestIsolatedLeaderStepsDown(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	for range 5 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	old := c.leader()
	c.isolate(old)
	// A write sent to the cut-off leader cannot commit: it fails, it is
	// never acknowledged.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := kvdirv1.NewAgentServiceClient(c.conn(old)).Register(ctx,
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "lost", BlockSize: 16}})
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write to an isolated leader: %v, want Unavailable", err)
	}
	waitFor(t, "a leader on the majority side", 10*time.Second, func() bool {
		for i, n := range c.nodes {
			if i != old && n.IsLeader() {
				return true
			}
		}
		return false
	})
	p.at = old + 1 // publish on the majority side
	p.stream = nil
	for range 10 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the old leader to step down", 10*time.Second, func() bool { return !c.nodes[old].IsLeader() })
	c.connectAll()
	c.checkInvariants(p)
	if _, ok := c.nodes[old].FSM().Worker("lost"); ok {
		t.Fatal("a write refused by the isolated leader was applied after healing")
	}
}

func TestSnapshotInstalledOnLaggingFollower(t *testing.T) {
	c := newTestCluster(t, 3, func(_ int, cfg *Config) {
		cfg.SnapshotThreshold = 32
		cfg.TrailingLogs = 8
		cfg.SnapshotInterval = 50 * time.Millisecond
	})
	p := newTestPublisher(c, "w1", 1)
	f := c.follower()
	c.isolate(f)
	for range 100 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	l := c.leader()
	if err := c.nodes[l].Raft().Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		t.Fatal(err)
	}
	// The log the follower lacks is compacted away: it needs the snapshot.
	first, _ := c.stores[l].FirstIndex()
	if first <= c.nodes[f].FSM().AppliedIndex()+1 {
		t.Fatalf("leader's log still starts at %d; follower applied %d", first, c.nodes[f].FSM().AppliedIndex())
	}
	c.connectAll()
	c.checkInvariants(p)
	if snaps, _ := c.snaps[f].List(); len(snaps) == 0 {
		t.Fatal("follower caught up without installing a snapshot")
	}
}

func TestRestartFromStores(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	for range 20 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		c.stop(i)
	}
	for i := range c.nodes {
		c.restart(i)
	}
	c.leader()
	c.checkInvariants(p)
	for range 5 { // and it goes on
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	c.checkInvariants(p)
}

func TestWipedNodeRejoins(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	for range 20 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	f := c.follower()
	join := []string{c.nodes[c.leader()].APIAddr()}
	c.stop(f)
	c.stores[f], c.snaps[f] = raft.NewInmemStore(), raft.NewInmemSnapshotStore()
	prev := c.cfg
	c.cfg = func(i int, cfg *Config) {
		if prev != nil {
			prev(i, cfg)
		}
		if i == f {
			cfg.Join = join
		}
	}
	c.restart(f)
	c.checkInvariants(p)
}

func TestDuplicateDroppedAndStaleEpochFenced(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	if err := p.publish(); err != nil {
		t.Fatal(err)
	}
	c.converged()
	digest := c.nodes[0].FSM().Digest()
	// Re-send batch 1 on a new stream: dropped.
	s, err := kvdirv1.NewAgentServiceClient(c.conn(c.follower())).Publish(context.Background())
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
	dup := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.epoch, FirstSeq: 1, LastSeq: 1, Events: []*kvdirv1.Event{
		{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: []uint64{777}}}},
	}}
	if r := send(dup); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE {
		t.Fatalf("re-sent batch: %v", r)
	}
	gap := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.epoch, FirstSeq: 5, LastSeq: 5}
	if r := send(gap); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_GAP || r.AppliedSeq != 1 {
		t.Fatalf("gap: %v", r)
	}
	c.converged()
	if d := c.nodes[0].FSM().Digest(); d != digest {
		t.Fatal("a dropped batch changed the state")
	}
	// A new incarnation registers: the old epoch is fenced and its blocks gone.
	epoch2 := c.register("w1")
	if epoch2 != p.epoch+1 {
		t.Fatalf("new epoch %d, want %d", epoch2, p.epoch+1)
	}
	stale := &kvdirv1.EventBatch{WorkerId: "w1", Epoch: p.epoch, FirstSeq: 2, LastSeq: 2}
	if r := send(stale); r.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH || r.CurrentEpoch != epoch2 {
		t.Fatalf("stale epoch: %v", r)
	}
	c.converged()
	for _, n := range c.nodes {
		if w, _ := n.FSM().Worker("w1"); w.Blocks != 0 {
			t.Fatalf("node %s: re-registered worker still holds %d blocks", n.ID(), w.Blocks)
		}
	}
}

func TestLeaseExpiryAndLeaderChange(t *testing.T) {
	c := newTestCluster(t, 3, func(_ int, cfg *Config) {
		cfg.Lease = 600 * time.Millisecond
		cfg.LoadInterval = 100 * time.Millisecond
	})
	alive := newTestPublisher(c, "alive", 2)
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
			for j := range c.nodes {
				n := c.node((i + j) % len(c.nodes))
				if n == nil {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := kvdirv1.NewAgentServiceClient(c.conn((i+j)%len(c.nodes))).Heartbeat(ctx, &kvdirv1.HeartbeatRequest{
					WorkerId: "alive", Epoch: alive.epoch, Load: &kvdirv1.Load{Running: uint32(i % 7)},
				})
				cancel()
				if err == nil {
					break
				}
			}
		}
	}()
	silent := newTestPublisher(c, "silent", 1)
	for _, p := range []*testPublisher{silent, alive} {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the silent worker to expire", 10*time.Second, func() bool {
		w, _ := c.nodes[c.leader()].FSM().Worker("silent")
		return w.State == kvdirv1.WorkerState_WORKER_STATE_EXPIRED
	})
	waitFor(t, "the alive worker's load", 10*time.Second, func() bool {
		w, _ := c.nodes[c.leader()].FSM().Worker("alive")
		return w.Load != nil && w.LoadTimeUnixNano > 0
	})
	// A leader change must not expire workers that keep heartbeating.
	old := c.leader()
	c.stop(old)
	c.leader()
	// Watch for three leases: an absence can only be observed over time.
	time.Sleep(3 * c.nodes[c.leader()].cfg.Lease)
	l := c.nodes[c.leader()]
	if w, _ := l.FSM().Worker("alive"); w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE {
		t.Fatalf("heartbeating worker is %v after a leader change", w.State)
	}
	c.converged()
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		if w, _ := n.FSM().Worker("silent"); w.Blocks != 0 || w.State != kvdirv1.WorkerState_WORKER_STATE_EXPIRED {
			t.Fatalf("node %s: expired worker %v", n.ID(), w)
		}
		if ms, _, _ := n.FSM().Match(nil, silent.ackedChains()[0]); len(ms) != 0 {
			t.Fatalf("node %s still matches an expired worker's blocks: %v", n.ID(), ms)
		}
	}
}

func TestMembershipChange(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	p := newTestPublisher(c, "w1", 1)
	for range 10 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth node joins through a follower.
	addr, tr := raft.NewInmemTransport("raft-3")
	c.trans = append(c.trans, tr)
	c.stores = append(c.stores, raft.NewInmemStore())
	c.snaps = append(c.snaps, raft.NewInmemSnapshotStore())
	c.connectAll()
	join := c.nodes[c.follower()].APIAddr()
	prev := c.cfg
	c.cfg = func(i int, cfg *Config) {
		if prev != nil {
			prev(i, cfg)
		}
		if i == 3 {
			cfg.Join = []string{join}
		}
	}
	_ = addr
	c.nodes = append(c.nodes, c.start(3, nil))
	waitFor(t, "four voters", 10*time.Second, func() bool {
		return len(c.nodes[c.leader()].Raft().GetConfiguration().Configuration().Servers) == 4
	})
	c.checkInvariants(p)
	// Remove a follower through the admin API; the rest goes on.
	victim := c.follower()
	if _, err := kvdirv1.NewAdminServiceClient(c.conn(c.leader())).RemoveMember(context.Background(),
		&kvdirv1.RemoveMemberRequest{Id: c.nodes[victim].ID()}); err != nil {
		t.Fatal(err)
	}
	// The removed node no longer hears from a leader; once that lasts
	// longer than MaxStaleness it refuses reads rather than answer from a
	// state that no longer follows the log.
	waitFor(t, "the removed node to refuse reads", 10*time.Second, func() bool {
		_, err := kvdirv1.NewDirectoryServiceClient(c.conn(victim)).ListWorkers(context.Background(), &kvdirv1.ListWorkersRequest{})
		return status.Code(err) == codes.Unavailable
	})
	c.stop(victim)
	for range 5 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	c.checkInvariants(p)
	if n := len(c.nodes[c.leader()].Raft().GetConfiguration().Configuration().Servers); n != 3 {
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
	c := newTestCluster(t, 3, func(i int, cfg *Config) {
		if i == 0 && bad == nil {
			bad = &failingStore{InmemStore: raft.NewInmemStore()}
			cfg.LogStore = bad
		}
	})
	p := newTestPublisher(c, "w1", 1)
	for range 5 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	// Make the node with the bad disk the leader, then break its disk.
	if l := c.leader(); l != 0 {
		if err := c.nodes[l].Raft().LeadershipTransferToServer("n0", c.trans[0].LocalAddr()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "n0 to lead", 10*time.Second, func() bool { return c.nodes[0].IsLeader() })
	bad.failing.Store(true)
	_, err := kvdirv1.NewAgentServiceClient(c.conn(0)).Register(context.Background(),
		&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "never", BlockSize: 16}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write on a leader whose disk fails: %v, want Unavailable", err)
	}
	// It says so, and is not ready.
	st, err := kvdirv1.NewAdminServiceClient(c.conn(0)).Status(context.Background(), &kvdirv1.StatusRequest{})
	if err != nil || !strings.Contains(st.WriteError, "no space left") {
		t.Fatalf("status of the failing node: %v %v", st, err)
	}
	if err := c.nodes[0].ready(); err == nil {
		t.Fatal("a node whose writes fail reports ready")
	}
	// The others take over; acknowledged writes survive; the refused one
	// was never applied anywhere.
	waitFor(t, "a healthy leader", 10*time.Second, func() bool {
		return c.nodes[1].IsLeader() || c.nodes[2].IsLeader()
	})
	p.at, p.stream = 1, nil
	for range 5 {
		if err := p.publish(); err != nil {
			t.Fatal(err)
		}
	}
	bad.failing.Store(false) // the disk is replaced
	c.checkInvariants(p)
	for _, n := range c.nodes {
		if _, ok := n.FSM().Worker("never"); ok {
			t.Fatalf("node %s applied a write that was refused", n.ID())
		}
	}
}
