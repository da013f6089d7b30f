package raftfsm

import (
	"math"

	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// A worker's block quota is enforced by every replica as it applies a
// batch (fitQuota). A worker flooding past its quota would still make every
// node decode, log, replicate and apply the blocks that are then dropped,
// and the garbage of that keeps the nodes' memory high. So the leader also
// cuts, before proposing, the blocks its applied state already shows past
// the quota (CutOverQuota), and the command carries how many it cut
// (PublishCommand.quota_cut), which every replica counts as dropped. The
// leader's cut only removes blocks that are past the quota whatever the
// entries still in flight do: it counts blocks those entries may remove as
// room (the caller's freed), cuts nothing for a batch of an epoch its state
// has not seen, and the replicas check what it kept against the quota again.
// (The one change it cannot bound is the index evicting detached blocks of
// the worker's to stay under its orphan limit; blocks cut then are counted
// as dropped like the others.)

// quotaMark is what the leader needs to cut a worker's blocks without
// taking the state lock: the epoch in which the worker went over its quota,
// and the quota.
type quotaMark struct {
	epoch, quota uint64
}

// markOverQuota records that worker w dropped blocks past its quota (f.mu
// held).
func (f *FSM) markOverQuota(w *kvdirv1.Worker) {
	m := quotaMark{epoch: w.Epoch, quota: w.BlockQuota}
	if old, ok := f.overQuota.Load(w.Spec.Id); !ok || old.(quotaMark) != m {
		f.overQuota.Store(w.Spec.Id, m)
	}
}

// remarkOverQuota rebuilds the marks from the state (f.mu held), after a
// restore.
func (f *FSM) remarkOverQuota() {
	f.overQuota.Clear()
	for _, w := range f.st.workers {
		if alive(w) && w.BlockQuota > 0 && w.DroppedBlocks > 0 {
			f.markOverQuota(w)
		}
	}
}

// CutOverQuota cuts from b's stored events the blocks that are past the
// worker's block quota by the applied state, and returns how many it cut,
// for PublishCommand.quota_cut. It looks only at a worker that already
// dropped blocks in b's epoch, so one under its quota costs a map lookup;
// for one that did, it asks freed, which says whether the caller may cut now
// and bounds the blocks the entries proposed before b and not yet applied
// may remove from the worker (Frees of their batches; math.MaxUint64 if one
// clears it): they count as room. The stored events stay (possibly empty),
// so that b's sequence range keeps its meaning.
//
// Only the leader calls it, for a batch CheckBatch accepted, and only once
// every entry of earlier terms is applied: the applied state is then what
// the log will hold when b applies, but for the entries it proposed since.
func (f *FSM) CutOverQuota(b *kvdirv1.EventBatch, freed func(worker string) (uint64, bool)) uint64 {
	room, ok := f.quotaRoom(b.WorkerId, b.Epoch)
	if !ok {
		return 0
	}
	fr, ok := freed(b.WorkerId)
	if !ok {
		return 0
	}
	room = satAdd(room, fr)
	var cut uint64
	for _, ev := range b.Events {
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Stored:
			if n := uint64(len(k.Stored.Hashes)); n > room {
				cut += n - room
				k.Stored.Hashes = k.Stored.Hashes[:room:room]
				if room == 0 {
					k.Stored.Hashes = nil
				}
			}
		case *kvdirv1.Event_Removed:
			room = satAdd(room, uint64(len(k.Removed.Hashes)))
		case *kvdirv1.Event_Cleared:
			room = math.MaxUint64
		}
	}
	return cut
}

// Frees bounds what b may remove from its worker when it applies: the
// blocks its removed events name, and whether it clears the worker (then
// it may free any number).
func Frees(b *kvdirv1.EventBatch) (blocks uint64, clears bool) {
	for _, ev := range b.Events {
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Removed:
			blocks += uint64(len(k.Removed.Hashes))
		case *kvdirv1.Event_Cleared:
			clears = true
		}
	}
	return blocks, clears
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// fitQuota cuts a stored piece to the room the worker's quota leaves (the
// piece is a chain, so its head is what may be kept). Blocks the worker
// already holds count against the room too, which keeps this one lookup.
func fitQuota(x *radix.Index, worker string, quota uint64, hashes []uint64) []uint64 {
	var have uint64
	if ws, ok := x.Worker(worker); ok {
		have = uint64(ws.Blocks)
	}
	if have >= quota {
		return nil
	}
	if room := quota - have; uint64(len(hashes)) > room {
		return hashes[:room]
	}
	return hashes
}

// quotaRoom is the room CutOverQuota starts from: the quota less the
// blocks the worker holds, if it went over its quota in epoch.
func (f *FSM) quotaRoom(worker string, epoch uint64) (uint64, bool) {
	v, ok := f.overQuota.Load(worker)
	if !ok || v.(quotaMark).epoch != epoch {
		return 0, false
	}
	quota := v.(quotaMark).quota
	var have uint64
	if ws, ok := f.index.Load().Worker(worker); ok {
		have = uint64(ws.Blocks)
	}
	return quota - min(have, quota), true
}
