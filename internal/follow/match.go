package follow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
)

// ErrNotSynced is MatchChain's answer while the follower has no state it
// can answer from: before its first snapshot, or while it must resync.
var ErrNotSynced = errors.New("follow: the local replica is not in sync with a directory node")

// ErrConsistent is MatchChain's answer to a consistent read, which only
// the leader can serve.
var ErrConsistent = errors.New("follow: a consistent read needs the leader; the local replica cannot serve it")

// Synced reports whether the replica has a state to answer from: a
// snapshot restored and nothing since that makes it untrustworthy. How
// current that state is, is Staleness.
func (f *Follower) Synced() bool {
	return f.snapshots.Load() > 0 && !f.resync.Load()
}

// Staleness is how long ago a directory node last sent the replica
// anything (entries, a snapshot, or the empty batch a node sends every
// half second on a quiet stream while it hears from the leader); a replica
// never reached reports a very large value. An in-sync replica streaming
// from a current node stays well under a second.
func (f *Follower) Staleness() time.Duration {
	h := f.heard.Load()
	if h == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Since(time.Unix(0, h))
}

// MatchChain answers a chain match from the local replica, as a directory
// node's Match answers it from its own state (the router's matcher).
func (f *Follower) MatchChain(_ context.Context, hashes []uint64, blockSize uint32, consistent bool) (*kvdirv1.MatchResponse, error) {
	if consistent {
		return nil, ErrConsistent
	}
	if !f.Synced() {
		return nil, ErrNotSynced
	}
	bp := matchPool.Get().(*[]radix.WorkerMatch)
	defer matchPool.Put(bp)
	ms, applied, err := f.fsm.Match((*bp)[:0], hashes)
	*bp = ms[:0]
	if err != nil {
		return nil, fmt.Errorf("follow: match: %w", err)
	}
	resp := &kvdirv1.MatchResponse{ChainBlocks: uint32(len(hashes)),
		Read: &kvdirv1.ReadInfo{NodeId: "local", AppliedIndex: applied}}
	if len(ms) > 0 {
		resp.Matches = make([]*kvdirv1.WorkerMatch, len(ms))
		for i, m := range ms {
			resp.Matches[i] = raftfsm.WorkerMatchProto(m, blockSize)
		}
	}
	return resp, nil
}

// matchPool holds the per-worker rows of MatchChain's walk, reused from
// one match to the next (the walk itself allocates nothing per block).
var matchPool = sync.Pool{New: func() any { return new([]radix.WorkerMatch) }}
