package node

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/raftfsm"
)

// A committed log entry this build cannot decode stops the node's state
// machine: applying past it could leave this node's state unlike the
// others'. Every node meets the same entry at the same index, so they all
// stop there, and a node restarted as it was would stop there again. The
// node instead
//
//   - stops applying (the state stays at the entry before, reads are
//     refused, /readyz says why, Failed is closed so that the program
//     running the node can stop it) and records the entry's index in its
//     stable store;
//   - refuses to start while that index is recorded and the entry still
//     cannot be decoded, with an *UndecodableEntryError naming it;
//   - applies it as a no-op when the operator lists its index in
//     Config.SkipUndecodableEntries. Given to every node that stopped
//     there, the list makes them all skip the same entry, so they still
//     agree. Only an entry that does not decode is skipped: a mistyped
//     index changes nothing.
//
// The leader encodes every command it proposes, so such an entry comes
// from outside: a Raft message forged by whoever can reach the Raft port
// (closed by RaftTLS), or a newer build's command during an upgrade that
// went the wrong way (then upgrading this node decodes it, and the record
// is dropped at start).

// stableKeyUndecodable is the stable-store key of the index of the entry
// the node stopped at (0 or absent: none).
var stableKeyUndecodable = []byte("kvdir_undecodable_entry")

// errHalted answers the entries raft hands the state machine after it
// stopped.
var errHalted = errors.New("this node stopped applying the log at an entry it cannot decode")

// UndecodableEntryError is New's error for a node that stopped at a log
// entry it cannot decode: restarting it would stop it there again.
type UndecodableEntryError struct {
	Index, Term uint64
	Err         error
}

func (e *UndecodableEntryError) Error() string {
	return fmt.Sprintf("log entry %d (term %d) cannot be decoded (%v): this node stopped there and would stop there again; "+
		"to apply it as a no-op, list its index in SkipUndecodableEntries on every node that stopped at it", e.Index, e.Term, e.Err)
}

func (e *UndecodableEntryError) Unwrap() error { return e.Err }

// entryGuard is the node's side of an undecodable entry: the state
// machine's Fatal and SkipUndecodable hooks, the record in the stable
// store, and the start-up check.
type entryGuard struct {
	log     *slog.Logger
	skip    []uint64
	skipped prometheus.Counter

	mu     sync.Mutex
	stable raft.StableStore // set once the stores are open

	halted atomic.Pointer[raftfsm.UndecodableError]
	failed chan struct{}
	once   sync.Once
}

func newEntryGuard(log *slog.Logger, skip []uint64, reg prometheus.Registerer) *entryGuard {
	g := &entryGuard{log: log, skip: slices.Clone(skip), failed: make(chan struct{}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvdir_raft_skipped_entries_total",
			Help: "Undecodable log entries applied as no-ops because SkipUndecodableEntries listed them.",
		})}
	if err := reg.Register(g.skipped); err != nil {
		log.Warn("register kvdir_raft_skipped_entries_total", "err", err)
	}
	return g
}

// skipUndecodable is the state machine's SkipUndecodable hook.
func (g *entryGuard) skipUndecodable(index uint64, _ error) bool {
	if !slices.Contains(g.skip, index) {
		return false
	}
	g.skipped.Inc() // the state machine logs it
	g.mark(index, 0)
	return true
}

// fatal is the state machine's Fatal hook: it stops the state machine,
// records the entry and tells the node's owner.
func (g *entryGuard) fatal(err error) {
	var ue *raftfsm.UndecodableError
	if !errors.As(err, &ue) {
		ue = &raftfsm.UndecodableError{Err: err}
	}
	g.once.Do(func() {
		g.halted.Store(ue)
		g.log.Error("stopped applying the log: an entry cannot be decoded; this node's state stays as it was before it",
			"index", ue.Index, "term", ue.Term, "err", ue.Err)
		g.mark(0, ue.Index)
		close(g.failed)
	})
}

// mark sets the record of the entry the node stopped at to index (0:
// none); with from non-zero, only if the record holds from.
func (g *entryGuard) mark(from, index uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stable == nil {
		return
	}
	if from != 0 {
		if cur, err := readMark(g.stable); err != nil || cur != from {
			return
		}
	}
	if err := g.stable.SetUint64(stableKeyUndecodable, index); err != nil {
		g.log.Error("record the undecodable log entry", "index", index, "err", err)
	}
}

func readMark(stable raft.StableStore) (uint64, error) {
	v, err := stable.GetUint64(stableKeyUndecodable)
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return 0, nil
	}
	return v, err
}

// check runs at start, before Raft: it refuses to start on a recorded
// entry that still cannot be decoded and is not to be skipped.
func (g *entryGuard) check(logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore) error {
	g.mu.Lock()
	g.stable = stable
	g.mu.Unlock()
	if len(g.skip) > 0 {
		var snapIndex uint64
		if metas, err := snaps.List(); err == nil && len(metas) > 0 {
			snapIndex = metas[0].Index
		}
		for _, i := range g.skip {
			if i <= snapIndex {
				g.log.Info("a log entry to skip is older than the latest snapshot: it will not be applied again and its SkipUndecodableEntries item can go", "index", i, "snapshot_index", snapIndex)
			} else {
				g.log.Warn("an undecodable log entry at this index will be applied as a no-op (SkipUndecodableEntries)", "index", i)
			}
		}
	}
	idx, err := readMark(stable)
	if err != nil {
		return fmt.Errorf("node: read the undecodable-entry record: %w", err)
	}
	if idx == 0 || slices.Contains(g.skip, idx) {
		return nil
	}
	var l raft.Log
	if err := logs.GetLog(idx, &l); err != nil {
		g.log.Info("the log entry this node stopped at is no longer in its log; starting", "index", idx, "err", err)
		return g.clear(stable)
	}
	if l.Type != raft.LogCommand {
		return g.clear(stable)
	}
	if _, err := raftfsm.Decode(l.Data); err != nil {
		return &UndecodableEntryError{Index: idx, Term: l.Term, Err: err}
	}
	g.log.Info("this build decodes the log entry the node stopped at; starting", "index", idx)
	return g.clear(stable)
}

func (g *entryGuard) clear(stable raft.StableStore) error {
	if err := stable.SetUint64(stableKeyUndecodable, 0); err != nil {
		return fmt.Errorf("node: clear the undecodable-entry record: %w", err)
	}
	return nil
}

// guardedFSM is the state machine as Raft sees it: once it has stopped at
// an undecodable entry it applies nothing more and takes no snapshot (its
// state is older than what Raft counts as applied), until the node stops.
type guardedFSM struct {
	*raftfsm.FSM
	g *entryGuard
}

var _ raft.BatchingFSM = guardedFSM{}

func (f guardedFSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f guardedFSM) ApplyBatch(logs []*raft.Log) []any {
	if f.g.halted.Load() == nil {
		return f.FSM.ApplyBatch(logs)
	}
	out := make([]any, len(logs))
	for i := range out {
		out[i] = errHalted
	}
	return out
}

func (f guardedFSM) Snapshot() (raft.FSMSnapshot, error) {
	if f.g.halted.Load() != nil {
		return nil, errHalted
	}
	return f.FSM.Snapshot()
}

// Failed is closed when the node has stopped applying the log at an entry
// it cannot decode; Err then says which. The node keeps running (Status
// answers, reads are refused) until it is shut down.
func (n *Node) Failed() <-chan struct{} { return n.guard.failed }

// Err is the entry the node stopped at, as an *UndecodableEntryError, or
// nil.
func (n *Node) Err() error {
	if e := n.guard.halted.Load(); e != nil {
		return &UndecodableEntryError{Index: e.Index, Term: e.Term, Err: e.Err}
	}
	return nil
}
