package node

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Metadata keys, shared with clients (see kvdirv1.Metadata*).
const (
	mdForwarded = kvdirv1.MetadataForwarded
	// MDLeader is the response header naming the leader's API address.
	MDLeader = kvdirv1.MetadataLeader
	// MDWorkerToken carries the token Register returned.
	MDWorkerToken = kvdirv1.MetadataWorkerToken
)

// forwarder keeps a connection to the current leader's API.
type forwarder struct {
	n    *Node
	mu   sync.Mutex
	addr string
	conn *grpc.ClientConn
	// last is the ID of the last leader Raft reported. A follower cut off
	// from Raft forgets its leader after one heartbeat timeout, though that
	// leader may still be serving; forwarding there is safe (a node that is
	// no longer leader refuses a forwarded write) and keeps a node whose
	// Raft port alone is cut useful for writes.
	last atomic.Value // raft.ServerID
}

func newForwarder(n *Node) *forwarder { return &forwarder{n: n} }

// leaderClient is a connection to the leader's API.
type leaderClient struct {
	agent kvdirv1.AgentServiceClient
	dir   kvdirv1.DirectoryServiceClient
	admin kvdirv1.AdminServiceClient
}

// outgoing returns a context for a forwarded call: the caller's credentials
// and the forwarded mark.
func (c *leaderClient) outgoing(ctx context.Context) context.Context {
	out := metadata.MD{}
	if in, ok := metadata.FromIncomingContext(ctx); ok {
		for _, k := range []string{"authorization", MDWorkerToken} {
			if v := in.Get(k); len(v) > 0 {
				out.Set(k, v...)
			}
		}
	}
	out.Set(mdForwarded, "1")
	return metadata.NewOutgoingContext(ctx, out)
}

// leaderAPI returns the leader's API address, if known.
func (n *Node) leaderAPI() (string, bool) {
	_, id := n.raft.LeaderWithID()
	if id == "" {
		return "", false
	}
	if string(id) == n.cfg.ID {
		return n.cfg.APIAdvertise, true
	}
	addr := n.fsm.MemberAPI(string(id)) // every call does this: no map copy
	return addr, addr != ""
}

// leader returns a client for the leader's API, or an Unavailable status
// when there is no leader to forward to.
func (f *forwarder) leader(ctx context.Context) (*leaderClient, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(mdForwarded)) > 0 {
		return nil, status.Error(codes.Unavailable, "this node is no longer the leader; retry")
	}
	addr, ok := f.n.leaderAPI()
	if !ok {
		addr, ok = f.lastLeaderAPI()
	}
	if !ok {
		return nil, status.Error(codes.Unavailable, "no leader is known; the cluster may be electing one, retry")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn == nil || f.addr != addr {
		if f.conn != nil {
			f.conn.Close()
		}
		creds := insecure.NewCredentials()
		if f.n.cfg.ClientTLS != nil {
			creds = credentials.NewTLS(f.n.cfg.ClientTLS)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "dial leader at %s: %v", addr, err)
		}
		f.conn, f.addr = conn, addr
	}
	return &leaderClient{
		agent: kvdirv1.NewAgentServiceClient(f.conn),
		dir:   kvdirv1.NewDirectoryServiceClient(f.conn),
		admin: kvdirv1.NewAdminServiceClient(f.conn),
	}, nil
}

// watchLeader records every leader Raft reports until stop closes.
func (f *forwarder) watchLeader(r *raft.Raft, stop <-chan struct{}, wg *sync.WaitGroup) {
	ch := make(chan raft.Observation, 4)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(obs)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer r.DeregisterObserver(obs)
		for {
			select {
			case <-stop:
				return
			case o := <-ch:
				if lo, ok := o.Data.(raft.LeaderObservation); ok && lo.LeaderID != "" {
					f.last.Store(lo.LeaderID)
				}
			}
		}
	}()
}

// lastLeaderAPI returns the API address of the last leader Raft reported,
// when that is another node whose address is known.
func (f *forwarder) lastLeaderAPI() (string, bool) {
	id, _ := f.last.Load().(raft.ServerID)
	if id == "" || string(id) == f.n.cfg.ID {
		return "", false
	}
	addr := f.n.fsm.MemberAPI(string(id))
	return addr, addr != ""
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		f.conn.Close()
		f.conn = nil
	}
}
