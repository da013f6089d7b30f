package node

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

type agentService struct {
	kvdirv1.UnimplementedAgentServiceServer
	n *Node
}

func (s *agentService) Register(ctx context.Context, req *kvdirv1.RegisterRequest) (*kvdirv1.RegisterResponse, error) {
	n := s.n
	if err := n.checkSpec(req.Worker); err != nil {
		return nil, err
	}
	if err := n.checkServedModel(req.Worker); err != nil {
		return nil, err
	}
	if !n.IsLeader() { // the leader stamps the registration
		c, err := n.fwd.leader(ctx)
		if err != nil {
			return nil, err
		}
		return c.agent.Register(c.outgoing(ctx), req)
	}
	cmd := &kvdirv1.RegisterCommand{Worker: req.Worker}
	token, err := n.stampRegister(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return proposeOrForward(ctx, n, kvdirv1.CommandType_COMMAND_TYPE_REGISTER, cmd,
		func(res any, index uint64) (*kvdirv1.RegisterResponse, error) {
			epoch := res.(*raftfsm.RegisterResult).Epoch
			n.leases.renew(req.Worker.Id, epoch, nil, n.now())
			return &kvdirv1.RegisterResponse{
				Epoch: epoch, NextSeq: 1, RaftIndex: index, WorkerToken: token,
			}, nil
		},
		func(ctx context.Context, c *leaderClient) (*kvdirv1.RegisterResponse, error) {
			return c.agent.Register(ctx, req)
		})
}

func (s *agentService) Heartbeat(ctx context.Context, req *kvdirv1.HeartbeatRequest) (*kvdirv1.HeartbeatResponse, error) {
	n := s.n
	if !n.IsLeader() {
		c, err := n.fwd.leader(ctx)
		if err != nil {
			return nil, err
		}
		return c.agent.Heartbeat(c.outgoing(ctx), req)
	}
	resp := &kvdirv1.HeartbeatResponse{Lease: durationpb.New(n.cfg.Lease)}
	if err := n.checkWorker(ctx, req.WorkerId); errors.Is(err, errWorkerGone) {
		return resp, nil // known = false: the agent must register again
	} else if err != nil {
		return nil, err
	}
	w, ok := n.fsm.Worker(req.WorkerId)
	if ok {
		resp.CurrentEpoch, resp.State = w.Epoch, w.State
	}
	if !ok || w.Epoch != req.Epoch || (w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE &&
		w.State != kvdirv1.WorkerState_WORKER_STATE_DRAINING) {
		return resp, nil // known = false: the agent must register again
	}
	if sanitizeLoad(req.Load) {
		n.metrics.loadsClamped.Inc()
	}
	resp.Known = true
	n.leases.renew(req.WorkerId, req.Epoch, req.Load, n.now())
	return resp, nil
}

func (s *agentService) Deregister(ctx context.Context, req *kvdirv1.DeregisterRequest) (*kvdirv1.DeregisterResponse, error) {
	n := s.n
	if !n.IsLeader() { // the leader checks the worker token
		c, err := n.fwd.leader(ctx)
		if err != nil {
			return nil, err
		}
		return c.agent.Deregister(c.outgoing(ctx), req)
	}
	if err := n.checkWorker(ctx, req.WorkerId); errors.Is(err, errWorkerGone) {
		return nil, status.Errorf(codes.NotFound, "deregister %q: %v", req.WorkerId, err)
	} else if err != nil {
		return nil, err
	}
	return proposeOrForward(ctx, n, kvdirv1.CommandType_COMMAND_TYPE_DEREGISTER,
		&kvdirv1.DeregisterCommand{WorkerId: req.WorkerId, Epoch: req.Epoch},
		func(_ any, index uint64) (*kvdirv1.DeregisterResponse, error) {
			return &kvdirv1.DeregisterResponse{RaftIndex: index}, nil
		},
		func(ctx context.Context, c *leaderClient) (*kvdirv1.DeregisterResponse, error) {
			return c.agent.Deregister(ctx, req)
		})
}

// maxInFlight bounds the batches of one Publish stream that are proposed
// and not yet answered.
const maxInFlight = 64

// Publish answers each batch once it is applied, in order. On the leader the
// batches of a stream are queued without waiting for the previous ones to
// commit, and batches of all streams are committed in groups (batcher.go). A
// follower pipes the stream to the leader.
func (s *agentService) Publish(stream kvdirv1.AgentService_PublishServer) error {
	n := s.n
	ctx := stream.Context()
	if !n.IsLeader() {
		return s.forwardPublish(stream)
	}
	// A receiver queues each batch for the leader's group commit as it
	// arrives; this goroutine waits for the results in order and answers.
	// If answering fails, returning ends the stream, which ends the
	// receiver too. Batches queued but not answered may still apply; the
	// agent re-sends them and gets DUPLICATE.
	inflight := make(chan (<-chan pubResult), maxInFlight)
	recvErr := make(chan error, 1)
	go func() {
		defer close(inflight)
		recvErr <- func() error {
			for {
				req, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				b := req.Batch
				if b == nil {
					return status.Error(codes.InvalidArgument, "publish: request without a batch")
				}
				done := n.refuseBatch(b)
				if done == nil {
					switch err := n.checkWorker(ctx, b.WorkerId); {
					case errors.Is(err, errWorkerGone):
						done = answerNow(b, kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER, "worker is not registered; register it again")
					case err != nil:
						return err
					default:
						done = n.pub.submit(b)
					}
				}
				select {
				case inflight <- done:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}()
	}()
	for {
		var done <-chan pubResult
		select {
		case done = <-inflight:
		case <-n.stop:
			return errShuttingDown
		}
		if done == nil { // inflight closed: the agent is done, or failed
			return <-recvErr
		}
		var r pubResult
		select {
		case r = <-done:
		case <-n.stop:
			return errShuttingDown
		}
		if r.err != nil {
			return r.err
		}
		n.metrics.publish(r.resp)
		if err := stream.Send(r.resp); err != nil {
			return err
		}
	}
}

// refuseBatch answers at once, without proposing it, a batch the state
// machine would refuse whatever its state (raftfsm.FSM.CheckBatch: its
// sequence range, size or contents), so that such batches do not fill the
// log: nil if the batch is fine.
func (n *Node) refuseBatch(b *kvdirv1.EventBatch) <-chan pubResult {
	if err := n.fsm.CheckBatch(b); err != nil {
		return answerNow(b, kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED, err.Error())
	}
	return nil
}

// answerNow is a batch's answer that needs no proposal.
func answerNow(b *kvdirv1.EventBatch, st kvdirv1.PublishStatus, msg string) <-chan pubResult {
	done := make(chan pubResult, 1)
	done <- pubResult{resp: &kvdirv1.PublishResponse{
		WorkerId: b.WorkerId, Epoch: b.Epoch, FirstSeq: b.FirstSeq, LastSeq: b.LastSeq,
		Status: st, Message: msg,
	}}
	return done
}

// errShuttingDown ends streams when the node stops, so that agents move to
// another node at once.
var errShuttingDown = status.Error(codes.Unavailable, "node is shutting down; reconnect to another node and resend unacknowledged batches")

// forwardPublish pipes a Publish stream to the leader. It ends when the
// leader's side ends, so an agent whose leader went away learns it at once
// instead of waiting on a response that will not come.
func (s *agentService) forwardPublish(stream kvdirv1.AgentService_PublishServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	c, err := s.n.fwd.leader(ctx)
	if err != nil {
		return err
	}
	go func() { // the node stopping ends the stream
		select {
		case <-s.n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	up, err := c.agent.Publish(c.outgoing(ctx))
	if err != nil {
		return err
	}
	go func() { // agent -> leader; ends with the stream's context at the latest
		for {
			req, err := stream.Recv()
			if err != nil {
				up.CloseSend()
				return
			}
			if err := up.Send(req); err != nil {
				return // up.Recv below reports why
			}
		}
	}()
	for { // leader -> agent
		resp, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		select {
		case <-s.n.stop:
			return errShuttingDown
		default:
		}
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
