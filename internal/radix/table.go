package radix

import (
	"math/rand/v2"
	"runtime"
	"sync"
)

// blockTable maps block hashes to their locations. It is an open-addressing
// hash table with linear probing, split into shards so that growing one
// rehashes only a small part of it (a writer never stalls readers for long)
// and so that a snapshot restore can fill it shard by shard, each shard small
// enough to stay in cache. Keys are mixed with a per-process random seed, so
// crafted hashes cannot pile into one probe sequence. Key 0 marks an empty
// slot; block hash 0 is reserved for the root and never stored.
type blockTable struct {
	shards [tableShards]tableShard
	n      int
	seed   uint64
}

const (
	tableShardBits = 8
	tableShards    = 1 << tableShardBits
	minShardSlots  = 8
)

type tableSlot struct {
	key uint64
	val location
}

type tableShard struct {
	slots []tableSlot // length a power of two, or 0
	n     int
}

func newBlockTable() blockTable { return blockTable{seed: rand.Uint64() | 1} }

func (t *blockTable) mix(h uint64) uint64 { return fmix(h ^ t.seed) }

func (t *blockTable) shard(m uint64) *tableShard { return &t.shards[m>>(64-tableShardBits)] }

// Len returns the number of keys.
func (t *blockTable) Len() int { return t.n }

// Get returns the location of h. Hash 0 (the root) is never stored.
func (t *blockTable) Get(h uint64) (location, bool) {
	if h == 0 {
		return 0, false // 0 marks empty slots: it must not be looked up
	}
	m := t.mix(h)
	s := t.shard(m)
	if len(s.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(s.slots) - 1)
	for i := m & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case h:
			return s.slots[i].val, true
		case 0:
			return 0, false
		}
	}
}

// Put sets the location of h and reports whether h is new.
func (t *blockTable) Put(h uint64, v location) bool {
	m := t.mix(h)
	s := t.shard(m)
	if (s.n+1)*4 > len(s.slots)*3 {
		s.resize(t, max(minShardSlots, 2*len(s.slots)))
	}
	if s.put(m, h, v) {
		t.n++
		return true
	}
	return false
}

func (s *tableShard) put(m, h uint64, v location) bool {
	mask := uint64(len(s.slots) - 1)
	for i := m & mask; ; i = (i + 1) & mask {
		switch s.slots[i].key {
		case h:
			s.slots[i].val = v
			return false
		case 0:
			s.slots[i] = tableSlot{h, v}
			s.n++
			return true
		}
	}
}

func (s *tableShard) resize(t *blockTable, size int) {
	old := s.slots
	s.slots = make([]tableSlot, size)
	s.n = 0
	for _, sl := range old {
		if sl.key != 0 {
			s.put(t.mix(sl.key), sl.key, sl.val)
		}
	}
}

// Delete removes h, if present. Later entries of its probe run shift back, so
// the table never holds tombstones.
func (t *blockTable) Delete(h uint64) {
	m := t.mix(h)
	s := t.shard(m)
	if len(s.slots) == 0 {
		return
	}
	mask := uint64(len(s.slots) - 1)
	i := m & mask
	for ; s.slots[i].key != h; i = (i + 1) & mask {
		if s.slots[i].key == 0 {
			return
		}
	}
	for j := (i + 1) & mask; s.slots[j].key != 0; j = (j + 1) & mask {
		// The entry at j may move to the hole at i unless its home slot
		// lies cyclically in (i, j].
		home := t.mix(s.slots[j].key) & mask
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = tableSlot{}
	s.n--
	t.n--
}

// buildFrom fills an empty table with every block of segs, shard by shard.
// It returns a repeated hash, if any (the table is then incomplete).
func (t *blockTable) buildFrom(segs []*segment) (dup uint64, ok bool) {
	workers := min(runtime.GOMAXPROCS(0), 8)
	// Each goroutine takes every workers-th segment: it counts its keys
	// per shard, then (at offsets that leave room for the goroutines
	// before it) scatters them by shard into one array.
	counts := make([][tableShards]int, workers)
	parallel(workers, func(g int) {
		for id := g; id < len(segs); id += workers {
			if s := segs[id]; s != nil {
				for _, h := range s.hashes {
					counts[g][t.mix(h)>>(64-tableShardBits)]++
				}
			}
		}
	})
	var starts [tableShards + 1]int
	offsets := make([][tableShards]int, workers)
	total := 0
	for k := range tableShards {
		starts[k] = total
		for g := range workers {
			offsets[g][k] = total
			total += counts[g][k]
		}
	}
	starts[tableShards] = total
	byShard := make([]tableSlot, total)
	parallel(workers, func(g int) {
		next := &offsets[g]
		for id := g; id < len(segs); id += workers {
			if s := segs[id]; s != nil {
				for o, h := range s.hashes {
					k := t.mix(h) >> (64 - tableShardBits)
					byShard[next[k]] = tableSlot{h, at(int32(id), o)}
					next[k]++
				}
			}
		}
	})
	// Then each fills its share of the shards, one at a time, each
	// allocated just before it is filled so that it stays in cache.
	dups := make([]uint64, workers)
	parallel(workers, func(g int) {
		for k := g; k < tableShards; k += workers {
			sh := &t.shards[k]
			n := starts[k+1] - starts[k]
			size := minShardSlots
			for size*3 < n*4+4 {
				size *= 2
			}
			sh.slots = make([]tableSlot, size)
			for _, sl := range byShard[starts[k]:starts[k+1]] {
				if !sh.put(t.mix(sl.key), sl.key, sl.val) {
					dups[g] = sl.key
					return
				}
			}
		}
	})
	for _, d := range dups {
		if d != 0 {
			return d, false
		}
	}
	t.n = total
	return 0, true
}

// parallel runs f(0) .. f(n-1) on their own goroutines and waits for them.
func parallel(n int, f func(g int)) {
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { f(g) })
	}
	wg.Wait()
}
