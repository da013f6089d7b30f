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
	// GPUOrCPU is the number of consecutive blocks from the chain's start
	// that the worker holds on the GPU or in host memory (each block on
	// either): with Media[GPU], it tells a GPU run followed by blocks
	// offloaded to host memory, which no single medium's run shows.
	GPUOrCPU int
}

// matchScratch holds a Match's per-call buffers.
type matchScratch struct {
	alive [NumMedia + 2][]uint64 // [0]: any medium; [1+m]: medium m; [fastSet]: GPU or CPU
	pos   []int32                // worker slot -> index in the result, or -1
}

var scratchPool = sync.Pool{New: func() any { return new(matchScratch) }}

// fastSet is the index of the GPU-or-CPU set in matchScratch.alive and
// recordDepth.
const fastSet = NumMedia + 1

// fastMedium reports whether m counts towards WorkerMatch.GPUOrCPU.
func fastMedium(m int) bool { return m == int(GPU) || m == int(CPU) }

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
	l, ok := x.locs.Get(chain[0])
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
	fast := sc.alive[fastSet]
	for m := 0; m < NumMedia; m++ {
		if mask := s.masks[m]; mask != nil {
			copy(sc.alive[1+m], mask[o*w:o*w+w])
			for k := range any {
				any[k] |= mask[o*w+k]
				if fastMedium(m) {
					fast[k] |= mask[o*w+k]
				}
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
	var depth int
	if w == 1 {
		depth = x.walk1(sc, dst, pos, chain, s, o)
	} else {
		depth = x.walkN(sc, dst, pos, chain, s, o)
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

// walk1 is the walk for indexes of at most 64 workers (one mask word per
// block). It returns the depth reached, having recorded the depth of every
// worker that dropped out before it.
func (x *Index) walk1(sc *matchScratch, dst []WorkerMatch, pos []int32, chain []uint64, s *segment, o int) int {
	alive, aliveF := sc.alive[0][0], sc.alive[fastSet][0]
	var aliveM [NumMedia]uint64
	for m := range aliveM {
		aliveM[m] = sc.alive[1+m][0]
	}
	defer func() {
		sc.alive[0][0], sc.alive[fastSet][0] = alive, aliveF
		for m := range aliveM {
			sc.alive[1+m][0] = aliveM[m]
		}
	}()
	var present [NumMedia]int
	np := 0
	depth := 1
	for ; depth < len(chain); depth++ {
		if np == 1 {
			// Fast path: the rest of a single-medium run, compared
			// block by block without leaving the segment's arrays.
			m := present[0]
			lim := min(len(s.hashes)-(o+1), len(chain)-depth)
			run, want, mk := s.hashes[o+1:o+1+lim], chain[depth:depth+lim], s.masks[m][o+1:o+1+lim]
			if aliveF != 0 && !fastMedium(m) && lim > 0 && run[0] == want[0] {
				// Blocks held on a slow medium only: the GPU-or-CPU run ends.
				recordDepth(dst, pos, 0, aliveF, depth, fastSet)
				aliveF = 0
			}
			i := 0
			for ; i < lim && run[i] == want[i]; i++ {
				mw := mk[i]
				if alive&^mw == 0 {
					continue
				}
				if gone := aliveM[m] &^ mw; gone != 0 {
					recordDepth(dst, pos, 0, gone, depth+i, 1+m)
					aliveM[m] &= mw
				}
				if gone := aliveF &^ mw; gone != 0 {
					recordDepth(dst, pos, 0, gone, depth+i, fastSet)
					aliveF &= mw
				}
				recordDepth(dst, pos, 0, alive&^mw, depth+i, 0)
				if alive &= mw; alive == 0 {
					return depth + i
				}
			}
			o += i
			if depth += i; depth == len(chain) {
				break
			}
		}
		ns, no, ok := x.next(chain, depth, s, o)
		if !ok {
			break
		}
		if ns != s || np == 0 {
			// Entering a segment: workers alive on a medium the segment has
			// no mask for drop out of that medium here.
			np = 0
			for m := range NumMedia {
				if ns.masks[m] != nil {
					present[np] = m
					np++
				} else if aliveM[m] != 0 {
					recordDepth(dst, pos, 0, aliveM[m], depth, 1+m)
					aliveM[m] = 0
				}
			}
		}
		s, o = ns, no
		var held, heldF uint64
		for _, m := range present[:np] {
			mw := s.masks[m][o]
			held |= mw
			if fastMedium(m) {
				heldF |= mw
			}
			if gone := aliveM[m] &^ mw; gone != 0 {
				recordDepth(dst, pos, 0, gone, depth, 1+m)
				aliveM[m] &= mw
			}
		}
		if gone := aliveF &^ heldF; gone != 0 {
			recordDepth(dst, pos, 0, gone, depth, fastSet)
			aliveF &= heldF
		}
		if gone := alive &^ held; gone != 0 {
			recordDepth(dst, pos, 0, gone, depth, 0)
			if alive &= held; alive == 0 {
				break
			}
		}
	}
	return depth
}

// walkN is walk1 for any number of mask words.
func (x *Index) walkN(sc *matchScratch, dst []WorkerMatch, pos []int32, chain []uint64, s *segment, o int) int {
	w := x.w
	anyAlive, fastAlive := sc.alive[0], sc.alive[fastSet]
	depth := 1
	for ; depth < len(chain); depth++ {
		ns, no, ok := x.next(chain, depth, s, o)
		if !ok {
			break
		}
		s, o = ns, no
		alive := false
		for k := range w {
			var held, heldF uint64
			for m := range NumMedia {
				var mw uint64
				if mask := s.masks[m]; mask != nil {
					mw = mask[o*w+k]
				}
				held |= mw
				if fastMedium(m) {
					heldF |= mw
				}
				am := sc.alive[1+m]
				if gone := am[k] &^ mw; gone != 0 {
					recordDepth(dst, pos, k, gone, depth, 1+m)
					am[k] &= mw
				}
			}
			if gone := fastAlive[k] &^ heldF; gone != 0 {
				recordDepth(dst, pos, k, gone, depth, fastSet)
				fastAlive[k] &= heldF
			}
			if gone := anyAlive[k] &^ held; gone != 0 {
				recordDepth(dst, pos, k, gone, depth, 0)
				anyAlive[k] &= held
			}
			alive = alive || anyAlive[k] != 0
		}
		if !alive {
			break
		}
	}
	return depth
}

// recordDepth sets depth for the workers in bits (word k): into Blocks when
// which is 0, GPUOrCPU when it is fastSet, into Media[which-1] otherwise.
func recordDepth(dst []WorkerMatch, pos []int32, k int, v uint64, depth, which int) {
	for ; v != 0; v &= v - 1 {
		r := &dst[pos[k*64+bits.TrailingZeros64(v)]]
		switch which {
		case 0:
			r.Blocks = depth
		case fastSet:
			r.GPUOrCPU = depth
		default:
			r.Media[which-1] = depth
		}
	}
}
