package node

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// leases is the leader's memory of workers' heartbeats. It is not
// replicated: a new leader starts every clock afresh, so a leader change
// never expires workers that were heartbeating to the old leader.
type leases struct {
	mu      sync.Mutex
	entries map[string]*leaseEntry
	gen     uint64 // calls of expired, to find the entries it did not see
}

type leaseEntry struct {
	epoch uint64
	at    time.Time
	load  *kvdirv1.Load
	dirty bool   // load not yet committed
	seen  uint64 // the leases.gen of the last expired that saw the worker
}

func newLeases() *leases { return &leases{entries: make(map[string]*leaseEntry)} }

func (l *leases) renew(id string, epoch uint64, load *kvdirv1.Load, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[id]
	if e == nil || e.epoch < epoch {
		e = &leaseEntry{epoch: epoch}
		l.entries[id] = e
	}
	if e.epoch != epoch {
		return // a heartbeat of an older incarnation
	}
	e.at = now
	if load != nil {
		e.load, e.dirty = load, true
	}
}

// restart starts every clock at now (on gaining leadership).
func (l *leases) restart(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.entries {
		e.at = now
	}
}

// expired returns the alive workers whose lease lapsed, starting the clock
// of workers it has not seen yet, and forgets workers that are gone. It
// runs on every tick of the leader loop over every worker, so it allocates
// nothing per worker it already knows.
func (l *leases) expired(workers []raftfsm.WorkerEpoch, lease time.Duration, now time.Time) []raftfsm.WorkerEpoch {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	var out []raftfsm.WorkerEpoch
	for _, w := range workers {
		e := l.entries[w.ID]
		if e == nil || e.epoch < w.Epoch {
			l.entries[w.ID] = &leaseEntry{epoch: w.Epoch, at: now, seen: l.gen}
			continue
		}
		e.seen = l.gen
		if now.Sub(e.at) > lease {
			out = append(out, w)
		}
	}
	if len(l.entries) > len(workers) {
		for id, e := range l.entries {
			if e.seen != l.gen {
				delete(l.entries, id)
			}
		}
	}
	return out
}

// takeLoads returns the loads not yet committed.
func (l *leases) takeLoads() []*kvdirv1.WorkerLoad {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*kvdirv1.WorkerLoad
	for id, e := range l.entries {
		if e.dirty {
			out = append(out, &kvdirv1.WorkerLoad{WorkerId: id, Epoch: e.epoch, Load: e.load})
			e.dirty = false
		}
	}
	return out
}

// leaderLoop runs the leader's periodic duties: lease expiry, committing
// loads, expiring old sessions and publishing its own API address.
func (n *Node) leaderLoop() {
	defer n.wg.Done()
	tick := time.NewTicker(min(n.cfg.LoadInterval, n.cfg.Lease/4, 250*time.Millisecond))
	defer tick.Stop()
	leaderCh := n.raft.LeaderCh()
	var lastLoads, lastSessions time.Time
	var alive []raftfsm.WorkerEpoch // reused tick to tick
	for {
		select {
		case <-n.stop:
			return
		case isLeader := <-leaderCh:
			if isLeader {
				n.leases.restart(n.now())
				n.log.Info("became leader; lease clocks restarted")
			}
			continue
		case <-tick.C:
		}
		if n.raft.State() != raft.Leader {
			continue
		}
		now := n.now()
		alive = n.fsm.AliveEpochs(alive[:0])
		for _, w := range n.leases.expired(alive, n.cfg.Lease, now) {
			n.log.Info("expiring worker: lease lapsed", "worker", w.ID, "epoch", w.Epoch)
			if _, _, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_WORKER,
				&kvdirv1.ExpireWorkerCommand{WorkerId: w.ID, Epoch: w.Epoch, Reason: "lease lapsed"}); err != nil {
				n.log.Warn("expire worker", "worker", w.ID, "err", err)
			}
		}
		if now.Sub(lastLoads) >= n.cfg.LoadInterval {
			lastLoads = now
			if loads := n.leases.takeLoads(); len(loads) > 0 {
				if _, _, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_LOADS, &kvdirv1.LoadsCommand{Loads: loads}); err != nil {
					n.log.Warn("commit loads", "err", err)
				}
			}
		}
		if every := min(n.cfg.SessionTTL/10, time.Minute); now.Sub(lastSessions) >= every {
			lastSessions = now
			if n.fsm.Counters().Sessions > 0 {
				if _, _, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_SESSIONS,
					&kvdirv1.ExpireSessionsCommand{BeforeUnixNano: now.Add(-n.cfg.SessionTTL).UnixNano()}); err != nil {
					n.log.Warn("expire sessions", "err", err)
				}
			}
		}
	}
}

// memberLoop makes sure this node is a member (joining through Config.Join
// when it is not) and that its API address is in the replicated member
// table, so that every node can tell clients where the leader's API is.
func (n *Node) memberLoop() {
	defer n.wg.Done()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		if n.fsm.MemberAPI(n.cfg.ID) == n.cfg.APIAdvertise {
			continue
		}
		if n.IsLeader() {
			if _, _, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_MEMBER_API,
				&kvdirv1.MemberAPICommand{Id: n.cfg.ID, ApiAddress: n.cfg.APIAdvertise}); err != nil {
				n.log.Warn("publish API address", "err", err)
			}
			continue
		}
		targets := n.cfg.Join
		if addr, ok := n.leaderAPI(); ok {
			targets = append([]string{addr}, targets...)
		}
		for _, addr := range targets {
			if err := n.askToJoin(addr); err != nil {
				n.log.Debug("join", "via", addr, "err", err)
				continue
			}
			break
		}
	}
}

// askToJoin asks the node at addr to add this node (or, when it is already
// a member, to record its API address).
func (n *Node) askToJoin(addr string) error {
	creds := insecure.NewCredentials()
	if n.cfg.ClientTLS != nil {
		creds = credentials.NewTLS(n.cfg.ClientTLS)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if n.cfg.Tokens.Admin != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+n.cfg.Tokens.Admin)
	}
	_, err = kvdirv1.NewAdminServiceClient(conn).AddMember(ctx, &kvdirv1.AddMemberRequest{
		Id: n.cfg.ID, RaftAddress: n.cfg.RaftAdvertise, ApiAddress: n.cfg.APIAdvertise,
	})
	return err
}
