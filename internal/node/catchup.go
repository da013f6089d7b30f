package node

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// DefaultReadyMaxLag is Config.ReadyMaxLag's default.
const DefaultReadyMaxLag = 10_000

// commitWatch records the highest commit index a leader has told this node
// (AppendEntriesRequest.LeaderCommitIndex). A follower's own commit index
// only reaches as far as the log it holds, so after a restart it cannot
// tell how far behind the leader it is; this can.
type commitWatch struct{ leaderCommit atomic.Uint64 }

func (w *commitWatch) observe(rpc raft.RPC) {
	a, ok := rpc.Command.(*raft.AppendEntriesRequest)
	if !ok {
		return
	}
	for {
		old := w.leaderCommit.Load()
		if a.LeaderCommitIndex <= old || w.leaderCommit.CompareAndSwap(old, a.LeaderCommitIndex) {
			return
		}
	}
}

// watchedTransport hands Raft the RPCs of its transport after w has seen
// them; everything else is the transport's.
type watchedTransport struct {
	raft.Transport
	w    *commitWatch
	stop <-chan struct{}
	once sync.Once
	out  chan raft.RPC
}

// preVoteTransport is a watchedTransport over a transport with pre-vote,
// so that Raft still finds it (a type assertion on the transport).
type preVoteTransport struct{ *watchedTransport }

func (t preVoteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.Transport.(raft.WithPreVote).RequestPreVote(id, target, args, resp)
}

// watchTransport wraps t so that w sees its inbound RPCs until stop
// closes.
func watchTransport(t raft.Transport, w *commitWatch, stop <-chan struct{}) raft.Transport {
	wt := &watchedTransport{Transport: t, w: w, stop: stop, out: make(chan raft.RPC)}
	if _, ok := t.(raft.WithPreVote); ok {
		return preVoteTransport{wt}
	}
	return wt
}

// Consumer relays the transport's RPCs.
func (t *watchedTransport) Consumer() <-chan raft.RPC {
	t.once.Do(func() {
		in := t.Transport.Consumer()
		go func() {
			for {
				select {
				case rpc := <-in:
					t.w.observe(rpc)
					select {
					case t.out <- rpc:
					case <-t.stop:
						return
					}
				case <-t.stop:
					return
				}
			}
		}()
	})
	return t.out
}

// Close closes the transport if it can be closed.
func (t *watchedTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// catchUpErr says why the node is too far behind to serve: its applied
// index is more than ReadyMaxLag behind the commit index, the leader's as
// the leader last sent it when this node follows (none received yet
// counts as behind).
func (n *Node) catchUpErr() error {
	applied := n.fsm.AppliedIndex()
	bound := n.cfg.ReadyMaxLag
	if bound == 0 {
		bound = DefaultReadyMaxLag
	}
	commit, whose := n.raft.CommitIndex(), "its commit index"
	if !n.IsLeader() {
		lc := n.commits.leaderCommit.Load()
		if lc == 0 {
			return fmt.Errorf("catching up: applied %d; no commit index received from the leader yet", applied)
		}
		commit, whose = max(commit, lc), "the leader's commit index"
	}
	if commit > applied+bound {
		return fmt.Errorf("catching up: applied %d of %s %d (%d behind, more than %d)", applied, whose, commit, commit-applied, bound)
	}
	return nil
}
