// Package raftfsm is the directory's replicated state machine: the commands
// that go through the Raft log, how each is applied to the state (the
// block-prefix index, the worker registry and the session table), and the
// snapshots that compact the log.
//
// Apply is deterministic: it reads no clock (the proposer's time travels in
// the command envelope), draws no random numbers and never lets map order
// reach a result, so every node that applies the same log holds the same
// state. A command that cannot be decoded stops the node (Options.Fatal)
// unless the node was told to skip that very entry (Options.SkipUndecodable);
// a domain refusal (unknown worker, stale epoch, sequence gap, invalid
// input) is the command's result, the same on every node.
package raftfsm

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Domain refusals, returned (wrapped) as Apply's result.
var (
	ErrInvalid       = errors.New("invalid command")
	ErrUnknownWorker = errors.New("unknown worker")
	ErrStaleEpoch    = errors.New("stale epoch")
	ErrTooMany       = errors.New("limit reached")
	// ErrNotOwner refuses a registration of a live worker that another
	// agent credential owns.
	ErrNotOwner = errors.New("owned by another credential")
)

// Options bound the state machine. Zero fields take the defaults.
type Options struct {
	Index radix.Options
	// MaxBatchEvents and MaxBatchBlocks bound one event batch.
	MaxBatchEvents int // default 65,536
	MaxBatchBlocks int // default 1,048,576
	// MaxSessions bounds the session table; the least recently recorded
	// sessions go first (default 1,000,000).
	MaxSessions int
	// MaxGoneWorkers bounds the records kept of expired and deregistered
	// workers (default 1,024).
	MaxGoneWorkers int
	// Fatal is called when a command cannot be decoded and is not skipped,
	// with an *UndecodableError (default: panic, which stops the node). If
	// it returns, ApplyBatch returns at once, leaving that entry and the
	// rest of the batch unapplied: the caller must apply nothing more to
	// this state (restoring a snapshot replaces it).
	Fatal func(error)
	// SkipUndecodable, if set, is asked about a command entry that cannot
	// be decoded, before Fatal. When it answers true the entry is applied
	// as a no-op: the applied index moves past it, its result is an error
	// wrapping ErrSkipped, and OnApplied sees it as an ignorable empty
	// command. Every replica must answer the same for the same index (an
	// operator's list of indexes, given to every node), or their states
	// diverge.
	SkipUndecodable func(index uint64, err error) bool
	// OnWorkersChanged, if set, is called after a command changed workers'
	// state, with their ids and the command's log index. It runs on the
	// apply path and must not block.
	OnWorkersChanged func(ids []string, index uint64)
	// OnApplied, if set, is called after ApplyBatch applied its command
	// entries, with those entries in log order (not called when there are
	// none). It runs on the apply path, must not block and must not modify
	// the entries.
	OnApplied func(logs []*raft.Log)
	// OnRestored, if set, is called after Restore replaced the state, with
	// the applied index of the snapshot. It runs on the apply path and must
	// not block.
	OnRestored func(applied uint64)
	// Metrics, if set, receives apply timings and event counts.
	Metrics *Metrics
	Logger  *slog.Logger
}

// Default limits.
const (
	DefaultMaxBatchEvents = 1 << 16
	DefaultMaxBatchBlocks = 1 << 20
	DefaultMaxSessions    = 1_000_000
	DefaultMaxGoneWorkers = 1024
	maxIDLen              = 256
	maxAddressLen         = 2048
	maxModelLen           = 1024
	maxLabels             = 64
	// maxDataParallelRank bounds WorkerSpec.data_parallel_rank (the agent
	// runs at most 256 ranks behind one server).
	maxDataParallelRank = 255
)

func (o Options) withDefaults() Options {
	if o.MaxBatchEvents <= 0 {
		o.MaxBatchEvents = DefaultMaxBatchEvents
	}
	if o.MaxBatchBlocks <= 0 {
		o.MaxBatchBlocks = DefaultMaxBatchBlocks
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxGoneWorkers <= 0 {
		o.MaxGoneWorkers = DefaultMaxGoneWorkers
	}
	if o.Fatal == nil {
		o.Fatal = func(err error) { panic(err) }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// state is everything a snapshot holds. Restore builds a new one and swaps
// it in whole.
type state struct {
	index    *radix.Index
	workers  map[string]*kvdirv1.Worker
	sessions *sessionTable
	members  map[string]string // Raft server id -> API address
	// epochFloor is the highest epoch of any worker record pruned so far:
	// an id registered without a record starts above it, so that no id's
	// epoch ever restarts (a fenced incarnation stays fenced) however many
	// records were pruned, in one number.
	epochFloor uint64
	// alive counts the workers records that are active or draining, so
	// that a registration checks the worker limit without a scan of every
	// record (pools reach tens of thousands of workers).
	alive int
}

// countAlive recounts st.alive from the worker records.
func (st *state) countAlive() {
	st.alive = 0
	for _, w := range st.workers {
		if alive(w) {
			st.alive++
		}
	}
}

func newState(opts Options) *state {
	return &state{
		index:    radix.New(opts.Index),
		workers:  make(map[string]*kvdirv1.Worker),
		sessions: newSessionTable(),
		members:  make(map[string]string),
	}
}

// FSM is the state machine. It implements raft.FSM and raft.BatchingFSM.
type FSM struct {
	opts Options

	mu      sync.RWMutex // guards st's maps (the index locks itself)
	st      *state
	index   atomic.Pointer[radix.Index] // st.index, for reads that need no map
	applied atomic.Uint64
	// overQuota maps the id of each live worker that dropped blocks past
	// its quota in its current epoch to a quotaMark (see quota.go); read
	// without mu by CutOverQuota.
	overQuota sync.Map
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.BatchingFSM = (*FSM)(nil)
)

// New returns an empty state machine.
func New(opts Options) *FSM {
	opts = opts.withDefaults()
	f := &FSM{opts: opts, st: newState(opts)}
	f.index.Store(f.st.index)
	return f
}

// AppliedIndex is the log index of the last command applied.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

// Apply applies one log entry and returns its result: a *RegisterResult,
// *PublishResult, nil, or an error for a domain refusal.
func (f *FSM) Apply(l *raft.Log) any {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies log entries in order, one result per entry.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	var changed []string
	var applied []*raft.Log // command entries, for OnApplied
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		start := time.Now()
		d, err := Decode(l.Data)
		if err != nil {
			if f.opts.SkipUndecodable != nil && f.opts.SkipUndecodable(l.Index, err) {
				f.opts.Logger.Warn("skipped an undecodable log entry as told", "index", l.Index, "term", l.Term, "err", err)
				f.mu.Lock()
				f.applied.Store(l.Index)
				f.mu.Unlock()
				out[i] = fmt.Errorf("log index %d: %w: %w", l.Index, ErrSkipped, err)
				if f.opts.OnApplied != nil {
					applied = append(applied, &raft.Log{Index: l.Index, Term: l.Term, Type: raft.LogCommand, Data: skippedEntry, AppendedAt: l.AppendedAt})
				}
				continue
			}
			f.opts.Logger.Error("stopping: cannot apply log entry", "index", l.Index, "term", l.Term, "err", err)
			f.opts.Fatal(&UndecodableError{Index: l.Index, Term: l.Term, Err: err})
			return out // reached only with a Fatal that returns
		}
		// The lock is taken per entry, so that reads of the registry wait
		// behind one command at most (matches do not take it at all).
		f.mu.Lock()
		var ids []string
		out[i], ids = f.apply(d, l.Index)
		f.applied.Store(l.Index)
		f.mu.Unlock()
		changed = append(changed, ids...)
		if f.opts.OnApplied != nil {
			applied = append(applied, l)
		}
		f.opts.Metrics.applied(d.Type, time.Since(start))
	}
	if len(applied) > 0 {
		f.opts.OnApplied(applied)
	}
	if len(changed) > 0 && f.opts.OnWorkersChanged != nil {
		slices.Sort(changed)
		f.opts.OnWorkersChanged(slices.Compact(changed), logs[len(logs)-1].Index)
	}
	return out
}

// apply runs one decoded command under f.mu and returns its result and the
// ids of workers whose state changed.
func (f *FSM) apply(d Decoded, index uint64) (any, []string) {
	st := f.st
	switch c := d.Payload.(type) {
	case nil:
		return nil, nil // an ignorable command of a type this build does not know
	case *kvdirv1.RegisterCommand:
		return f.register(c, index)
	case *kvdirv1.PublishCommand:
		res := &PublishResult{Responses: make([]*kvdirv1.PublishResponse, len(c.Batches))}
		var ids []string
		for i, b := range c.Batches {
			var layoutChanged bool
			var cut uint64
			if i < len(c.QuotaCut) {
				cut = c.QuotaCut[i]
			}
			res.Responses[i], layoutChanged = f.publish(b, cut, index)
			if layoutChanged {
				ids = append(ids, b.WorkerId)
			}
		}
		return res, ids
	case *kvdirv1.LoadsCommand:
		var ids []string
		for _, wl := range c.Loads {
			if w := st.workers[wl.WorkerId]; w != nil && w.Epoch == wl.Epoch && alive(w) {
				w.Load = wl.Load
				w.LoadTimeUnixNano = d.TimeUnixNano
				ids = append(ids, wl.WorkerId)
			}
		}
		return nil, ids
	case *kvdirv1.ExpireWorkerCommand:
		return f.retire(c.WorkerId, c.Epoch, kvdirv1.WorkerState_WORKER_STATE_EXPIRED, index)
	case *kvdirv1.DeregisterCommand:
		return f.retire(c.WorkerId, c.Epoch, kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED, index)
	case *kvdirv1.DrainCommand:
		w := st.workers[c.WorkerId]
		if w == nil || !alive(w) {
			return fmt.Errorf("drain %q: %w", c.WorkerId, ErrUnknownWorker), nil
		}
		w.State = kvdirv1.WorkerState_WORKER_STATE_DRAINING
		return nil, []string{c.WorkerId}
	case *kvdirv1.RecordSessionsCommand:
		for _, s := range c.Sessions {
			if err := validSession(s); err != nil {
				return err, nil // the whole batch is refused
			}
		}
		for _, s := range c.Sessions {
			r := proto.Clone(s).(*kvdirv1.SessionRecord)
			r.TimeUnixNano = d.TimeUnixNano
			st.sessions.put(r)
			f.account(r)
		}
		st.sessions.evictOver(f.opts.MaxSessions)
		return nil, nil
	case *kvdirv1.ExpireSessionsCommand:
		st.sessions.expireBefore(c.BeforeUnixNano)
		return nil, nil
	case *kvdirv1.MemberAPICommand:
		if c.Id == "" || len(c.Id) > maxIDLen || len(c.ApiAddress) > maxIDLen {
			return fmt.Errorf("member api: %w: id %q", ErrInvalid, c.Id), nil
		}
		st.members[c.Id] = c.ApiAddress
		return nil, nil
	default:
		// Decode only returns the types above.
		return fmt.Errorf("%w: unhandled command %T", ErrInvalid, c), nil
	}
}

// RegisterResult is the result of a registration.
type RegisterResult struct {
	Epoch uint64
}

// PublishResult holds one response per batch of a publish command.
type PublishResult struct {
	Responses []*kvdirv1.PublishResponse
}

func alive(w *kvdirv1.Worker) bool {
	return w.State == kvdirv1.WorkerState_WORKER_STATE_ACTIVE || w.State == kvdirv1.WorkerState_WORKER_STATE_DRAINING
}

// CheckWorkerSpec returns the error, wrapping ErrInvalid, with which a
// registration of spec is refused whatever the state: an empty or
// over-long id, an over-long address, model or label, too many labels, a
// block size or data-parallel rank out of range. The node checks it before
// proposing, so that such a registration never reaches the log.
func CheckWorkerSpec(spec *kvdirv1.WorkerSpec) error {
	switch {
	case spec == nil || spec.Id == "" || len(spec.Id) > maxIDLen:
		return fmt.Errorf("register: %w: worker id must be 1 to %d bytes", ErrInvalid, maxIDLen)
	case spec.BlockSize > 1<<16:
		// 0 is "not told": the block sizes come with the worker's events.
		return fmt.Errorf("register %q: %w: block size %d not in [0, 65536]", spec.Id, ErrInvalid, spec.BlockSize)
	case len(spec.Address) > maxAddressLen:
		return fmt.Errorf("register %q: %w: address of %d bytes, limit %d", spec.Id, ErrInvalid, len(spec.Address), maxAddressLen)
	case len(spec.Model) > maxModelLen:
		return fmt.Errorf("register %q: %w: model name of %d bytes, limit %d", spec.Id, ErrInvalid, len(spec.Model), maxModelLen)
	case len(spec.Labels) > maxLabels:
		return fmt.Errorf("register %q: %w: %d labels, limit %d", spec.Id, ErrInvalid, len(spec.Labels), maxLabels)
	case spec.DataParallelRank != nil && *spec.DataParallelRank > maxDataParallelRank:
		return fmt.Errorf("register %q: %w: data-parallel rank %d not in [0, %d]", spec.Id, ErrInvalid, *spec.DataParallelRank, maxDataParallelRank)
	}
	for k, v := range spec.Labels {
		if len(k) > maxIDLen || len(v) > maxIDLen {
			// Which label is named may differ between nodes (map order);
			// the refusal itself is the same everywhere.
			return fmt.Errorf("register %q: %w: label keys and values are limited to %d bytes", spec.Id, ErrInvalid, maxIDLen)
		}
	}
	return nil
}

func (f *FSM) register(c *kvdirv1.RegisterCommand, index uint64) (any, []string) {
	spec := c.Worker
	if err := CheckWorkerSpec(spec); err != nil {
		return err, nil
	}
	st := f.st
	w := st.workers[spec.Id]
	live := w != nil && alive(w)
	owner := c.Owner
	switch {
	case live && w.Owner != "" && w.Owner != c.Owner && !c.Override:
		return fmt.Errorf("register %q: %w: it is live and owned by credential %q; credential %q may not take it over",
			spec.Id, ErrNotOwner, w.Owner, c.Owner), nil
	case live && c.Override:
		owner = w.Owner // an administrator acts for the owner, who keeps it
	}
	if !live && st.alive >= st.index.Options().MaxWorkers {
		return fmt.Errorf("register %q: %w: %d workers", spec.Id, ErrTooMany, st.index.Options().MaxWorkers), nil
	}
	if lim := int(c.MaxOwnerWorkers); lim > 0 && owner != "" && !(live && w.Owner == owner) && f.countOwned(owner) >= lim {
		return fmt.Errorf("register %q: %w: credential %q already owns %d live workers", spec.Id, ErrTooMany, owner, lim), nil
	}
	epoch := st.epochFloor + 1
	if w != nil {
		epoch = max(w.Epoch+1, epoch)
	}
	st.index.ClearWorker(spec.Id)
	f.overQuota.Delete(spec.Id)
	if !live {
		st.alive++
	}
	st.workers[spec.Id] = &kvdirv1.Worker{
		Spec:            proto.Clone(spec).(*kvdirv1.WorkerSpec),
		State:           kvdirv1.WorkerState_WORKER_STATE_ACTIVE,
		Epoch:           epoch,
		RegisteredIndex: index,
		Owner:           owner,
		TokenHash:       slices.Clone(c.TokenHash),
		BlockQuota:      c.BlockQuota,
	}
	f.pruneGone()
	return &RegisterResult{Epoch: epoch}, []string{spec.Id}
}

// countOwned counts the live workers owner registered.
func (f *FSM) countOwned(owner string) int {
	n := 0
	for _, w := range f.st.workers {
		if alive(w) && w.Owner == owner {
			n++
		}
	}
	return n
}

// pruneGone forgets the records of gone workers over the bound, those that
// went gone earliest first, raising the epoch floor to their epochs. A
// worker registered long ago that went gone a moment ago is kept over one
// that went gone long ago. The order depends only on the log (indexes, then
// ids), so every replica forgets the same records.
func (f *FSM) pruneGone() {
	if len(f.st.workers)-f.st.alive <= f.opts.MaxGoneWorkers {
		return
	}
	var gone []*kvdirv1.Worker
	for _, w := range f.st.workers {
		if !alive(w) {
			gone = append(gone, w)
		}
	}
	if len(gone) <= f.opts.MaxGoneWorkers {
		return
	}
	slices.SortFunc(gone, func(a, b *kvdirv1.Worker) int {
		return cmp.Or(cmp.Compare(goneAt(a), goneAt(b)), strings.Compare(a.Spec.Id, b.Spec.Id))
	})
	for _, w := range gone[:len(gone)-f.opts.MaxGoneWorkers] {
		f.st.epochFloor = max(f.st.epochFloor, w.Epoch)
		delete(f.st.workers, w.Spec.Id)
	}
}

// goneAt is the log index at which a gone worker went gone, for pruning. A
// record restored from a snapshot of a build that did not record it
// (GoneIndex 0) counts as gone at its registration: it went gone between
// that and the snapshot, before any worker retired since, and such records
// keep the registration order among themselves that those builds pruned in.
func goneAt(w *kvdirv1.Worker) uint64 {
	if w.GoneIndex != 0 {
		return w.GoneIndex
	}
	return w.RegisteredIndex
}

// retire expires or deregisters a worker at epoch and removes its blocks;
// index is the log index of the command, recorded as when it went gone.
func (f *FSM) retire(id string, epoch uint64, to kvdirv1.WorkerState, index uint64) (any, []string) {
	w := f.st.workers[id]
	switch {
	case w == nil || !alive(w):
		return fmt.Errorf("%v %q: %w", to, id, ErrUnknownWorker), nil
	case w.Epoch != epoch:
		return fmt.Errorf("%v %q: %w: epoch %d, current %d", to, id, ErrStaleEpoch, epoch, w.Epoch), nil
	}
	f.st.index.ClearWorker(id)
	f.overQuota.Delete(id)
	w.State = to
	w.GoneIndex = index
	f.st.alive--
	w.Load = nil
	f.pruneGone()
	return nil, []string{id}
}

func validSession(s *kvdirv1.SessionRecord) error {
	switch {
	case s.SessionId == "" || len(s.SessionId) > maxIDLen:
		return fmt.Errorf("record session: %w: session id must be 1 to %d bytes", ErrInvalid, maxIDLen)
	case len(s.WorkerId) > maxIDLen:
		return fmt.Errorf("record session %q: %w: worker id too long", s.SessionId, ErrInvalid)
	}
	return nil
}

// Snapshot captures the state; Persist then streams it (see snapshot.go).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.capture()
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st, applied, err := readState(rc, f.opts)
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	f.mu.Lock()
	f.st = st
	f.index.Store(st.index)
	f.applied.Store(applied)
	f.remarkOverQuota()
	f.mu.Unlock()
	if f.opts.OnRestored != nil {
		f.opts.OnRestored(applied)
	}
	if f.opts.OnWorkersChanged != nil {
		f.opts.OnWorkersChanged(nil, applied)
	}
	return nil
}
