package node

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

type adminService struct {
	kvdirv1.UnimplementedAdminServiceServer
	n *Node
}

func (s *adminService) Status(context.Context, *kvdirv1.StatusRequest) (*kvdirv1.StatusResponse, error) {
	n := s.n
	r := n.raft
	stats := r.Stats()
	_, leaderID := r.LeaderWithID()
	apis := n.fsm.Members()
	c := n.fsm.Counters()
	resp := &kvdirv1.StatusResponse{
		NodeId:       n.cfg.ID,
		State:        r.State().String(),
		LeaderId:     string(leaderID),
		Term:         parseUint(stats["term"]),
		CommitIndex:  r.CommitIndex(),
		AppliedIndex: n.fsm.AppliedIndex(),
		LastLogIndex: r.LastIndex(),
		Counters: &kvdirv1.IndexCounters{
			Workers: uint64(c.Workers), Blocks: uint64(c.Blocks), Entries: uint64(c.Entries),
			StoredBlocks: uint64(c.StoredBlocks), OrphanBlocks: uint64(c.OrphanBlocks),
			ApproxBytes: uint64(c.ApproxBytes), Sessions: uint64(c.Sessions),
		},
		Digest:            n.fsm.IndexDigest(),
		LastSnapshotIndex: parseUint(stats["last_snapshot_index"]),
	}
	if leaderID != "" {
		resp.LeaderAddress = apis[string(leaderID)]
	}
	if !n.IsLeader() {
		if last := r.LastContact(); !last.IsZero() {
			resp.Staleness = durationpb.New(time.Since(last))
		}
	}
	if err := n.writeErr.get(); err != nil {
		resp.WriteError = err.Error()
	}
	resp.Routers = n.share.statuses()
	resp.Intents = uint64(n.share.intents.len())
	resp.ServedModels = n.servedModels()
	if f := r.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			resp.Members = append(resp.Members, &kvdirv1.Member{
				Id: string(srv.ID), RaftAddress: string(srv.Address), ApiAddress: apis[string(srv.ID)],
				Voter: srv.Suffrage == raft.Voter, Leader: srv.ID == leaderID,
			})
		}
	}
	return resp, nil
}

// onLeader runs f on the leader, forwarding the call when this node follows.
func onLeader[T any](ctx context.Context, n *Node, local func() (T, error), forward func(context.Context, *leaderClient) (T, error)) (T, error) {
	if n.IsLeader() {
		return local()
	}
	c, err := n.fwd.leader(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	return forward(c.outgoing(ctx), c)
}

func (s *adminService) AddMember(ctx context.Context, req *kvdirv1.AddMemberRequest) (*kvdirv1.AddMemberResponse, error) {
	n := s.n
	if req.Id == "" || req.RaftAddress == "" {
		return nil, status.Error(codes.InvalidArgument, "add member: id and raft_address are required")
	}
	return onLeader(ctx, n, func() (*kvdirv1.AddMemberResponse, error) {
		resp := &kvdirv1.AddMemberResponse{}
		f := n.raft.GetConfiguration()
		if err := f.Error(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "add member: %v", err)
		}
		present := false
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == req.Id && string(srv.Address) == req.RaftAddress {
				present = true
			}
		}
		if !present {
			var fut raft.IndexFuture
			if req.NonVoter {
				fut = n.raft.AddNonvoter(raft.ServerID(req.Id), raft.ServerAddress(req.RaftAddress), 0, n.cfg.ApplyTimeout)
			} else {
				fut = n.raft.AddVoter(raft.ServerID(req.Id), raft.ServerAddress(req.RaftAddress), 0, n.cfg.ApplyTimeout)
			}
			if err := fut.Error(); err != nil {
				return nil, n.proposeError(err)
			}
			resp.RaftIndex = fut.Index()
			n.log.Info("member added", "id", req.Id, "raft", req.RaftAddress, "voter", !req.NonVoter)
		}
		if req.ApiAddress != "" && n.fsm.MemberAPI(req.Id) != req.ApiAddress {
			_, idx, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_MEMBER_API,
				&kvdirv1.MemberAPICommand{Id: req.Id, ApiAddress: req.ApiAddress})
			if err != nil {
				return nil, err
			}
			resp.RaftIndex = idx
		}
		return resp, nil
	}, func(ctx context.Context, c *leaderClient) (*kvdirv1.AddMemberResponse, error) {
		return c.admin.AddMember(ctx, req)
	})
}

func (s *adminService) RemoveMember(ctx context.Context, req *kvdirv1.RemoveMemberRequest) (*kvdirv1.RemoveMemberResponse, error) {
	n := s.n
	if req.Id == "" {
		return nil, status.Error(codes.InvalidArgument, "remove member: id is required")
	}
	return onLeader(ctx, n, func() (*kvdirv1.RemoveMemberResponse, error) {
		fut := n.raft.RemoveServer(raft.ServerID(req.Id), 0, n.cfg.ApplyTimeout)
		if err := fut.Error(); err != nil {
			return nil, n.proposeError(err)
		}
		n.log.Info("member removed", "id", req.Id)
		return &kvdirv1.RemoveMemberResponse{RaftIndex: fut.Index()}, nil
	}, func(ctx context.Context, c *leaderClient) (*kvdirv1.RemoveMemberResponse, error) {
		return c.admin.RemoveMember(ctx, req)
	})
}

func (s *adminService) TransferLeadership(ctx context.Context, req *kvdirv1.TransferLeadershipRequest) (*kvdirv1.TransferLeadershipResponse, error) {
	n := s.n
	return onLeader(ctx, n, func() (*kvdirv1.TransferLeadershipResponse, error) {
		var fut raft.Future
		if req.Id == "" {
			fut = n.raft.LeadershipTransfer()
		} else {
			var addr raft.ServerAddress
			for _, srv := range n.raft.GetConfiguration().Configuration().Servers {
				if string(srv.ID) == req.Id {
					addr = srv.Address
				}
			}
			if addr == "" {
				return nil, status.Errorf(codes.NotFound, "transfer leadership: %q is not a member", req.Id)
			}
			fut = n.raft.LeadershipTransferToServer(raft.ServerID(req.Id), addr)
		}
		if err := fut.Error(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "transfer leadership: %v", err)
		}
		_, id := n.raft.LeaderWithID()
		return &kvdirv1.TransferLeadershipResponse{LeaderId: string(id)}, nil
	}, func(ctx context.Context, c *leaderClient) (*kvdirv1.TransferLeadershipResponse, error) {
		return c.admin.TransferLeadership(ctx, req)
	})
}

func (s *adminService) Snapshot(context.Context, *kvdirv1.SnapshotRequest) (*kvdirv1.SnapshotResponse, error) {
	fut := s.n.raft.Snapshot()
	if err := fut.Error(); err != nil {
		if errors.Is(err, raft.ErrNothingNewToSnapshot) {
			return nil, status.Error(codes.FailedPrecondition, "snapshot: nothing new since the last snapshot")
		}
		return nil, status.Errorf(codes.Internal, "snapshot: %v", err)
	}
	meta, _, err := fut.Open()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "snapshot: %v", err)
	}
	return &kvdirv1.SnapshotResponse{Index: meta.Index, Term: meta.Term}, nil
}

func (s *adminService) DrainWorker(ctx context.Context, req *kvdirv1.DrainWorkerRequest) (*kvdirv1.DrainWorkerResponse, error) {
	return proposeOrForward(ctx, s.n, kvdirv1.CommandType_COMMAND_TYPE_DRAIN, &kvdirv1.DrainCommand{WorkerId: req.WorkerId},
		func(_ any, index uint64) (*kvdirv1.DrainWorkerResponse, error) {
			return &kvdirv1.DrainWorkerResponse{RaftIndex: index}, nil
		},
		func(ctx context.Context, c *leaderClient) (*kvdirv1.DrainWorkerResponse, error) {
			return c.admin.DrainWorker(ctx, req)
		})
}

func (s *adminService) ExpireWorker(ctx context.Context, req *kvdirv1.ExpireWorkerRequest) (*kvdirv1.ExpireWorkerResponse, error) {
	n := s.n
	w, ok := n.fsm.Worker(req.WorkerId)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "expire: worker %q is not known", req.WorkerId)
	}
	return proposeOrForward(ctx, n, kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_WORKER,
		&kvdirv1.ExpireWorkerCommand{WorkerId: req.WorkerId, Epoch: w.Epoch, Reason: "expired by an operator"},
		func(_ any, index uint64) (*kvdirv1.ExpireWorkerResponse, error) {
			return &kvdirv1.ExpireWorkerResponse{RaftIndex: index}, nil
		},
		func(ctx context.Context, c *leaderClient) (*kvdirv1.ExpireWorkerResponse, error) {
			return c.admin.ExpireWorker(ctx, req)
		})
}

func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64) // raft's stats are decimal; 0 if absent
	return v
}
