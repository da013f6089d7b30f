package radix

import (
	"slices"
	"strings"
	"unsafe"
)

// Stats are the index's global counters.
type Stats struct {
	Workers int // workers with a slot
	// Blocks is the number of distinct blocks some worker holds.
	Blocks int64
	// Entries is the number of (block, worker) pairs, whatever the medium.
	Entries int64
	// StoredBlocks counts every block in the structure, including unheld
	// blocks kept inside a run and detached blocks.
	StoredBlocks int64
	// OrphanBlocks counts blocks in detached (out-of-order) pieces.
	OrphanBlocks int64
	// DroppedOrphanBlocks counts detached blocks dropped over the limit.
	DroppedOrphanBlocks int64
	Segments            int
	// ApproxBytes estimates the index's memory: segment arrays at their
	// capacity plus the hash table.
	ApproxBytes int64
	// HolderSets is the number of distinct holder sets (sets of workers
	// holding a block on a medium) the index stores.
	HolderSets int
}

// Stats returns the global counters.
func (x *Index) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	st := Stats{
		Blocks:              x.heldBlocks,
		Entries:             x.entries,
		StoredBlocks:        int64(x.locs.Len()),
		OrphanBlocks:        x.orphanBlocks,
		DroppedOrphanBlocks: x.dropped,
		HolderSets:          x.hs.live,
	}
	for _, w := range x.workers {
		if w != nil {
			st.Workers++
		}
	}
	const segSize = int64(unsafe.Sizeof(segment{})) + 8
	for _, s := range x.segs {
		if s == nil {
			continue
		}
		st.Segments++
		st.ApproxBytes += segSize + int64(cap(s.hashes))*8 + int64(cap(s.children))*4
		for _, ids := range s.sets {
			st.ApproxBytes += int64(cap(ids)) * 4
		}
	}
	st.ApproxBytes += x.hs.bytes()
	for i := range x.locs.shards {
		st.ApproxBytes += int64(len(x.locs.shards[i].slots)) * int64(unsafe.Sizeof(tableSlot{}))
	}
	return st
}

// WorkerStats is what one worker holds.
type WorkerStats struct {
	Worker string
	// Blocks is the number of blocks the worker holds on some medium.
	Blocks int64
	// Media[m] is the number of blocks it holds on medium m.
	Media [NumMedia]int64
}

// Worker returns one worker's counts; false if the index does not know it.
func (x *Index) Worker(name string) (WorkerStats, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.byName[name]
	if !ok {
		return WorkerStats{}, false
	}
	return x.workers[slot].stats(), true
}

// Workers returns every known worker's counts, sorted by name.
func (x *Index) Workers() []WorkerStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]WorkerStats, 0, len(x.byName))
	for _, w := range x.workers {
		if w != nil {
			out = append(out, w.stats())
		}
	}
	slices.SortFunc(out, func(a, b WorkerStats) int { return strings.Compare(a.Worker, b.Worker) })
	return out
}

func (w *worker) stats() WorkerStats {
	return WorkerStats{Worker: w.name, Blocks: w.entries, Media: w.media}
}

// Chain is a chain a worker holds from the root: Tail is its last block, Depth
// its length in blocks.
type Chain struct {
	Tail  uint64
	Depth int
}

// WorkerChains returns the longest chains (at most limit; all if limit <= 0)
// that the worker holds unbroken from the root, each ending at a block that
// the worker holds no continuation of. Longest first, ties by tail hash. It
// walks the whole structure: for inspection, not for the request path.
func (x *Index) WorkerChains(name string, limit int) []Chain {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.byName[name]
	if !ok {
		return nil
	}
	holds := func(s *segment, o int) bool {
		held, _ := x.heldBy(s, o, slot)
		return held
	}
	type frame struct {
		id    int32
		depth int // held depth at the segment's parent block
	}
	var out []Chain
	var stack []frame
	for id, s := range x.segs {
		if s != nil && s.parent == parentRoot && holds(s, 0) {
			stack = append(stack, frame{int32(id), 0})
		}
	}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		s := x.segs[f.id]
		end := 0 // the worker holds s.hashes[:end], unbroken from the root
		for end < len(s.hashes) && holds(s, end) {
			end++
		}
		tail := true
		for _, c := range s.children {
			cs := x.segs[c]
			if o := int(cs.parentOff); o < end && holds(cs, 0) {
				stack = append(stack, frame{c, f.depth + o + 1})
				tail = tail && o != end-1
			}
		}
		if tail {
			out = append(out, Chain{Tail: s.hashes[end-1], Depth: f.depth + end})
		}
	}
	slices.SortFunc(out, func(a, b Chain) int {
		if a.Depth != b.Depth {
			return b.Depth - a.Depth
		}
		switch {
		case a.Tail < b.Tail:
			return -1
		case a.Tail > b.Tail:
			return 1
		}
		return 0
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// ChainTo returns the chain from the root to tail, first block first, by
// following parent links; false if tail is unknown or not connected to the
// root, or the chain is longer than the index's MaxChain.
func (x *Index) ChainTo(tail uint64) ([]uint64, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	l, ok := x.locs.Get(tail)
	if !ok || x.segs[l.seg()].orphan {
		return nil, false
	}
	var chain []uint64
	s, o := x.segs[l.seg()], l.off()
	for {
		if len(chain)+o+1 > x.opts.MaxChain {
			return nil, false
		}
		for i := o; i >= 0; i-- {
			chain = append(chain, s.hashes[i])
		}
		if s.parent < 0 {
			break
		}
		s, o = x.segs[s.parent], int(s.parentOff)
	}
	slices.Reverse(chain)
	return chain, true
}
