package node

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// The leader commits event batches in groups: batches that arrive from any
// stream while earlier groups are being committed go into one Raft entry
// (one PublishCommand), so a burst of small batches costs a few log writes
// instead of one each. Order is kept: batches enter the queue in the order
// their streams send them, groups are proposed in queue order, and Raft
// applies entries in order.
const (
	maxGroupBatches   = 256     // batches per Raft entry
	maxGroupBytes     = 4 << 20 // encoded bytes per Raft entry
	maxGroupsInFlight = 4       // proposed and not yet applied
	// minGroupBatches is the fewest batches a group is proposed with while
	// other groups are in flight and the queue is empty: it waits for the
	// groups ahead of it to settle. See run.
	minGroupBatches = maxGroupBatches / 4
)

// pubResult is the outcome of one submitted batch.
type pubResult struct {
	resp *kvdirv1.PublishResponse
	err  error
}

type pubRequest struct {
	batch *kvdirv1.EventBatch
	done  chan pubResult // buffered, 1
}

type publishBatcher struct {
	n     *Node
	queue chan *pubRequest
	slots chan struct{} // one per group in flight
	// settled is signalled (without blocking) each time a group in flight
	// is applied or fails and frees its slot.
	settled chan struct{}

	// The leader cuts blocks past a worker's quota before proposing them
	// (raftfsm.FSM.CutOverQuota).
	// freeing counts, per worker, the blocks the batches submitted and not
	// yet answered may remove (raftfsm.Frees): room the applied state does
	// not show yet.
	mu      sync.Mutex
	freeing map[string]inFlightFrees
	// cutTerm is the Raft term in which this node, leading, saw every
	// entry of earlier terms applied (a barrier); barrierTerm the term of
	// the barrier last started. Cutting waits for the first.
	cutTerm, barrierTerm atomic.Uint64
}

func newPublishBatcher(n *Node) *publishBatcher {
	return &publishBatcher{
		n:       n,
		queue:   make(chan *pubRequest, 4*maxGroupBatches),
		slots:   make(chan struct{}, maxGroupsInFlight),
		settled: make(chan struct{}, 1),
		freeing: make(map[string]inFlightFrees),
	}
}

// submit queues a batch; its result arrives on the returned channel. It
// fails at once with errShuttingDown when the node stops.
func (b *publishBatcher) submit(batch *kvdirv1.EventBatch) <-chan pubResult {
	r := &pubRequest{batch: batch, done: make(chan pubResult, 1)}
	b.mu.Lock()
	b.addFreeing(batch)
	b.mu.Unlock()
	select {
	case b.queue <- r:
	case <-b.n.stop:
		b.answer([]*pubRequest{r}, pubResult{err: errShuttingDown})
	}
	return r.done
}

// run groups queued batches and proposes them, at most maxGroupsInFlight
// groups at a time; while those commit, the queue fills and the next group
// is larger.
//
// A group that would be small (fewer than minGroupBatches) while others are
// in flight waits, holding its slot, for a group ahead to settle, takes
// what queued meanwhile and looks again; it goes out once it has
// minGroupBatches or is the only group in flight. The groups ahead keep
// Raft busy, so the wait costs no throughput, and every Raft entry costs
// each node a log write and its replication however few batches it
// carries. Publishers that each
// keep one batch in flight (many workers) answer a group one worker at a
// time, so without the wait the slot a group frees is taken at once by the
// few batches sent back so far, and the log fills with entries of a few
// batches each.
func (b *publishBatcher) run() {
	defer b.n.wg.Done()
	for {
		var first *pubRequest
		select {
		case first = <-b.queue:
		case <-b.n.stop:
			b.drain()
			return
		}
		select {
		case b.slots <- struct{}{}:
		case <-b.n.stop:
			b.answer([]*pubRequest{first}, pubResult{err: errShuttingDown})
			b.drain()
			return
		}
		group := []*pubRequest{first}
		size := proto.Size(first.batch)
	fill:
		for len(group) < maxGroupBatches && size < maxGroupBytes {
			select {
			case r := <-b.queue:
				group = append(group, r)
				size += proto.Size(r.batch)
				continue
			default:
			}
			if !keepFilling(len(group), len(b.slots)) {
				break fill
			}
			// The queue fills meanwhile; it is drained when a group
			// ahead settles rather than on every batch that arrives.
			select {
			case <-b.settled:
			case <-b.n.stop:
				<-b.slots
				b.answer(group, pubResult{err: errShuttingDown})
				b.drain()
				return
			}
		}
		b.propose(group)
	}
}

// keepFilling says whether a group of n batches, the queue empty, waits for
// more: while it is small and other groups than it are in flight (inFlight
// counts it too).
func keepFilling(n, inFlight int) bool {
	return n < minGroupBatches && inFlight > 1
}

// release frees a group's slot and tells a group waiting to fill.
func (b *publishBatcher) release() {
	<-b.slots
	select {
	case b.settled <- struct{}{}:
	default:
	}
}

// propose proposes one group and answers its requests once it is applied.
func (b *publishBatcher) propose(group []*pubRequest) {
	n := b.n
	cmd := &kvdirv1.PublishCommand{Batches: make([]*kvdirv1.EventBatch, len(group))}
	var cut []uint64
	for i, r := range group {
		cmd.Batches[i] = r.batch
		// Batches queued before this one are counted in freeing, and so is
		// this one: more room than there may be, never less.
		if c := n.fsm.CutOverQuota(r.batch, b.freed); c > 0 {
			if cut == nil {
				cut = make([]uint64, len(group))
			}
			cut[i] = c
		}
	}
	cmd.QuotaCut = cut
	p, err := n.start(kvdirv1.CommandType_COMMAND_TYPE_PUBLISH, cmd)
	if err != nil {
		b.release()
		b.answer(group, pubResult{err: publishNotLeader(err)})
		return
	}
	n.metrics.groupSize.Observe(float64(len(group)))
	go func() {
		res, _, err := n.wait(p)
		b.release()
		if err != nil {
			b.answer(group, pubResult{err: err})
			return
		}
		b.doneFreeing(group)
		for i, resp := range res.(*raftfsm.PublishResult).Responses {
			group[i].done <- pubResult{resp: resp}
		}
	}()
}

// canCut says whether the leader may cut blocks past quotas now: once, in
// its current term, every entry of earlier terms is applied, so that its
// applied state misses only what it proposed itself. Until then it starts
// a barrier (one at a time), and the state machine alone cuts.
func (b *publishBatcher) canCut() bool {
	r := b.n.raft
	term := r.CurrentTerm()
	if b.cutTerm.Load() == term {
		return r.State() == raft.Leader
	}
	if old := b.barrierTerm.Load(); old != term && b.barrierTerm.CompareAndSwap(old, term) {
		go func() {
			if r.Barrier(b.n.cfg.ApplyTimeout).Error() == nil && r.CurrentTerm() == term {
				b.cutTerm.Store(term)
				return
			}
			b.barrierTerm.CompareAndSwap(term, 0) // a later batch tries again
		}()
	}
	return false
}

// inFlightFrees is what a worker's batches submitted and not yet answered
// may remove (raftfsm.Frees).
type inFlightFrees struct {
	blocks uint64
	clears int // batches that clear the worker
}

// freed bounds the blocks the batches of worker submitted and not yet
// answered may remove, for raftfsm.FSM.CutOverQuota; false if this node may
// not cut now (canCut).
func (b *publishBatcher) freed(worker string) (uint64, bool) {
	if !b.canCut() {
		return 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.freeing[worker]
	if f.clears > 0 {
		return math.MaxUint64, true
	}
	return f.blocks, true
}

// addFreeing counts a batch submitted in freeing (b.mu held).
func (b *publishBatcher) addFreeing(batch *kvdirv1.EventBatch) {
	blocks, clears := raftfsm.Frees(batch)
	if blocks == 0 && !clears {
		return
	}
	f := b.freeing[batch.WorkerId]
	f.blocks += blocks
	if clears {
		f.clears++
	}
	b.freeing[batch.WorkerId] = f
}

// doneFreeing takes a group's batches, answered (applied or failed), out of
// freeing.
func (b *publishBatcher) doneFreeing(group []*pubRequest) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range group {
		blocks, clears := raftfsm.Frees(r.batch)
		if blocks == 0 && !clears {
			continue
		}
		id := r.batch.WorkerId
		f := b.freeing[id]
		f.blocks -= min(blocks, f.blocks)
		if clears {
			f.clears--
		}
		if f.blocks == 0 && f.clears <= 0 {
			delete(b.freeing, id)
		} else {
			b.freeing[id] = f
		}
	}
}

// publishNotLeader explains a proposal refused because this node no
// longer leads.
func publishNotLeader(err error) error {
	if errors.Is(err, errNotLeader) {
		return status.Error(codes.Unavailable, "leadership moved; reconnect and resend unacknowledged batches")
	}
	return err
}

// answer answers every request of group with r.
func (b *publishBatcher) answer(group []*pubRequest, r pubResult) {
	b.doneFreeing(group)
	for _, q := range group {
		q.done <- r
	}
}

// drain fails whatever is still queued at shutdown.
func (b *publishBatcher) drain() {
	for {
		select {
		case r := <-b.queue:
			b.answer([]*pubRequest{r}, pubResult{err: errShuttingDown})
		default:
			return
		}
	}
}
