package radix

import (
	"math/bits"
	"runtime"
)

// recount computes every counter and the digest from the segments' masks, on
// all cores. A snapshot restore uses it instead of counting entry by entry.
func (x *Index) recount() {
	type tally struct {
		held, entries int64
		digest        uint64
		media         uint8
		workers       []worker // counts only
	}
	n := min(runtime.GOMAXPROCS(0), 8)
	tallies := make([]tally, n)
	w := x.w
	parallel(n, func(g int) {
		t := &tallies[g]
		t.workers = make([]worker, len(x.workers))
		for id := g; id < len(x.segs); id += n {
			s := x.segs[id]
			if s == nil {
				continue
			}
			s.live = 0
			parent := s.parentHash
			for o, h := range s.hashes {
				key := blockKey(h, parent)
				parent = h
				live := false
				for k := range w {
					var held uint64
					for m, mask := range s.masks {
						if mask == nil {
							continue
						}
						t.media |= 1 << m
						v := mask[o*w+k]
						held |= v
						for ; v != 0; v &= v - 1 {
							slot := k*64 + bits.TrailingZeros64(v)
							t.workers[slot].media[m]++
							t.digest += entryHash(key, x.workers[slot].nameHash, Medium(m))
						}
					}
					live = live || held != 0
					t.entries += int64(bits.OnesCount64(held))
					for ; held != 0; held &= held - 1 {
						t.workers[k*64+bits.TrailingZeros64(held)].entries++
					}
				}
				if live {
					s.live++
					t.held++
				}
			}
		}
	})
	x.heldBlocks, x.entries, x.digest, x.usedMedia = 0, 0, 0, 0
	for _, wk := range x.workers {
		if wk != nil {
			wk.entries, wk.media = 0, [NumMedia]int64{}
		}
	}
	for _, t := range tallies {
		x.heldBlocks += t.held
		x.entries += t.entries
		x.digest += t.digest
		x.usedMedia |= t.media
		for slot, c := range t.workers {
			if wk := x.workers[slot]; wk != nil {
				wk.entries += c.entries
				for m := range c.media {
					wk.media[m] += c.media[m]
				}
			}
		}
	}
}
