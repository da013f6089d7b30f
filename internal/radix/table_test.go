package radix

import (
	"math/rand/v2"
	"testing"
)

// TestBlockTableAgainstMap runs random puts and deletes against a Go map. The
// shards fill to their 3/4 load limit, so long probe runs, runs that wrap
// around a shard's end and backward-shift deletion inside them all occur.
func TestBlockTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tb := newBlockTable()
	ref := make(map[uint64]location)
	keys := make([]uint64, 0, 1<<16)
	for round := range 40 {
		for range 5000 {
			k := r.Uint64() | 1
			v := location(r.Uint64())
			if isNew := tb.Put(k, v); isNew != (ref[k] == 0) {
				t.Fatalf("put %x: new=%v", k, isNew)
			}
			ref[k] = v
			keys = append(keys, k)
		}
		for range 2000 + round*50 {
			i := r.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			tb.Delete(k)
			delete(ref, k)
			tb.Delete(k) // absent: a no-op
		}
		if tb.Len() != len(ref) {
			t.Fatalf("len %d, map %d", tb.Len(), len(ref))
		}
		for k, v := range ref {
			if got, ok := tb.Get(k); !ok || got != v {
				t.Fatalf("get %x = %v %v, want %v", k, got, ok, v)
			}
		}
		for range 1000 {
			if _, ok := tb.Get(r.Uint64() | 1); ok {
				// A random key is absent but for a 2^-60 chance.
				t.Fatal("found a key never put")
			}
		}
	}
	// Overwrite keeps the count.
	for k := range ref {
		if tb.Put(k, 7) {
			t.Fatal("overwrite reported new")
		}
		break
	}
	if tb.Len() != len(ref) {
		t.Fatal("overwrite changed the count")
	}
}

func TestBlockTableBuildFrom(t *testing.T) {
	segs := []*segment{{hashes: []uint64{5, 9, 13}}, nil, {hashes: []uint64{21, 2}}}
	tb := newBlockTable()
	if _, ok := tb.buildFrom(segs); !ok {
		t.Fatal("build failed")
	}
	if l, ok := tb.Get(2); !ok || l != at(2, 1) || tb.Len() != 5 {
		t.Fatalf("get 2 = %v %v, len %d", l, ok, tb.Len())
	}
	segs[2].hashes[1] = 9
	tb = newBlockTable()
	if dup, ok := tb.buildFrom(segs); ok || dup != 9 {
		t.Fatalf("repeated hash: %x %v", dup, ok)
	}
}

func TestBlockTableNeverFindsZero(t *testing.T) {
	tb := newBlockTable()
	for k := uint64(1); k < 5000; k++ {
		tb.Put(k, location(k))
	}
	if _, ok := tb.Get(0); ok {
		t.Fatal("hash 0 (the empty-slot key) was found")
	}
	x := New(Options{})
	must(t, x.Insert("a", Root, []uint64{5, 6}, GPU))
	if m, err := x.Match([]uint64{0, 5}); err != nil || len(m) != 0 {
		t.Fatalf("chain starting with 0 matched %v %v", m, err)
	}
	if _, ok := x.ChainTo(0); ok {
		t.Fatal("ChainTo(0) found a chain")
	}
}
