package radix

import (
	"fmt"
	"math/bits"
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
}

// matchScratch holds a Match's per-call buffers.
type matchScratch struct {
	alive [NumMedia + 1][]uint64 // [0]: any medium; [1+m]: medium m
	pos   []int32                // worker slot -> index in the result, or -1
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
	l, ok := x.locs[chain[0]]
	if !ok || x.parentOf(l) != Root {
		return dst, nil
	}
	sc := scratchPool.Get().(*matchScratch)
	defer scratchPool.Put(sc)
	w := x.w
	for i := range sc.alive {
		sc.alive[i] = slices.Grow(sc.alive[i][:0], w)[:w]
		clear(sc.alive[i])
	}
	if cap(sc.pos) < len(x.workers) {
		sc.pos = make([]int32, len(x.workers))
	}
	pos := sc.pos[:len(x.workers)]

	s, o := x.segs[l.seg()], l.off()
	any := sc.alive[0]
	for m := 0; m < NumMedia; m++ {
		if mask := s.masks[m]; mask != nil {
			copy(sc.alive[1+m], mask[o*w:o*w+w])
			for k := range any {
				any[k] |= mask[o*w+k]
			}
		}
	}
	// Every worker that holds block 0 gets a result row.
	for k, v := range any {
		for ; v != 0; v &= v - 1 {
			slot := k*64 + bits.TrailingZeros64(v)
			pos[slot] = int32(len(dst))
			dst = append(dst, WorkerMatch{Worker: x.workers[slot].name})
		}
	}
	media := x.usedMedia
	depth := 1
	for ; depth < len(chain); depth++ {
		h := chain[depth]
		if o+1 < len(s.hashes) && s.hashes[o+1] == h {
			o++
		} else {
			nl, ok := x.locs[h]
			if !ok || x.parentOf(nl) != chain[depth-1] {
				break
			}
			s, o = x.segs[nl.seg()], nl.off()
		}
		alive := false
		for k := 0; k < w; k++ {
			var held uint64
			for m := 0; m < NumMedia; m++ {
				if media&(1<<m) == 0 {
					continue
				}
				var mw uint64
				if mask := s.masks[m]; mask != nil {
					mw = mask[o*w+k]
				}
				held |= mw
				am := sc.alive[1+m]
				if gone := am[k] &^ mw; gone != 0 {
					recordDepth(dst, pos, k, gone, depth, 1+m)
					am[k] &= mw
				}
			}
			if gone := any[k] &^ held; gone != 0 {
				recordDepth(dst, pos, k, gone, depth, 0)
				any[k] &= held
			}
			alive = alive || any[k] != 0
		}
		if !alive {
			break
		}
	}
	// Whoever is still alive holds the whole walked prefix.
	for i, a := range sc.alive {
		for k, v := range a {
			if v != 0 {
				recordDepth(dst, pos, k, v, depth, i)
			}
		}
	}
	slices.SortFunc(dst, func(a, b WorkerMatch) int {
		if a.Blocks != b.Blocks {
			return b.Blocks - a.Blocks
		}
		return strings.Compare(a.Worker, b.Worker)
	})
	return dst, nil
}

// recordDepth sets depth for the workers in bits (word k): into Blocks when
// which is 0, into Media[which-1] otherwise.
func recordDepth(dst []WorkerMatch, pos []int32, k int, v uint64, depth, which int) {
	for ; v != 0; v &= v - 1 {
		r := &dst[pos[k*64+bits.TrailingZeros64(v)]]
		if which == 0 {
			r.Blocks = depth
		} else {
			r.Media[which-1] = depth
		}
	}
}
