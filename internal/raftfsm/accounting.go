package raftfsm

import (
	"github.com/kvdir/kvdir/internal/cachecheck"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// account counts a session record into its worker's cache accounting (see
// internal/cachecheck): records that carry the router's prediction, for a
// worker that is alive. Whether the directory holds blocks of the worker is
// read from the replicated index as of this command, so every replica
// counts the same. The accounting is part of the worker record, so the
// state digest covers it; the index digest, which covers blocks only, does
// not.
func (f *FSM) account(r *kvdirv1.SessionRecord) {
	if r.PredictedCachedTokens == nil {
		return // a router that predates the field
	}
	w := f.st.workers[r.WorkerId]
	if w == nil || !alive(w) {
		return
	}
	ws, _ := f.st.index.Worker(r.WorkerId)
	if w.CacheAccounting == nil {
		w.CacheAccounting = &kvdirv1.CacheAccounting{}
	}
	cachecheck.Add(w.CacheAccounting, cachecheck.Turn{
		Predicted: int(r.GetPredictedCachedTokens()), Reported: int(r.CachedTokens),
		BlockSize: int(r.BlockSize), RegisteredBlockSize: engineBlockSize(w, r.BlockSize),
		DirHoldsBlocks: ws.Blocks > 0, ModelDiffers: r.ModelDiffers, Salted: r.Salted,
	})
	cachecheck.Decay(w.CacheAccounting)
}
