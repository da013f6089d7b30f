package node

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

type directoryService struct {
	kvdirv1.UnimplementedDirectoryServiceServer
	n *Node
}

// readInfo describes the state a read was served from.
func (n *Node) readInfo(applied uint64) *kvdirv1.ReadInfo {
	ri := &kvdirv1.ReadInfo{NodeId: n.cfg.ID, AppliedIndex: applied, FromLeader: n.IsLeader()}
	if !ri.FromLeader {
		if last := n.raft.LastContact(); !last.IsZero() {
			ri.Staleness = durationpb.New(time.Since(last))
		}
	}
	return ri
}

// consistentRead makes the local state at least as new as every write
// acknowledged before the call: it must run on the leader, which confirms
// its leadership and waits until it has applied its commit index.
func (n *Node) consistentRead(ctx context.Context) error {
	if !n.IsLeader() {
		return errNotLeader
	}
	commit := n.raft.CommitIndex()
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return status.Errorf(codes.Unavailable, "consistent read: %v; retry", err)
	}
	for n.fsm.AppliedIndex() < commit {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
	return nil
}

func (s *directoryService) Match(ctx context.Context, req *kvdirv1.MatchRequest) (*kvdirv1.MatchResponse, error) {
	n := s.n
	start := time.Now()
	if req.Consistent {
		err := n.consistentRead(ctx)
		if err == errNotLeader {
			c, err := n.fwd.leader(ctx)
			if err != nil {
				return nil, err
			}
			return c.dir.Match(c.outgoing(ctx), req)
		}
		if err != nil {
			return nil, err
		}
	}
	var chain []uint64
	var blockSize uint32
	switch q := req.Query.(type) {
	case *kvdirv1.MatchRequest_Chain:
		chain, blockSize = q.Chain.Hashes, q.Chain.BlockSize
	case *kvdirv1.MatchRequest_Tokens:
		ns := q.Tokens.Namespace
		if ns == nil {
			return nil, status.Error(codes.InvalidArgument, "match: tokens need a namespace (model, block size)")
		}
		h, err := blockhash.New(blockhash.Namespace{
			Model: ns.Model, LoRA: ns.Lora, CacheSalt: ns.CacheSalt, BlockSize: int(ns.BlockSize),
		})
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "match: %v", err)
		}
		chain, blockSize = h.Chain(nil, q.Tokens.TokenIds, nil), ns.BlockSize
	default:
		return nil, status.Error(codes.InvalidArgument, "match: set chain or tokens")
	}
	ms, applied, err := n.fsm.Match(nil, chain)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "match: %v", err)
	}
	resp := &kvdirv1.MatchResponse{ChainBlocks: uint32(len(chain)), Read: n.readInfo(applied)}
	best := 0
	for _, m := range ms {
		resp.Matches = append(resp.Matches, raftfsm.WorkerMatchProto(m, blockSize))
		best = max(best, m.Blocks)
	}
	n.metrics.matchLatency.Observe(time.Since(start).Seconds())
	n.metrics.matchDepth.Observe(float64(best))
	return resp, nil
}

func (s *directoryService) ListWorkers(_ context.Context, req *kvdirv1.ListWorkersRequest) (*kvdirv1.ListWorkersResponse, error) {
	applied := s.n.fsm.AppliedIndex()
	return &kvdirv1.ListWorkersResponse{
		Workers: s.n.fsm.Workers(req.Model, req.IncludeGone), Read: s.n.readInfo(applied),
		ServedModels: s.n.servedModels(),
	}, nil
}

func (s *directoryService) GetWorker(_ context.Context, req *kvdirv1.GetWorkerRequest) (*kvdirv1.GetWorkerResponse, error) {
	applied := s.n.fsm.AppliedIndex()
	w, ok := s.n.fsm.Worker(req.WorkerId)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "worker %q is not known to the directory", req.WorkerId)
	}
	resp := &kvdirv1.GetWorkerResponse{Worker: w, Read: s.n.readInfo(applied)}
	if req.TopChains > 0 {
		for _, c := range s.n.fsm.WorkerChains(req.WorkerId, int(min(req.TopChains, 1000))) {
			resp.Chains = append(resp.Chains, &kvdirv1.HeldChain{Tail: c.Tail, Blocks: uint32(c.Depth)})
		}
	}
	return resp, nil
}

// maxSessionsPerCall bounds RecordSessions batches.
const maxSessionsPerCall = 10_000

func (s *directoryService) RecordSessions(ctx context.Context, req *kvdirv1.RecordSessionsRequest) (*kvdirv1.RecordSessionsResponse, error) {
	if len(req.Sessions) > maxSessionsPerCall {
		return nil, status.Errorf(codes.InvalidArgument, "record sessions: %d sessions, limit %d per call", len(req.Sessions), maxSessionsPerCall)
	}
	if len(req.Sessions) == 0 {
		return &kvdirv1.RecordSessionsResponse{}, nil
	}
	return proposeOrForward(ctx, s.n, kvdirv1.CommandType_COMMAND_TYPE_RECORD_SESSIONS,
		&kvdirv1.RecordSessionsCommand{Sessions: req.Sessions},
		func(_ any, index uint64) (*kvdirv1.RecordSessionsResponse, error) {
			return &kvdirv1.RecordSessionsResponse{RaftIndex: index}, nil
		},
		func(ctx context.Context, c *leaderClient) (*kvdirv1.RecordSessionsResponse, error) {
			return c.dir.RecordSessions(ctx, req)
		})
}

func listLimit(l uint32) int {
	if l == 0 {
		return 100
	}
	return int(min(l, 10_000))
}

func (s *directoryService) WhoHolds(_ context.Context, req *kvdirv1.WhoHoldsRequest) (*kvdirv1.WhoHoldsResponse, error) {
	n := s.n
	applied := n.fsm.AppliedIndex()
	var recs []*kvdirv1.SessionRecord
	switch t := req.Target.(type) {
	case *kvdirv1.WhoHoldsRequest_SessionId:
		r, ok := n.fsm.Session(t.SessionId)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "session %q is not recorded (never routed, or expired)", t.SessionId)
		}
		recs = append(recs, r)
	case *kvdirv1.WhoHoldsRequest_SessionPrefix:
		recs, _ = n.fsm.Sessions(t.SessionPrefix, "", listLimit(req.Limit))
	default:
		return nil, status.Error(codes.InvalidArgument, "who-holds: set session_id or session_prefix")
	}
	resp := &kvdirv1.WhoHoldsResponse{Read: n.readInfo(applied)}
	for _, r := range recs {
		sh := &kvdirv1.SessionHolders{Session: r}
		if chain, ok := n.fsm.SessionChain(r); ok {
			ms, _, _ := n.fsm.Match(nil, chain)
			for _, m := range ms {
				sh.Holders = append(sh.Holders, raftfsm.WorkerMatchProto(m, r.BlockSize))
			}
		}
		resp.Sessions = append(resp.Sessions, sh)
	}
	return resp, nil
}

func (s *directoryService) ListSessions(_ context.Context, req *kvdirv1.ListSessionsRequest) (*kvdirv1.ListSessionsResponse, error) {
	applied := s.n.fsm.AppliedIndex()
	recs, total := s.n.fsm.Sessions(req.SessionPrefix, req.WorkerId, listLimit(req.Limit))
	return &kvdirv1.ListSessionsResponse{Sessions: recs, Total: uint64(total), Read: s.n.readInfo(applied)}, nil
}

func (s *directoryService) WatchWorkers(req *kvdirv1.WatchWorkersRequest, stream kvdirv1.DirectoryService_WatchWorkersServer) error {
	n := s.n
	w := n.watch.subscribe()
	defer n.watch.unsubscribe(w)
	snapshot := func() error {
		applied := n.fsm.AppliedIndex()
		return stream.Send(&kvdirv1.WatchWorkersResponse{
			Workers: n.fsm.Workers(req.Model, true), Snapshot: true, AppliedIndex: applied,
			ServedModels: n.servedModels(),
		})
	}
	if err := snapshot(); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case ids, ok := <-w.ch:
			if !ok {
				return status.Error(codes.Unavailable, "node is shutting down; watch another node")
			}
			if ids == nil {
				if err := snapshot(); err != nil {
					return err
				}
				continue
			}
			applied := n.fsm.AppliedIndex()
			var changed []*kvdirv1.Worker
			for _, wk := range n.fsm.WorkersByID(ids) {
				if req.Model == "" || wk.Spec.Model == req.Model {
					changed = append(changed, wk)
				}
			}
			if len(changed) == 0 {
				continue
			}
			if err := stream.Send(&kvdirv1.WatchWorkersResponse{Workers: changed, AppliedIndex: applied}); err != nil {
				return err
			}
		}
	}
}
