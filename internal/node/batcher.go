package node

import (
	"errors"

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
}

func newPublishBatcher(n *Node) *publishBatcher {
	return &publishBatcher{
		n:     n,
		queue: make(chan *pubRequest, 4*maxGroupBatches),
		slots: make(chan struct{}, maxGroupsInFlight),
	}
}

// submit queues a batch; its result arrives on the returned channel. It
// fails at once with errShuttingDown when the node stops.
func (b *publishBatcher) submit(batch *kvdirv1.EventBatch) <-chan pubResult {
	r := &pubRequest{batch: batch, done: make(chan pubResult, 1)}
	select {
	case b.queue <- r:
	case <-b.n.stop:
		r.done <- pubResult{err: errShuttingDown}
	}
	return r.done
}

// run groups queued batches and proposes them, at most maxGroupsInFlight
// groups at a time; while those commit, the queue fills and the next group
// is larger.
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
			first.done <- pubResult{err: errShuttingDown}
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
			default:
				break fill
			}
		}
		b.propose(group)
	}
}

// propose proposes one group and answers its requests once it is applied.
func (b *publishBatcher) propose(group []*pubRequest) {
	n := b.n
	cmd := &kvdirv1.PublishCommand{Batches: make([]*kvdirv1.EventBatch, len(group))}
	for i, r := range group {
		cmd.Batches[i] = r.batch
	}
	p, err := n.start(kvdirv1.CommandType_COMMAND_TYPE_PUBLISH, cmd)
	if err != nil {
		<-b.slots
		answerAll(group, pubResult{err: publishNotLeader(err)})
		return
	}
	n.metrics.groupSize.Observe(float64(len(group)))
	go func() {
		res, _, err := n.wait(p)
		<-b.slots
		if err != nil {
			answerAll(group, pubResult{err: err})
			return
		}
		for i, resp := range res.(*raftfsm.PublishResult).Responses {
			group[i].done <- pubResult{resp: resp}
		}
	}()
}

// publishNotLeader explains a proposal refused because this node no
// longer leads.
func publishNotLeader(err error) error {
	if errors.Is(err, errNotLeader) {
		return status.Error(codes.Unavailable, "leadership moved; reconnect and resend unacknowledged batches")
	}
	return err
}

func answerAll(group []*pubRequest, r pubResult) {
	for _, q := range group {
		q.done <- r
	}
}

// drain fails whatever is still queued at shutdown.
func (b *publishBatcher) drain() {
	for {
		select {
		case r := <-b.queue:
			r.done <- pubResult{err: errShuttingDown}
		default:
			return
		}
	}
}
