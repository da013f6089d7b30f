package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// errNotLeader is returned by propose on a follower; handlers then forward.
var errNotLeader = errors.New("not the leader")

// pending is a proposed command waiting to be committed and applied.
type pending struct {
	f     raft.ApplyFuture
	typ   kvdirv1.CommandType
	start time.Time
}

// start proposes a command on the leader without waiting for it.
func (n *Node) start(t kvdirv1.CommandType, payload proto.Message) (*pending, error) {
	if n.raft.State() != raft.Leader {
		return nil, errNotLeader
	}
	data, err := raftfsm.Encode(t, payload, n.now().UnixNano())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode command: %v", err)
	}
	return &pending{f: n.raft.Apply(data, n.cfg.ApplyTimeout), typ: t, start: time.Now()}, nil
}

// wait waits for a proposed command and returns the state machine's result
// and the entry's log index. A domain refusal comes back as a gRPC status.
func (n *Node) wait(p *pending) (any, uint64, error) {
	if err := p.f.Error(); err != nil {
		return nil, 0, n.proposeError(err)
	}
	n.metrics.commitLatency.WithLabelValues(commandLabel(p.typ)).Observe(time.Since(p.start).Seconds())
	resp := p.f.Response()
	if err, ok := resp.(error); ok {
		return nil, p.f.Index(), refusalStatus(err)
	}
	return resp, p.f.Index(), nil
}

// propose proposes a command and waits for its result.
func (n *Node) propose(t kvdirv1.CommandType, payload proto.Message) (any, uint64, error) {
	p, err := n.start(t, payload)
	if err != nil {
		return nil, 0, err
	}
	return n.wait(p)
}

// proposeError maps a Raft failure to a gRPC status, and remembers failures
// that are not about leadership (a failing disk, say) for status and
// readiness.
func (n *Node) proposeError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return status.Errorf(codes.Unavailable, "leadership changed while the write was in flight: %v; retry", err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return status.Error(codes.Unavailable, "node is shutting down; retry on another node")
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return status.Errorf(codes.Unavailable, "write not committed in time: %v; retry", err)
	}
	n.writeErr.set(err)
	n.log.Error("write failed", "err", err)
	return status.Errorf(codes.Unavailable, "write failed on the leader: %v", err)
}

// refusalStatus maps a state machine refusal to a gRPC status.
func refusalStatus(err error) error {
	switch {
	case errors.Is(err, raftfsm.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, raftfsm.ErrUnknownWorker):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, raftfsm.ErrStaleEpoch):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, raftfsm.ErrTooMany):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, raftfsm.ErrNotOwner):
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// proposeOrForward proposes on the leader, or runs forward against the
// leader's API when this node follows.
func proposeOrForward[T any](ctx context.Context, n *Node, t kvdirv1.CommandType, payload proto.Message,
	onLeader func(res any, index uint64) (T, error),
	forward func(ctx context.Context, c *leaderClient) (T, error),
) (T, error) {
	var zero T
	res, index, err := n.propose(t, payload)
	switch {
	case errors.Is(err, errNotLeader):
		c, err := n.fwd.leader(ctx)
		if err != nil {
			return zero, err
		}
		return forward(c.outgoing(ctx), c)
	case err != nil:
		return zero, err
	}
	return onLeader(res, index)
}

func commandLabel(t kvdirv1.CommandType) string {
	const prefix = len("COMMAND_TYPE_")
	if s, ok := kvdirv1.CommandType_name[int32(t)]; ok && len(s) > prefix {
		return s[prefix:]
	}
	return fmt.Sprint(int32(t))
}
