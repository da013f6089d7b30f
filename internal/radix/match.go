package radix

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// WorkerMatch is how much of a chain one worker holds.
type WorkerMatch struct {
	Worker string
	// Blocks is the number of consecutive blocks from the chain's start that
	// the worker holds on some medium.
	Blocks int
	// Media[m] is the number of consecutive blocks from the chain's start
	// that the worker holds on medium m.
	Media [NumMedia]int
	// GPUOrCPU is the number of consecutive blocks from the chain's start
	// that the worker holds on the GPU or in host memory (each block on
	// either): with Media[GPU], it tells a GPU run followed by blocks
	// offloaded to host memory, which no single medium's run shows.
	GPUOrCPU int
}

// matchRow is a worker still being followed along a chain: its result row
// and the depths it still extends (bit m: medium m; catFast; catAny).
type matchRow struct {
	slot int32
	row  int32
	cats uint8
}

// Row categories: one per medium, then GPU-or-CPU, then any medium.
const (
	catFast = 1 << NumMedia
	catAny  = 1 << (NumMedia + 1)
)

// fastMedia are the media whose holdings count towards GPUOrCPU.
const fastMedia = 1<<GPU | 1<<CPU

// matchScratch holds a Match's per-call buffers.
type matchScratch struct {
	rows  []matchRow
	union []int32
}

var scratchPool = sync.Pool{New: func() any { return new(matchScratch) }}

// Match returns, for every worker that holds the chain's first block, how
// many consecutive blocks of the chain it holds, sorted by Blocks (most
// first) and then by worker name. The walk stops where no worker holds the
// next block. An empty chain matches nothing.
func (x *Index) Match(chain []uint64) ([]WorkerMatch, error) {
	return x.MatchInto(nil, chain)
}

// MatchInto is Match appending to dst, for callers that reuse buffers.
//
// The walk keeps the holder sets of the block it stands on. Along a run of
// blocks whose sets do not change (a session held by the same workers) it
// only compares hashes and set ids. Where a medium's set changes, only the
// workers that left it can lose a depth: they are enumerated (the old set
// less the new one) and looked up in the block's sets. The cost is thus the
// chain's length plus, at each change of holders, the size of the old set
// (or its bitmap's words): it does not depend on the size of the pool, nor
// on the number of workers still followed.
func (x *Index) MatchInto(dst []WorkerMatch, chain []uint64) ([]WorkerMatch, error) {
	dst = dst[:0]
	if len(chain) > x.opts.MaxChain {
		return dst, fmt.Errorf("match: %w: %d blocks, limit %d", ErrChainTooLong, len(chain), x.opts.MaxChain)
	}
	if len(chain) == 0 {
		return dst, nil
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	l, ok := x.locs.Get(chain[0])
	if !ok || x.parentOf(l) != Root {
		return dst, nil
	}
	sc := scratchPool.Get().(*matchScratch)
	defer scratchPool.Put(sc)

	s, o := x.segs[l.seg()], l.off()
	var cur [NumMedia]setID
	for m, ids := range s.sets {
		if ids != nil {
			cur[m] = ids[o]
		}
	}
	// Every worker that holds block 0 gets a result row.
	sc.union = x.unionOf(sc.union[:0], &cur)
	rows := sc.rows[:0]
	for _, slot := range sc.union {
		rows = append(rows, matchRow{slot: slot, row: int32(len(dst)), cats: x.heldCats(&cur, slot)})
		dst = append(dst, WorkerMatch{Worker: x.workers[slot].name})
	}
	depth := 1
	x.walk(dst, rows, chain, &depth, s, o, cur)
	// Whoever is still followed holds the whole walked prefix.
	for _, r := range rows {
		if r.cats != 0 {
			setDepths(&dst[r.row], r.cats, depth)
		}
	}
	sc.rows = rows[:0]
	slices.SortFunc(dst, func(a, b WorkerMatch) int {
		if a.Blocks != b.Blocks {
			return b.Blocks - a.Blocks
		}
		return strings.Compare(a.Worker, b.Worker)
	})
	return dst, nil
}

// walk follows the chain from block 1 on, standing on block 0 at (s, o)
// with holder sets cur. rows are the workers followed, ascending by slot;
// a row whose categories all end is left with none. *depth is left at the
// number of blocks walked.
func (x *Index) walk(dst []WorkerMatch, rows []matchRow, chain []uint64, depth *int, s *segment, o int, cur [NumMedia]setID) {
	d := *depth
	alive := len(rows)
	defer func() { *depth = d }()
	// The media the current segment has arrays for; with one (the common
	// case) a run is scanned by a tight loop.
	single := -1
	media := func() {
		single = -1
		n := 0
		for m, ids := range s.sets {
			if ids != nil {
				single = m
				n++
			}
		}
		if n != 1 {
			single = -1
		}
	}
	media()
	for d < len(chain) {
		if single >= 0 && o+1 < len(s.hashes) {
			// Stay in the run while the hashes match and the holders do
			// not change.
			lim := min(len(s.hashes)-(o+1), len(chain)-d)
			run, want, ids := s.hashes[o+1:o+1+lim], chain[d:d+lim], s.sets[single][o+1:o+1+lim]
			c := cur[single]
			i := 0
			for i < lim && run[i] == want[i] && ids[i] == c {
				i++
			}
			o += i
			if d += i; d == len(chain) {
				break
			}
		}
		ns, no, ok := x.next(chain, d, s, o)
		if !ok {
			break
		}
		if ns != s {
			s = ns
			media()
		}
		o = no
		var ids [NumMedia]setID
		for m, a := range s.sets {
			if a != nil {
				ids[m] = a[o]
			}
		}
		if ids != cur {
			prev := cur
			cur = ids
			if alive -= x.refine(dst, rows, &prev, &cur, d); alive == 0 {
				break
			}
		}
		d++
	}
}

// refine updates the rows for the block at depth d, whose holder sets are
// cur where the block before had prev. A row can only lose medium m's
// depth if its worker is in prev[m] but not in cur[m] (it held the block
// before on m), and only lose GPUOrCPU or Blocks if it lost some medium:
// so only the workers leaving some set are looked at. It returns the number
// of rows that lost their last category.
func (x *Index) refine(dst []WorkerMatch, rows []matchRow, prev, cur *[NumMedia]setID, d int) int {
	ended := 0
	visit := func(slot int32) {
		i, ok := slices.BinarySearchFunc(rows, slot, func(r matchRow, s int32) int { return int(r.slot) - int(s) })
		if !ok || rows[i].cats == 0 {
			return
		}
		r := &rows[i]
		c := r.cats & x.heldCats(cur, slot)
		if gone := r.cats &^ c; gone != 0 {
			setDepths(&dst[r.row], gone, d)
			if r.cats = c; c == 0 {
				ended++
			}
		}
	}
	for m := range NumMedia {
		if a, b := prev[m], cur[m]; a != b && a != 0 {
			x.hs.leaving(a, b, visit)
		}
	}
	return ended
}

// heldCats returns the categories in which slot holds a block whose holder
// sets are cur.
func (x *Index) heldCats(cur *[NumMedia]setID, slot int32) uint8 {
	var held uint8
	for m, id := range cur {
		if id != 0 && x.hs.contains(id, slot) {
			held |= 1 << m
		}
	}
	if held&fastMedia != 0 {
		held |= catFast
	}
	if held != 0 {
		held |= catAny
	}
	return held
}

// unionOf appends the union of the sets' slots, ascending, to dst.
func (x *Index) unionOf(dst []int32, cur *[NumMedia]setID) []int32 {
	n := 0
	for _, id := range cur {
		if id != 0 {
			dst = append(dst, x.hs.slots(id)...)
			n++
		}
	}
	if n > 1 {
		slices.Sort(dst)
		dst = slices.Compact(dst)
	}
	return dst
}

// setDepths sets depth d in r for the categories cats.
func setDepths(r *WorkerMatch, cats uint8, d int) {
	for m := range NumMedia {
		if cats&(1<<m) != 0 {
			r.Media[m] = d
		}
	}
	if cats&catFast != 0 {
		r.GPUOrCPU = d
	}
	if cats&catAny != 0 {
		r.Blocks = d
	}
}

// next returns the location of chain[depth], the block after the one at
// (s, o), or false where the chain leaves the index.
func (x *Index) next(chain []uint64, depth int, s *segment, o int) (*segment, int, bool) {
	h := chain[depth]
	if o+1 < len(s.hashes) && s.hashes[o+1] == h {
		return s, o + 1, true
	}
	l, ok := x.locs.Get(h)
	if !ok || x.parentOf(l) != chain[depth-1] {
		return nil, 0, false
	}
	return x.segs[l.seg()], l.off(), true
}
