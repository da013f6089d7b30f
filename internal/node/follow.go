package node

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Bounds of the follow feed. The feed keeps the most recently applied
// command entries, at most DefaultFollowFeedEntries of them and at most
// DefaultFollowFeedBytes of entry data, whichever bound is reached first;
// a Follow client further behind than that is sent a fresh snapshot.
const (
	DefaultFollowFeedEntries = 64 << 10
	DefaultFollowFeedBytes   = 64 << 20
)

// followKeepalive is how long a Follow stream stays silent before the node
// sends an empty batch, so that a follower can bound how stale its view is.
const followKeepalive = 500 * time.Millisecond

// followCurrentWithin is how recently a follower node must have heard
// from the leader to send keepalives: a node cut off for longer sends
// nothing, and its clients' views age (see Follow).
const followCurrentWithin = 4 * followKeepalive

// leaderContactAge is how long ago this node heard from a leader: 0 on
// the leader itself; ok is false when it never has.
func (n *Node) leaderContactAge() (age time.Duration, ok bool) {
	if n.raft.State() == raft.Leader {
		return 0, true
	}
	last := n.raft.LastContact()
	if last.IsZero() {
		return 0, false
	}
	return time.Since(last), true
}

// Bounds of one Follow message.
const (
	followBatchEntries = 1024
	followBatchBytes   = 4 << 20
	followChunkBytes   = 1 << 20
)

// feed is a bounded in-memory copy of the recently applied command
// entries, which Follow streams read from. The state machine pushes to it
// on the apply path and never waits on a reader: readers pull from it at
// their own pace, and one that falls behind what the feed still holds
// learns so and takes a snapshot instead.
type feed struct {
	maxEntries, maxBytes int

	mu      sync.Mutex
	entries []*kvdirv1.FollowEntry // in log order
	bytes   int                    // data bytes in entries
	// floor: every command entry applied after index floor is in entries.
	floor  uint64
	wake   chan struct{} // closed (and replaced) when entries arrive
	closed bool
}

func newFeed(maxEntries, maxBytes int) *feed {
	if maxEntries <= 0 {
		maxEntries = DefaultFollowFeedEntries
	}
	if maxBytes <= 0 {
		maxBytes = DefaultFollowFeedBytes
	}
	return &feed{maxEntries: maxEntries, maxBytes: maxBytes, wake: make(chan struct{})}
}

// push is the state machine's OnApplied hook: it appends the applied
// command entries and drops the oldest over the bounds.
func (f *feed) push(logs []*raft.Log) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range logs {
		if n := len(f.entries); n > 0 && l.Index <= f.entries[n-1].Index {
			continue // never happens on one node's apply path; kept strictly ordered
		}
		f.entries = append(f.entries, &kvdirv1.FollowEntry{Index: l.Index, Term: l.Term, Data: l.Data})
		f.bytes += len(l.Data)
	}
	drop := 0
	for len(f.entries)-drop > f.maxEntries || (f.bytes > f.maxBytes && len(f.entries)-drop > 1) {
		e := f.entries[drop]
		f.bytes -= len(e.Data)
		f.floor = e.Index
		f.entries[drop] = nil
		drop++
	}
	if drop > 0 {
		f.entries = f.entries[drop:]
		if cap(f.entries) > 2*f.maxEntries {
			f.entries = slices.Clone(f.entries)
		}
	}
	f.wakeLocked()
}

// wakeLocked wakes the readers waiting for entries; f.mu is held.
func (f *feed) wakeLocked() {
	if f.closed {
		return // closing woke them for good
	}
	close(f.wake)
	f.wake = make(chan struct{})
}

// reset is the state machine's OnRestored hook: the state was replaced by
// a snapshot at applied, so the entries the feed holds no longer join up
// with what comes next.
func (f *feed) reset(applied uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.entries)
	f.entries, f.bytes, f.floor = f.entries[:0], 0, applied
	f.wakeLocked()
}

func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.wake)
	}
}

// read returns up to one message's worth of the entries after index after.
// behind reports that some of them are no longer held (a snapshot is
// needed). When there is nothing to read, wake is closed once there may be.
func (f *feed) read(after uint64) (out []*kvdirv1.FollowEntry, behind bool, wake <-chan struct{}, closed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, false, nil, true
	}
	if after < f.floor {
		return nil, true, nil, false
	}
	i := sort.Search(len(f.entries), func(i int) bool { return f.entries[i].Index > after })
	size := 0
	for ; i < len(f.entries) && len(out) < followBatchEntries; i++ {
		e := f.entries[i]
		if len(out) > 0 && size+len(e.Data) > followBatchBytes {
			break
		}
		out = append(out, e)
		size += len(e.Data)
	}
	return out, false, f.wake, false
}

// Follow streams the committed log from this node's applied state: a
// snapshot when the client starts from 0 or from before the feed, then
// every entry after the index it reports, and a fresh snapshot whenever
// the client falls behind the feed.
func (s *directoryService) Follow(req *kvdirv1.FollowRequest, stream kvdirv1.DirectoryService_FollowServer) error {
	n := s.n
	after, snap := req.AfterIndex, req.AfterIndex == 0
	for {
		if snap {
			idx, err := n.sendFollowSnapshot(stream)
			if err != nil {
				return err
			}
			after, snap = idx, false
		}
		entries, behind, wake, closed := n.feed.read(after)
		switch {
		case closed:
			return status.Error(codes.Unavailable, "node is shutting down; follow another node")
		case behind:
			n.log.Debug("follow: client behind the feed; sending a snapshot", "after", after)
			snap = true
			continue
		case len(entries) > 0:
			err := stream.Send(&kvdirv1.FollowResponse{
				Payload:     &kvdirv1.FollowResponse_Entries{Entries: &kvdirv1.FollowEntries{Entries: entries}},
				CommitIndex: n.fsm.AppliedIndex(),
			})
			if err != nil {
				return err
			}
			after = entries[len(entries)-1].Index
			continue
		}
		keepalive := time.NewTimer(followKeepalive)
		select {
		case <-stream.Context().Done():
			keepalive.Stop()
			return nil
		case <-n.stop:
			keepalive.Stop()
			return status.Error(codes.Unavailable, "node is shutting down; follow another node")
		case <-wake:
			keepalive.Stop()
		case <-keepalive.C:
			// Nothing was applied for a while: an empty batch tells the
			// client the stream and this node are alive, with the applied
			// index, so that it can tell a quiet cluster from a lost one.
			// A node cut off from the leader is not current itself: it
			// stays silent, so that the client's view ages, and past
			// MaxStaleness it ends the stream, as it refuses other reads.
			switch age, ok := n.leaderContactAge(); {
			case ok && age > n.cfg.MaxStaleness:
				return status.Errorf(codes.Unavailable, "this node last heard from a leader %v ago (more than %v): follow another node",
					age.Round(time.Millisecond), n.cfg.MaxStaleness)
			case !ok || age > followCurrentWithin:
				continue
			}
			if err := stream.Send(&kvdirv1.FollowResponse{
				Payload:     &kvdirv1.FollowResponse_Entries{Entries: &kvdirv1.FollowEntries{}},
				CommitIndex: n.fsm.AppliedIndex(),
			}); err != nil {
				return err
			}
		}
	}
}

// sendFollowSnapshot sends the state machine's current state in chunks and
// returns the applied index it holds. The state is encoded into memory on a
// goroutine of its own (the encoding holds the state machine's locks, so it
// must never wait on the network) while the chunks already encoded are
// sent, so that the first chunk leaves at once and the client decodes while
// the rest is encoded and sent.
func (n *Node) sendFollowSnapshot(stream kvdirv1.DirectoryService_FollowServer) (uint64, error) {
	sc := newSnapChunks()
	go func() {
		err := n.fsm.WriteStateAt(sc, sc.begin)
		sc.close(err)
	}()
	for {
		chunk, last, idx, err := sc.next(stream.Context().Done())
		if err != nil {
			return 0, status.Errorf(codes.Internal, "follow: snapshot: %v", err)
		}
		if chunk == nil {
			return 0, stream.Context().Err()
		}
		err = stream.Send(&kvdirv1.FollowResponse{
			Payload:     &kvdirv1.FollowResponse_Snapshot{Snapshot: &kvdirv1.FollowSnapshot{Data: chunk, Index: idx, Last: last}},
			CommitIndex: n.fsm.AppliedIndex(),
		})
		if err != nil {
			return 0, fmt.Errorf("follow: send snapshot: %w", err)
		}
		if last {
			return idx, nil
		}
	}
}

// snapChunks collects an encoded snapshot in chunks of followChunkBytes and
// hands them out as they fill. The writer never waits for the reader.
type snapChunks struct {
	mu     sync.Mutex
	full   [][]byte // filled chunks not yet taken
	cur    []byte   // the chunk being filled
	index  uint64   // the applied index being written, once begun
	closed bool
	err    error // once closed: the encoder's error
	wake   chan struct{}
}

func newSnapChunks() *snapChunks { return &snapChunks{wake: make(chan struct{}, 1)} }

// begin records the applied index of the state about to be written.
func (c *snapChunks) begin(index uint64) {
	c.mu.Lock()
	c.index = index
	c.mu.Unlock()
}

// Write appends p, handing out each chunk it fills.
func (c *snapChunks) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if c.cur == nil {
			c.cur = make([]byte, 0, followChunkBytes)
		}
		k := copy(c.cur[len(c.cur):cap(c.cur)], p)
		c.cur, p = c.cur[:len(c.cur)+k], p[k:]
		if len(c.cur) == cap(c.cur) {
			c.mu.Lock()
			c.full = append(c.full, c.cur)
			c.mu.Unlock()
			c.cur = nil
			c.signal()
		}
	}
	return n, nil
}

// close ends the snapshot: the partly filled chunk is handed out too.
func (c *snapChunks) close(err error) {
	c.mu.Lock()
	if len(c.cur) > 0 || len(c.full) == 0 {
		c.full = append(c.full, c.cur) // an empty state still sends one (empty) chunk
	}
	c.cur = nil
	c.closed, c.err = true, err
	c.mu.Unlock()
	c.signal()
}

func (c *snapChunks) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// next waits for the next chunk, and says whether it is the last and the
// applied index of the state it is part of. It returns a nil chunk when stop is closed
// first, and the encoder's error if it failed.
func (c *snapChunks) next(stop <-chan struct{}) (chunk []byte, last bool, index uint64, err error) {
	for {
		c.mu.Lock()
		if c.closed && c.err != nil {
			c.mu.Unlock()
			return nil, false, 0, c.err
		}
		// A chunk goes out once another follows it, or the encoder is
		// done; only then is it known whether it is the last.
		if len(c.full) > 1 || (c.closed && len(c.full) == 1) {
			chunk = c.full[0]
			c.full[0] = nil
			c.full = c.full[1:]
			last = c.closed && len(c.full) == 0
			index = c.index
			c.mu.Unlock()
			if chunk == nil {
				chunk = []byte{}
			}
			return chunk, last, index, nil
		}
		c.mu.Unlock()
		select {
		case <-c.wake:
		case <-stop:
			return nil, false, 0, nil
		}
	}
}
