// Package follow keeps a local replica of the directory's state machine,
// fed by a directory node's Follow stream of the committed log.
//
// A Follower holds its own raftfsm.FSM. It opens DirectoryService.Follow on
// one of the nodes it is given, restores the snapshot the node sends first
// (when it has no state yet, or has fallen behind the node's feed; decoded
// as its chunks arrive, never held whole, and swapped in only once all of
// it has been read and checked) and then applies each committed entry with the same Apply code the directory's
// nodes run, so that its state equals a node's at the same index. When the
// stream breaks it reconnects, to the next node in turn, and resumes after
// the last index it applied. Reads (Match and the rest) go to FSM().
//
// The router uses it with --follow-log (router.Config.Local): while the
// replica is in sync (Synced), MatchChain answers its prefix matches.
package follow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Defaults of Config.
const (
	DefaultRetryMin = 50 * time.Millisecond
	DefaultRetryMax = 2 * time.Second
	// DefaultSilence is six of the empty batches a current node sends on
	// a quiet stream every half second.
	DefaultSilence = 3 * time.Second
)

// maxMessage matches the nodes' message limit.
const maxMessage = 64 << 20

// maxSnapshot bounds the snapshot a follower accepts in memory.
const maxSnapshot = 4 << 30

// Config configures a Follower.
type Config struct {
	// Addrs are the directory nodes' API addresses, tried in turn.
	Addrs []string
	// DialOptions are used to dial them (default: plaintext); add TLS
	// credentials here.
	DialOptions []grpc.DialOption
	// Token, if set, is sent as "authorization: Bearer <token>" (a token
	// of the router role, which Follow requires when tokens are on).
	Token string
	// FSM bounds the local state machine; use the directory's own
	// settings, or the replica may refuse what the directory accepted.
	FSM raftfsm.Options
	// RetryMin and RetryMax bound the pause before reconnecting after a
	// broken stream (doubling from RetryMin).
	RetryMin, RetryMax time.Duration
	// Silence ends a stream on which nothing arrived for that long, and
	// the follower moves to the next node (default DefaultSilence;
	// negative: never). A node sends something every half second while it
	// is current; one cut off from its peers, or from the follower by a
	// network that drops packets, does not.
	Silence time.Duration
	// OnApplied, if set, is called with the local applied index after each
	// batch of entries is applied and after each snapshot is restored. It
	// runs on the goroutine that applies and must not block.
	OnApplied func(applied uint64)
	Logger    *slog.Logger
}

// RestoreStats describes a snapshot the follower restored, and where the
// time to restore it went.
type RestoreStats struct {
	// Index is the snapshot's applied index, Bytes its size.
	Index uint64
	Bytes int64
	// Wait is from opening the stream until the snapshot's first chunk
	// arrived (for a stream that starts with a snapshot: the node starting
	// to encode its state); Receive from then until the last chunk
	// arrived, the chunks being decoded as they arrive; Apply from then
	// until the restored state was in place (the end of the decoding, the
	// block table built and every counter checked).
	Wait, Receive, Apply time.Duration
}

// Follower is a local replica of the directory's state machine.
type Follower struct {
	cfg   Config
	log   *slog.Logger
	fsm   *raftfsm.FSM
	conns []*grpc.ClientConn

	commit    atomic.Uint64 // latest commit index a node reported
	heard     atomic.Int64  // when a node last sent anything (Unix nanoseconds; 0: never)
	snapshots atomic.Uint64 // snapshots restored
	// resync makes the next stream start from a snapshot (the local state
	// is not to be trusted after a failed apply).
	resync atomic.Bool

	mu          sync.Mutex
	applyErr    error // set by the FSM's Fatal hook during an apply
	node        string
	lastRestore RestoreStats
}

// New returns a Follower for cfg; Run starts it.
func New(cfg Config) (*Follower, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("follow: no directory addresses")
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = DefaultRetryMin
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryMin)
	}
	if cfg.Silence == 0 {
		cfg.Silence = DefaultSilence
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	f := &Follower{cfg: cfg, log: cfg.Logger.With("component", "follow")}
	opts := cfg.FSM
	opts.Logger = f.log
	opts.OnWorkersChanged, opts.OnApplied, opts.OnRestored = nil, nil, nil
	opts.Fatal = func(err error) {
		f.mu.Lock()
		f.applyErr = err
		f.mu.Unlock()
	}
	f.fsm = raftfsm.New(opts)
	dial := cfg.DialOptions
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	for _, a := range cfg.Addrs {
		cc, err := grpc.NewClient(a, dial...)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("follow: dial %s: %w", a, err)
		}
		f.conns = append(f.conns, cc)
	}
	return f, nil
}

// Close closes the connections. Call it after Run returned.
func (f *Follower) Close() error {
	var errs []error
	for _, cc := range f.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// FSM is the local state machine, for reads (Match, Workers, ...). Do not
// apply to it or restore it.
func (f *Follower) FSM() *raftfsm.FSM { return f.fsm }

// AppliedIndex is the log index of the last entry applied locally.
func (f *Follower) AppliedIndex() uint64 { return f.fsm.AppliedIndex() }

// Digest is the local state's digest (raftfsm.FSM.Digest).
func (f *Follower) Digest() uint64 { return f.fsm.Digest() }

// IndexDigest is the local block index's digest (raftfsm.FSM.IndexDigest).
func (f *Follower) IndexDigest() uint64 { return f.fsm.IndexDigest() }

// Lag is how many log indexes the local state is behind the latest commit
// index a node reported (0 when caught up or before any report).
func (f *Follower) Lag() uint64 {
	c, a := f.commit.Load(), f.fsm.AppliedIndex()
	if c <= a {
		return 0
	}
	return c - a
}

// Snapshots is how many snapshots the follower has restored: one to start
// with, and one more each time it resumed from before a node's feed.
func (f *Follower) Snapshots() uint64 { return f.snapshots.Load() }

// LastRestore describes the last snapshot restored; ok is false before the
// first.
func (f *Follower) LastRestore() (stats RestoreStats, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRestore, f.snapshots.Load() > 0
}

// Node is the address of the node the follower streams from now ("" when
// it is not connected).
func (f *Follower) Node() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.node
}

// Run follows the log until ctx ends, reconnecting (to the next node in
// turn) whenever a stream breaks; it returns ctx's error.
func (f *Follower) Run(ctx context.Context) error {
	pause := f.cfg.RetryMin
	for at := 0; ; at = (at + 1) % len(f.conns) {
		progressed, err := f.follow(ctx, at)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			pause = f.cfg.RetryMin
		}
		f.log.Info("follow stream ended; reconnecting", "node", f.cfg.Addrs[at], "applied", f.AppliedIndex(), "err", err, "pause", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if !progressed {
			pause = min(2*pause, f.cfg.RetryMax)
		}
	}
}

// follow runs one stream from node at until it breaks, and reports
// whether it applied anything.
func (f *Follower) follow(ctx context.Context, at int) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	after := f.fsm.AppliedIndex()
	if f.resync.Load() {
		after = 0
	}
	if f.cfg.Token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+f.cfg.Token)
	}
	stream, err := kvdirv1.NewDirectoryServiceClient(f.conns[at]).Follow(ctx, &kvdirv1.FollowRequest{AfterIndex: after})
	if err != nil {
		return false, fmt.Errorf("open follow stream: %w", err)
	}
	f.mu.Lock()
	f.node = f.cfg.Addrs[at]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.node = ""
		f.mu.Unlock()
	}()
	// silent is set, and the stream cancelled, when nothing arrived on it
	// for cfg.Silence.
	var silent atomic.Bool
	alive := func() {}
	if f.cfg.Silence > 0 {
		watchdog := time.AfterFunc(f.cfg.Silence, func() { silent.Store(true); cancel() })
		defer watchdog.Stop()
		defer func() {
			if silent.Load() {
				err = fmt.Errorf("follow stream: nothing from %s for %v: %w", f.cfg.Addrs[at], f.cfg.Silence, err)
			}
		}()
		alive = func() { watchdog.Reset(f.cfg.Silence) }
	}
	opened := time.Now()
	var rs *restore // the snapshot being received, if any
	defer func() {
		if rs != nil {
			_ = rs.finish(errors.New("follow stream ended inside a snapshot"))
		}
	}()
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("node ended the stream")
			}
			return progressed, fmt.Errorf("follow stream: %w", err)
		}
		alive()
		switch p := resp.Payload.(type) {
		case *kvdirv1.FollowResponse_Snapshot:
			s := p.Snapshot
			if rs != nil && s.Index != rs.index {
				return progressed, fmt.Errorf("follow stream: snapshot chunk of index %d inside the snapshot of index %d", s.Index, rs.index)
			}
			if rs == nil {
				rs = startRestore(f.fsm, s.Index)
			}
			if rs.bytes+int64(len(s.Data)) > maxSnapshot {
				return progressed, fmt.Errorf("follow stream: snapshot over %d bytes", maxSnapshot)
			}
			if !rs.add(s.Data) {
				err := rs.finish(io.EOF)
				rs = nil
				f.resync.Store(true)
				if err == nil {
					err = errors.New("data after the snapshot's end")
				}
				return progressed, fmt.Errorf("follow stream: snapshot refused before its last chunk: %w", err)
			}
			if !s.Last {
				continue
			}
			received := time.Now()
			r := rs
			rs = nil
			if err := r.finish(io.EOF); err != nil {
				f.resync.Store(true)
				return progressed, fmt.Errorf("follow stream: %w", err)
			}
			if got := f.fsm.AppliedIndex(); got != r.index {
				f.resync.Store(true)
				return progressed, fmt.Errorf("follow stream: snapshot said index %d, holds %d", r.index, got)
			}
			stats := RestoreStats{Index: r.index, Bytes: r.bytes, Wait: r.start.Sub(opened),
				Receive: received.Sub(r.start), Apply: time.Since(received)}
			f.mu.Lock()
			f.lastRestore = stats
			f.mu.Unlock()
			f.resync.Store(false)
			f.snapshots.Add(1)
			progressed = true
			f.log.Info("restored a snapshot from the directory", "node", f.cfg.Addrs[at], "index", r.index,
				"bytes", stats.Bytes, "wait", stats.Wait, "receive", stats.Receive, "apply", stats.Apply)
			f.applied(r.index)
		case *kvdirv1.FollowResponse_Entries:
			if rs != nil {
				return progressed, errors.New("follow stream: entries inside a snapshot")
			}
			if f.resync.Load() {
				return progressed, errors.New("follow stream: entries before the snapshot this follower needs")
			}
			if err := f.apply(p.Entries.Entries); err != nil {
				f.resync.Store(true)
				return progressed, err
			}
			progressed = true
		default:
			return progressed, fmt.Errorf("follow stream: message with no payload (%T)", p)
		}
		f.commit.Store(max(f.commit.Load(), resp.CommitIndex))
		f.heard.Store(time.Now().UnixNano())
	}
}

// apply applies entries after the local applied index, in order.
func (f *Follower) apply(entries []*kvdirv1.FollowEntry) error {
	applied := f.fsm.AppliedIndex()
	logs := make([]*raft.Log, 0, len(entries))
	for _, e := range entries {
		if e.Index <= applied {
			continue // already applied (a resumed stream overlaps)
		}
		applied = e.Index
		logs = append(logs, &raft.Log{Index: e.Index, Term: e.Term, Type: raft.LogCommand, Data: e.Data})
	}
	if len(logs) == 0 {
		return nil
	}
	f.fsm.ApplyBatch(logs)
	f.mu.Lock()
	err := f.applyErr
	f.applyErr = nil
	f.mu.Unlock()
	if err != nil {
		return fmt.Errorf("follow: apply: %w; resyncing from a snapshot", err)
	}
	f.applied(applied)
	return nil
}

// View is what a follower reports of its replica: where it streams from,
// how far it is behind, and the digests of its state at AppliedIndex.
type View struct {
	// Node is the address streamed from now ("" when not connected).
	Node string
	// Synced is Synced(); Staleness is Staleness().
	Synced    bool
	Staleness time.Duration
	// AppliedIndex is the local applied index; CommitIndex the latest a
	// node reported; LagEntries the difference (Lag).
	AppliedIndex, CommitIndex, LagEntries uint64
	// Digest is the state's digest (raftfsm.FSM.Digest) and IndexDigest the
	// block index's (the one a node's Status reports), both at AppliedIndex.
	Digest, IndexDigest uint64
	// Snapshots is Snapshots().
	Snapshots uint64
}

// View reports the replica's state, its digests read together with the
// applied index they describe.
func (f *Follower) View() View {
	d, id, applied := f.fsm.Digests()
	v := View{Node: f.Node(), Synced: f.Synced(), Staleness: f.Staleness(), AppliedIndex: applied,
		CommitIndex: f.commit.Load(), Digest: d, IndexDigest: id, Snapshots: f.snapshots.Load()}
	if v.CommitIndex > applied {
		v.LagEntries = v.CommitIndex - applied
	}
	return v
}

// applied calls the OnApplied hook, if any.
func (f *Follower) applied(index uint64) {
	if f.cfg.OnApplied != nil {
		f.cfg.OnApplied(index)
	}
}
