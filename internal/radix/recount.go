package radix

import (
	"runtime"
)

// recount computes every counter, the holder sets' reference counts and the
// digest from the segments' holder sets, on all cores. A snapshot restore
// uses it instead of counting entry by entry. Counts that depend only on a
// block's holder set (references, per-medium counts, entries of blocks held
// on one medium) are tallied per set and spread over its workers once; the
// digest mixes every entry with its block, so it is summed entry by entry.
func (x *Index) recount() {
	type tally struct {
		held, entries int64
		digest        uint64
		media         uint8
		refs          [NumMedia][]int64 // by set id: blocks referring to it on medium m
		solo          []int64           // by set id: blocks held on one medium only, by it
		multi         []int64           // by slot: blocks held on several media
		union         []int32
	}
	n := min(runtime.GOMAXPROCS(0), 8)
	tallies := make([]tally, n)
	nsets := len(x.hs.sets)
	parallel(n, func(g int) {
		t := &tallies[g]
		for m := range t.refs {
			t.refs[m] = make([]int64, nsets)
		}
		t.solo = make([]int64, nsets)
		t.multi = make([]int64, len(x.workers))
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
				var cur [NumMedia]setID
				present := 0
				var only setID
				for m, ids := range s.sets {
					if ids == nil || ids[o] == 0 {
						continue
					}
					sid := ids[o]
					cur[m], only = sid, sid
					present++
					t.media |= 1 << m
					t.refs[m][sid]++
					for _, slot := range x.hs.slots(sid) {
						t.digest += entryHash(key, x.workers[slot].nameHash, Medium(m))
					}
				}
				switch {
				case present == 0:
					continue
				case present == 1:
					t.solo[only]++
				default:
					// A worker is one entry per block whatever its media.
					t.union = x.unionOf(t.union[:0], &cur)
					t.entries += int64(len(t.union))
					for _, slot := range t.union {
						t.multi[slot]++
					}
				}
				s.live++
				t.held++
			}
		}
	})
	x.heldBlocks, x.entries, x.digest, x.usedMedia = 0, 0, 0, 0
	for _, wk := range x.workers {
		if wk != nil {
			wk.entries, wk.media = 0, [NumMedia]int64{}
		}
	}
	for i := range x.hs.sets {
		x.hs.sets[i].refs = 0
	}
	for _, t := range tallies {
		x.heldBlocks += t.held
		x.entries += t.entries
		x.digest += t.digest
		x.usedMedia |= t.media
		for slot, c := range t.multi {
			if c != 0 {
				x.workers[slot].entries += c
			}
		}
	}
	for sid := 1; sid < nsets; sid++ {
		slots := x.hs.slots(setID(sid))
		var solo int64
		for _, t := range tallies {
			solo += t.solo[sid]
		}
		if solo != 0 {
			x.entries += solo * int64(len(slots))
			for _, slot := range slots {
				x.workers[slot].entries += solo
			}
		}
		for m := range NumMedia {
			var c int64
			for _, t := range tallies {
				c += t.refs[m][sid]
			}
			if c == 0 {
				continue
			}
			x.hs.sets[sid].refs += c
			for _, slot := range slots {
				x.workers[slot].media[m] += c
			}
		}
	}
}
