package tokenize

import (
	"hash/maphash"
	"math/bits"
)

// rankTable maps token bytes to ids and back without any pointers into the
// heap other than its four slices, so the garbage collector never scans it.
// (A map[string]int of the 100k cl100k tokens is a ~18 MB pointer-rich
// object that every GC cycle would traverse.)
type rankTable struct {
	arena []byte   // token bytes, concatenated in id order
	offs  []uint32 // token id's bytes are arena[offs[id]:offs[id+1]]
	slots []uint32 // open addressing over ordinary tokens: id+1, 0 = empty
	mask  uint64
	seed  maphash.Seed
}

// newRankTable builds the table; tokens[id] is the id's bytes ("" for unused
// ids) and ordinary[id] says whether lookup may return id.
func newRankTable(tokens []string, ordinary []bool) *rankTable {
	size, n := 0, 0
	for id, tok := range tokens {
		size += len(tok)
		if ordinary[id] {
			n++
		}
	}
	t := &rankTable{
		arena: make([]byte, 0, size),
		offs:  make([]uint32, len(tokens)+1),
		seed:  maphash.MakeSeed(),
	}
	for id, tok := range tokens {
		t.offs[id] = uint32(len(t.arena))
		t.arena = append(t.arena, tok...)
	}
	t.offs[len(tokens)] = uint32(len(t.arena))
	// Load factor below 1/2 keeps probe sequences short.
	nslots := uint64(1) << bits.Len(uint(2*n+1))
	t.slots = make([]uint32, nslots)
	t.mask = nslots - 1
	for id, tok := range tokens {
		if !ordinary[id] {
			continue
		}
		i := maphash.String(t.seed, tok) & t.mask
		for t.slots[i] != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = uint32(id) + 1
	}
	return t
}

// lookup returns the ordinary token id whose bytes are s.
func (t *rankTable) lookup(s string) (uint32, bool) {
	i := maphash.String(t.seed, s) & t.mask
	for {
		v := t.slots[i]
		if v == 0 {
			return 0, false
		}
		id := v - 1
		if tok := t.arena[t.offs[id]:t.offs[id+1]]; string(tok) == s {
			return id, true
		}
		i = (i + 1) & t.mask
	}
}

// token returns the bytes of id; id < len(t.offs)-1.
func (t *rankTable) token(id uint32) []byte {
	return t.arena[t.offs[id]:t.offs[id+1]]
}

func (t *rankTable) size() int { return len(t.offs) - 1 }
