package dirclient

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Register records a worker and returns its new epoch and, when the
// directory enforces roles, its worker token, which the client keeps and
// sends on the worker's later Heartbeat, Deregister and Publish calls.
// Registering again fences the previous epoch.
func (c *Client) Register(ctx context.Context, spec *kvdirv1.WorkerSpec) (*kvdirv1.RegisterResponse, error) {
	req := &kvdirv1.RegisterRequest{Worker: spec}
	resp, err := call(c, ctx, "register", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.RegisterResponse, error) {
			return kvdirv1.NewAgentServiceClient(cc).Register(ctx, req, opts...)
		})
	if err != nil {
		return nil, err
	}
	if resp.WorkerToken != "" && spec != nil {
		c.SetWorkerToken(spec.Id, resp.WorkerToken)
	}
	return resp, nil
}

// Heartbeat renews a worker's lease and reports its load. Known false in
// the response means the worker must register again.
func (c *Client) Heartbeat(ctx context.Context, workerID string, epoch uint64, load *kvdirv1.Load) (*kvdirv1.HeartbeatResponse, error) {
	req := &kvdirv1.HeartbeatRequest{WorkerId: workerID, Epoch: epoch, Load: load}
	return call(c, ctx, "heartbeat", true, c.workerMD(workerID),
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.HeartbeatResponse, error) {
			return kvdirv1.NewAgentServiceClient(cc).Heartbeat(ctx, req, opts...)
		})
}

// Deregister removes a worker and its blocks.
func (c *Client) Deregister(ctx context.Context, workerID string, epoch uint64) (*kvdirv1.DeregisterResponse, error) {
	req := &kvdirv1.DeregisterRequest{WorkerId: workerID, Epoch: epoch}
	return call(c, ctx, "deregister", true, c.workerMD(workerID),
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.DeregisterResponse, error) {
			return kvdirv1.NewAgentServiceClient(cc).Deregister(ctx, req, opts...)
		})
}

// Match returns, per worker, how many leading blocks of the request's chain
// it holds. A consistent request is sent to the leader first.
func (c *Client) Match(ctx context.Context, req *kvdirv1.MatchRequest) (*kvdirv1.MatchResponse, error) {
	return call(c, ctx, "match", req.GetConsistent(), nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.MatchResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).Match(ctx, req, opts...)
		})
}

// MatchChain matches a chain of block hashes, first block first; blockSize
// (optional) lets the answer count tokens.
func (c *Client) MatchChain(ctx context.Context, hashes []uint64, blockSize uint32, consistent bool) (*kvdirv1.MatchResponse, error) {
	return c.Match(ctx, &kvdirv1.MatchRequest{
		Query:      &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: hashes, BlockSize: blockSize}},
		Consistent: consistent,
	})
}

// MatchTokens matches token ids, which the directory hashes under ns.
func (c *Client) MatchTokens(ctx context.Context, tokenIDs []uint32, ns *kvdirv1.Namespace, consistent bool) (*kvdirv1.MatchResponse, error) {
	return c.Match(ctx, &kvdirv1.MatchRequest{
		Query:      &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{TokenIds: tokenIDs, Namespace: ns}},
		Consistent: consistent,
	})
}

// ListWorkers lists the workers of a model (all models if empty).
func (c *Client) ListWorkers(ctx context.Context, model string, includeGone bool) (*kvdirv1.ListWorkersResponse, error) {
	req := &kvdirv1.ListWorkersRequest{Model: model, IncludeGone: includeGone}
	return call(c, ctx, "list workers", false, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.ListWorkersResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).ListWorkers(ctx, req, opts...)
		})
}

// GetWorker returns one worker and, if topChains > 0, its longest chains.
func (c *Client) GetWorker(ctx context.Context, workerID string, topChains uint32) (*kvdirv1.GetWorkerResponse, error) {
	req := &kvdirv1.GetWorkerRequest{WorkerId: workerID, TopChains: topChains}
	return call(c, ctx, "get worker", false, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.GetWorkerResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).GetWorker(ctx, req, opts...)
		})
}

// RecordSessions records where sessions' latest turns went.
func (c *Client) RecordSessions(ctx context.Context, sessions []*kvdirv1.SessionRecord) (*kvdirv1.RecordSessionsResponse, error) {
	req := &kvdirv1.RecordSessionsRequest{Sessions: sessions}
	return call(c, ctx, "record sessions", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.RecordSessionsResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).RecordSessions(ctx, req, opts...)
		})
}

// WhoHolds returns which workers hold how much of a session's chain.
func (c *Client) WhoHolds(ctx context.Context, sessionID string) (*kvdirv1.WhoHoldsResponse, error) {
	return c.whoHolds(ctx, &kvdirv1.WhoHoldsRequest{Target: &kvdirv1.WhoHoldsRequest_SessionId{SessionId: sessionID}})
}

// WhoHoldsPrefix is WhoHolds for at most limit sessions whose id starts
// with prefix (limit 0: the directory's default, 100).
func (c *Client) WhoHoldsPrefix(ctx context.Context, prefix string, limit uint32) (*kvdirv1.WhoHoldsResponse, error) {
	return c.whoHolds(ctx, &kvdirv1.WhoHoldsRequest{
		Target: &kvdirv1.WhoHoldsRequest_SessionPrefix{SessionPrefix: prefix}, Limit: limit,
	})
}

func (c *Client) whoHolds(ctx context.Context, req *kvdirv1.WhoHoldsRequest) (*kvdirv1.WhoHoldsResponse, error) {
	return call(c, ctx, "who holds", false, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.WhoHoldsResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).WhoHolds(ctx, req, opts...)
		})
}

// ListSessions lists recorded sessions, most recent first, optionally
// filtered by id prefix and worker (limit 0: the directory's default, 100).
func (c *Client) ListSessions(ctx context.Context, prefix, workerID string, limit uint32) (*kvdirv1.ListSessionsResponse, error) {
	req := &kvdirv1.ListSessionsRequest{SessionPrefix: prefix, WorkerId: workerID, Limit: limit}
	return call(c, ctx, "list sessions", false, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.ListSessionsResponse, error) {
			return kvdirv1.NewDirectoryServiceClient(cc).ListSessions(ctx, req, opts...)
		})
}

// Status returns the cluster status as seen by whichever node answers.
func (c *Client) Status(ctx context.Context) (*kvdirv1.StatusResponse, error) {
	return call(c, ctx, "status", false, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.StatusResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).Status(ctx, &kvdirv1.StatusRequest{}, opts...)
		})
}

// StatusOf returns the status as seen by the node at addr, without
// failover.
func (c *Client) StatusOf(ctx context.Context, addr string) (*kvdirv1.StatusResponse, error) {
	return callAt(c, ctx, "status", addr,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.StatusResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).Status(ctx, &kvdirv1.StatusRequest{}, opts...)
		})
}

// Snapshot makes the node at addr take a Raft snapshot now.
func (c *Client) Snapshot(ctx context.Context, addr string) (*kvdirv1.SnapshotResponse, error) {
	return callAt(c, ctx, "snapshot", addr,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.SnapshotResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).Snapshot(ctx, &kvdirv1.SnapshotRequest{}, opts...)
		})
}

// AddMember adds a node to the cluster (or records its API address).
func (c *Client) AddMember(ctx context.Context, req *kvdirv1.AddMemberRequest) (*kvdirv1.AddMemberResponse, error) {
	return call(c, ctx, "add member", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.AddMemberResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).AddMember(ctx, req, opts...)
		})
}

// RemoveMember removes a node from the cluster.
func (c *Client) RemoveMember(ctx context.Context, id string) (*kvdirv1.RemoveMemberResponse, error) {
	req := &kvdirv1.RemoveMemberRequest{Id: id}
	return call(c, ctx, "remove member", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.RemoveMemberResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).RemoveMember(ctx, req, opts...)
		})
}

// TransferLeadership hands leadership to member id (any suitable member if
// empty). The client forgets the old leader.
func (c *Client) TransferLeadership(ctx context.Context, id string) (*kvdirv1.TransferLeadershipResponse, error) {
	req := &kvdirv1.TransferLeadershipRequest{Id: id}
	resp, err := call(c, ctx, "transfer leadership", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.TransferLeadershipResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).TransferLeadership(ctx, req, opts...)
		})
	if err == nil {
		c.forgetLeader()
	}
	return resp, err
}

// DrainWorker marks a worker draining: it keeps its blocks but gets no new
// requests.
func (c *Client) DrainWorker(ctx context.Context, workerID string) (*kvdirv1.DrainWorkerResponse, error) {
	req := &kvdirv1.DrainWorkerRequest{WorkerId: workerID}
	return call(c, ctx, "drain worker", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.DrainWorkerResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).DrainWorker(ctx, req, opts...)
		})
}

// ExpireWorker expires a worker now, removing its blocks.
func (c *Client) ExpireWorker(ctx context.Context, workerID string) (*kvdirv1.ExpireWorkerResponse, error) {
	req := &kvdirv1.ExpireWorkerRequest{WorkerId: workerID}
	return call(c, ctx, "expire worker", true, nil,
		func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (*kvdirv1.ExpireWorkerResponse, error) {
			return kvdirv1.NewAdminServiceClient(cc).ExpireWorker(ctx, req, opts...)
		})
}

// callAt makes one call to the node at addr. An address the client does not
// know gets a connection for this call only.
func callAt[T any](c *Client, ctx context.Context, op, addr string, f rpcFunc[T]) (T, error) {
	var zero T
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, fmt.Errorf("dirclient: %s: %w", op, ErrClosed)
	}
	cc, known := c.conns[addr]
	c.mu.Unlock()
	if !known {
		var err error
		if cc, err = grpc.NewClient(addr, c.dialOpts...); err != nil {
			return zero, fmt.Errorf("dirclient: %s: connection to %s: %w", op, addr, err)
		}
		defer cc.Close()
	}
	if c.onAttempt != nil {
		c.onAttempt(op, addr)
	}
	var hdr metadata.MD
	resp, err := f(c.outgoing(ctx, nil), cc, grpc.Header(&hdr))
	c.noteHeader(hdr)
	if err != nil {
		return zero, c.finalError(op, addr, err)
	}
	return resp, nil
}
