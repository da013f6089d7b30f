package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// publisher publishes batches for one worker through one node, one batch
// in flight at a time, re-sending a batch whose answer did not come.
type publisher struct {
	agent  kvdirv1.AgentServiceClient
	worker string
	epoch  uint64
	next   uint64 // sequence number of the next batch

	mu     sync.Mutex
	acked  []uint64       // sequence numbers acknowledged (APPLIED or DUPLICATE)
	maxIdx uint64         // highest Raft index among the acknowledgements
	errs   map[string]int // why streams failed (leader changes), by gRPC code
}

const blocksPerBatch = 4

// chain is the chain of blocks batch seq stores: a root chain of its own.
func chain(seq uint64) []uint64 {
	out := make([]uint64, blocksPerBatch)
	for j := range out {
		out[j] = seq<<8 | uint64(j+1)
	}
	return out
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// run publishes until stop returns true (checked between batches) or ctx
// ends. A refused batch (gap, stale epoch...) is an error.
func (p *publisher) run(ctx context.Context, stop func() bool) error {
	var stream kvdirv1.AgentService_PublishClient
	cancel := func() {}
	defer func() { cancel() }()
	pace := time.NewTicker(10 * time.Millisecond) // bounds the load on a 2-core machine
	defer pace.Stop()
	retry := func(stage string, err error) error {
		cancel()
		stream = nil
		p.mu.Lock()
		if p.errs == nil {
			p.errs = map[string]int{}
		}
		p.errs[stage+":"+status.Code(err).String()]++
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish batch %d: %w", p.next, ctx.Err())
		case <-time.After(50 * time.Millisecond): // back off before reconnecting
			return nil
		}
	}
	for !stop() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish batch %d: %w", p.next, ctx.Err())
		case <-pace.C:
		}
		if stream == nil {
			sctx, streamCancel := context.WithCancel(ctx)
			cancel = streamCancel
			s, err := p.agent.Publish(sctx)
			if err != nil {
				if err := retry("open", err); err != nil {
					return err
				}
				continue
			}
			stream = s
		}
		seq := p.next
		err := stream.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
			WorkerId: p.worker, Epoch: p.epoch, FirstSeq: seq, LastSeq: seq,
			Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain(seq)}}}},
		}})
		if err != nil {
			if err := retry("send", err); err != nil {
				return err
			}
			continue
		}
		// An answer that does not come within 3s is given up on, as an
		// agent would: start a new stream and send the batch again.
		timer := time.AfterFunc(3*time.Second, cancel)
		resp, err := stream.Recv()
		timer.Stop()
		if err != nil {
			if err := retry("recv", err); err != nil {
				return err
			}
			continue
		}
		switch {
		case resp.FirstSeq != seq:
			return fmt.Errorf("sent batch %d, answered batch %d: %v", seq, resp.FirstSeq, resp)
		case resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED,
			resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE:
			p.mu.Lock()
			p.acked = append(p.acked, seq)
			p.maxIdx = max(p.maxIdx, resp.RaftIndex)
			p.mu.Unlock()
			p.next++
		default:
			return fmt.Errorf("batch %d refused: %v", seq, resp)
		}
	}
	return nil
}

// checkHeld checks that node i holds every acknowledged batch's blocks.
func checkHeld(t *testing.T, n *fleet.DirNode, p *publisher) {
	t.Helper()
	p.mu.Lock()
	acked, maxIdx := append([]uint64(nil), p.acked...), p.maxIdx
	p.mu.Unlock()
	id := n.ID
	testkit.Eventually(t, 15*time.Second, fmt.Sprintf("%s to apply index %d", id, maxIdx), func() (bool, string) {
		st, err := n.Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return st.AppliedIndex >= maxIdx, fmt.Sprintf("applied %d", st.AppliedIndex)
	})
	dir := kvdirv1.NewDirectoryServiceClient(n.Conn())
	var lost []uint64
	for _, seq := range acked {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := dir.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chain(seq), BlockSize: 16}}})
		cancel()
		if err != nil {
			t.Fatalf("match batch %d on %s: %v", seq, id, err)
		}
		if len(m.Matches) != 1 || m.Matches[0].WorkerId != p.worker || m.Matches[0].Blocks != blocksPerBatch {
			lost = append(lost, seq)
		}
	}
	if len(lost) > 0 {
		t.Errorf("%s lost %d of %d acknowledged batches, e.g. %v", id, len(lost), len(acked), lost[:min(len(lost), 10)])
	}
}

// TestClusterProcesses runs three directory processes (set TEST_DUMP_LOGS=1
// to see their logs even when it passes): publishing through a
// follower survives a kill -9 of the leader without losing an acknowledged
// batch, the killed node catches up after a restart, and SIGTERM on the
// leader hands leadership over and exits 0.
func TestClusterProcesses(t *testing.T) {
	start := time.Now()
	c := startDirectory(t, 3,
		"--heartbeat-timeout", "250ms", "--election-timeout", "250ms",
		"--lease", "10m", // the test worker sends no heartbeats
		"--snapshot-interval", "500ms", "--snapshot-threshold", "200", "--trailing-logs", "50",
		"--shutdown-timeout", "10s")
	all := []int{0, 1, 2}
	leader := waitLeader(t, c, 20*time.Second)
	follower := (leader + 1) % 3
	t.Logf("%v: leader %s; publishing through %s", time.Since(start).Round(time.Millisecond), c.Nodes[leader].ID, c.Nodes[follower].ID)

	agent := kvdirv1.NewAgentServiceClient(c.Nodes[follower].Conn())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w1", Model: "m", BlockSize: 16}})
	if err != nil {
		t.Fatalf("register through %s: %v", c.Nodes[follower].ID, err)
	}
	p := &publisher{agent: agent, worker: "w1", epoch: reg.Epoch, next: 1}
	if err := p.run(ctx, func() bool { return p.count() >= 5 }); err != nil {
		t.Fatal(err)
	}

	// Keep publishing in the background while the leader is killed.
	stop := make(chan struct{})
	pubErr := make(chan error, 1)
	go func() {
		pubErr <- p.run(ctx, func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		})
	}()
	stopPublisher := func() {
		close(stop)
		if err := <-pubErr; err != nil {
			t.Fatalf("publisher: %v", err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "more batches in flight", func() (bool, string) { return p.count() >= 15, fmt.Sprint(p.count()) })
	killed := leader
	c.Nodes[killed].Kill9()
	atKill := p.count()
	p.mu.Lock()
	idxAtKill := p.maxIdx
	p.mu.Unlock()
	t.Logf("%v: killed leader %s with %d batches acknowledged", time.Since(start).Round(time.Millisecond), c.Nodes[killed].ID, atKill)

	survivors := []int{(killed + 1) % 3, (killed + 2) % 3}
	leader = waitLeader(t, c, 20*time.Second)
	atLeader := p.count()
	// Enough writes that the new leader snapshots and compacts its log past
	// what the killed node has (threshold 200, trailing logs 50): the
	// killed node must then catch up from a snapshot.
	testkit.Eventually(t, 30*time.Second, "publishing to go on under the new leader", func() (bool, string) {
		select {
		case err := <-pubErr:
			t.Fatalf("publisher stopped: %v", err)
		default:
		}
		return p.count() >= atLeader+300, fmt.Sprint(p.count())
	})
	stopPublisher()
	p.mu.Lock()
	t.Logf("%v: new leader %s; %d batches acknowledged; streams restarted after errors: %v",
		time.Since(start).Round(time.Millisecond), c.Nodes[leader].ID, len(p.acked), p.errs)
	p.mu.Unlock()
	for _, i := range survivors {
		checkHeld(t, c.Nodes[i], p)
	}

	testkit.Eventually(t, 15*time.Second, "the new leader to snapshot past the killed node's log", func() (bool, string) {
		st, err := c.Nodes[leader].Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return st.LastSnapshotIndex > idxAtKill+100, fmt.Sprintf("last snapshot at %d, killed at %d", st.LastSnapshotIndex, idxAtKill)
	})

	// The killed node comes back on its data directory and catches up.
	if err := c.Nodes[killed].Start(); err != nil {
		t.Fatal(err)
	}
	var digest uint64
	testkit.Eventually(t, 30*time.Second, "all three nodes to converge", func() (bool, string) {
		var saw []string
		var first *kvdirv1.StatusResponse
		same := true
		for _, i := range all {
			st, err := c.Nodes[i].Status(context.Background())
			if err != nil {
				return false, fmt.Sprintf("%s: %v", c.Nodes[i].ID, err)
			}
			saw = append(saw, fmt.Sprintf("%s:%s applied=%d digest=%016x", st.NodeId, st.State, st.AppliedIndex, st.Digest))
			if first == nil {
				first = st
			} else if st.AppliedIndex != first.AppliedIndex || st.Digest != first.Digest || st.LeaderId != first.LeaderId {
				same = false
			}
		}
		digest = first.Digest
		return same && first.Digest != 0 && first.Counters.GetWorkers() == 1, strings.Join(saw, "; ")
	})
	checkHeld(t, c.Nodes[killed], p)
	if st, err := c.Nodes[killed].Status(context.Background()); err != nil || st.LastSnapshotIndex == 0 {
		t.Errorf("restarted %s has no snapshot (want one installed by the leader): %v %v", c.Nodes[killed].ID, st, err)
	}
	t.Logf("%v: converged (digest %016x)", time.Since(start).Round(time.Millisecond), digest)

	// SIGTERM on the leader: it hands over leadership and exits 0.
	leader = waitLeader(t, c, 20*time.Second)
	lp := c.Nodes[leader]
	if err := lp.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lp.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s still running 20s after SIGTERM", lp.ID)
	}
	if code := lp.ExitCode(); code != 0 {
		t.Errorf("%s exited %d after SIGTERM, want 0", lp.ID, code)
	}
	if !strings.Contains(lp.Log(), "handed over leadership") {
		t.Errorf("%s did not log that it handed over leadership", lp.ID)
	}
	next := waitLeader(t, c, 20*time.Second) // among the two still running

	if next == leader {
		t.Fatalf("leadership stayed with %s", lp.ID)
	}
	t.Logf("%v: %s stopped cleanly; %s leads", time.Since(start).Round(time.Millisecond), lp.ID, c.Nodes[next].ID)
}
