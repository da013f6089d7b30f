package raftfsm

import (
	"slices"
	"strings"

	"github.com/zeebo/xxh3"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Reads are served from the local state. Reads of the registry and the
// sessions take the state lock, which a command holds while it applies;
// reads of the index go straight to it (it has its own lock, which a writer
// releases every few hundred blocks), so matches never wait behind a whole
// command.

// Match returns each worker's matched depth of chain and the applied index
// the answer reflects (a lower bound: later commands may be visible).
func (f *FSM) Match(dst []radix.WorkerMatch, chain []uint64) ([]radix.WorkerMatch, uint64, error) {
	applied := f.applied.Load()
	m, err := f.index.Load().MatchInto(dst, chain)
	return m, applied, err
}

// Worker returns a copy of a worker's record with its block counts; false if
// unknown.
func (f *FSM) Worker(id string) (*kvdirv1.Worker, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	w := f.st.workers[id]
	if w == nil {
		return nil, false
	}
	return f.withCounts(w), true
}

// Workers returns copies of the workers serving model (all if empty), alive
// ones only unless includeGone, sorted by id.
func (f *FSM) Workers(model string, includeGone bool) []*kvdirv1.Worker {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []*kvdirv1.Worker
	for _, w := range f.st.workers {
		if (model == "" || w.Spec.Model == model) && (includeGone || alive(w)) {
			out = append(out, f.withCounts(w))
		}
	}
	slices.SortFunc(out, func(a, b *kvdirv1.Worker) int { return strings.Compare(a.Spec.Id, b.Spec.Id) })
	return out
}

// WorkerEpoch is a worker's id and current epoch.
type WorkerEpoch struct {
	ID    string
	Epoch uint64
}

// AliveEpochs appends to dst the id and epoch of every alive worker, in no
// order: what the leader's lease clocks need on every tick, without the
// copies and block counts of Workers (which hold the state's lock longer,
// delaying applies, the more workers there are).
func (f *FSM) AliveEpochs(dst []WorkerEpoch) []WorkerEpoch {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for id, w := range f.st.workers {
		if alive(w) {
			dst = append(dst, WorkerEpoch{ID: id, Epoch: w.Epoch})
		}
	}
	return dst
}

// WorkersByID returns copies of the named workers that exist.
func (f *FSM) WorkersByID(ids []string) []*kvdirv1.Worker {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []*kvdirv1.Worker
	for _, id := range ids {
		if w := f.st.workers[id]; w != nil {
			out = append(out, f.withCounts(w))
		}
	}
	return out
}

// withCounts copies a worker's record for a reader, with its block counts
// and without its token hash (which only the node's checks need).
func (f *FSM) withCounts(w *kvdirv1.Worker) *kvdirv1.Worker {
	c := proto.Clone(w).(*kvdirv1.Worker)
	c.TokenHash = nil
	if ws, ok := f.st.index.Worker(w.Spec.Id); ok {
		c.Blocks = uint64(ws.Blocks)
		c.GpuBlocks = uint64(ws.Media[radix.GPU])
		c.CpuBlocks = uint64(ws.Media[radix.CPU])
		c.DiskBlocks = uint64(ws.Media[radix.Disk])
		c.RemoteBlocks = uint64(ws.Media[radix.Remote])
	}
	return c
}

// WorkerAuth is what a node checks a worker's calls against.
type WorkerAuth struct {
	Epoch     uint64
	Alive     bool
	Owner     string
	TokenHash []byte
}

// WorkerAuth returns a worker's owner and token hash; false if unknown. It
// copies no more than that.
func (f *FSM) WorkerAuth(id string) (WorkerAuth, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	w := f.st.workers[id]
	if w == nil {
		return WorkerAuth{}, false
	}
	return WorkerAuth{Epoch: w.Epoch, Alive: alive(w), Owner: w.Owner, TokenHash: slices.Clone(w.TokenHash)}, true
}

// EpochFloor is the highest epoch of a pruned worker record (0 before any
// prune): an id registered without a record starts above it.
func (f *FSM) EpochFloor() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.epochFloor
}

// WorkerChains returns the longest chains a worker holds (see
// radix.Index.WorkerChains).
func (f *FSM) WorkerChains(id string, limit int) []radix.Chain {
	return f.index.Load().WorkerChains(id, limit)
}

// Session returns a copy of a session's record.
func (f *FSM) Session(id string) (*kvdirv1.SessionRecord, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	r, ok := f.st.sessions.get(id)
	if !ok {
		return nil, false
	}
	return proto.Clone(r).(*kvdirv1.SessionRecord), true
}

// Sessions returns copies of up to limit sessions under an id prefix (all
// if empty) that went to worker (any if empty), most recent first, and the
// number of sessions recorded in all.
func (f *FSM) Sessions(prefix, worker string, limit int) ([]*kvdirv1.SessionRecord, int) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	rs := f.st.sessions.withPrefix(prefix, worker, limit)
	out := make([]*kvdirv1.SessionRecord, len(rs))
	for i, r := range rs {
		out[i] = proto.Clone(r).(*kvdirv1.SessionRecord)
	}
	return out, f.st.sessions.len()
}

// SessionChain returns the chain of a session's last recorded turn, from
// the root to its tail; false if the index no longer connects it.
func (f *FSM) SessionChain(r *kvdirv1.SessionRecord) ([]uint64, bool) {
	return f.index.Load().ChainTo(r.Tail)
}

// Members returns the API address of each Raft member that published one.
func (f *FSM) Members() map[string]string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make(map[string]string, len(f.st.members))
	for k, v := range f.st.members {
		out[k] = v
	}
	return out
}

// MemberAPI returns one member's API address ("" if it published none).
func (f *FSM) MemberAPI(id string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.members[id]
}

// Counters are the state's sizes.
type Counters struct {
	radix.Stats
	Sessions int
}

// Counters returns the index's counters and the session count.
func (f *FSM) Counters() Counters {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Counters{Stats: f.st.index.Stats(), Sessions: f.st.sessions.len()}
}

// Digest combines the index digest with digests of the workers, sessions
// and members: equal on two nodes exactly when their states are equal (up
// to hash collisions), whatever order their records are stored in.
func (f *FSM) Digest() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.digestLocked()
}

// Digests returns Digest and IndexDigest with the applied index they
// describe, read together: no command is applied between them.
func (f *FSM) Digests() (state, index, applied uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.digestLocked(), f.index.Load().Digest(), f.applied.Load()
}

// digestLocked is Digest; f.mu is held.
func (f *FSM) digestLocked() uint64 {
	st := f.st
	h := xxh3.New()
	var b [8]byte
	put := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	put(st.index.Digest())
	put(st.sessions.digest)
	if st.epochFloor > 0 { // absent before any prune, as in older builds
		put(st.epochFloor)
	}
	ids := make([]string, 0, len(st.workers))
	for id := range st.workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		enc, _ := proto.MarshalOptions{Deterministic: true}.Marshal(st.workers[id])
		put(xxh3.Hash(enc))
	}
	members := make([]string, 0, len(st.members))
	for id := range st.members {
		members = append(members, id)
	}
	slices.Sort(members)
	for _, id := range members {
		h.WriteString(id)
		h.WriteString("\x00" + st.members[id] + "\x00")
	}
	return h.Sum64()
}

// IndexDigest is the block index's own digest.
func (f *FSM) IndexDigest() uint64 {
	return f.index.Load().Digest()
}

// WorkerMatchProto is m as the API answers it, with tokens counted in
// blocks of blockSize.
func WorkerMatchProto(m radix.WorkerMatch, blockSize uint32) *kvdirv1.WorkerMatch {
	return &kvdirv1.WorkerMatch{
		WorkerId:       m.Worker,
		Blocks:         uint32(m.Blocks),
		GpuBlocks:      uint32(m.Media[radix.GPU]),
		CpuBlocks:      uint32(m.Media[radix.CPU]),
		DiskBlocks:     uint32(m.Media[radix.Disk]),
		RemoteBlocks:   uint32(m.Media[radix.Remote]),
		Tokens:         uint64(m.Blocks) * uint64(blockSize),
		GpuOrCpuBlocks: uint32(m.GPUOrCPU),
	}
}
