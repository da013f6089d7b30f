package workload

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// randomTrace builds n records that share prefixes the way traces do: each
// takes a random number of leading blocks of an earlier record (or none) and
// adds blocks of its own, its last block possibly partial.
func randomTrace(rng *rand.Rand, n, blockSize int) []Record {
	var recs []Record
	next := int64(1)
	for range n {
		var ids []int64
		if len(recs) > 0 && rng.IntN(4) > 0 {
			p := recs[rng.IntN(len(recs))].HashIDs
			ids = slices.Clone(p[:1+rng.IntN(len(p))])
		}
		for range rng.IntN(6) + 1 - min(len(ids), 1) {
			ids = append(ids, next)
			next++
		}
		if len(ids) == 0 {
			ids = append(ids, next)
			next++
		}
		recs = append(recs, Record{InputLength: (len(ids)-1)*blockSize + 1 + rng.IntN(blockSize), OutputLength: 1, HashIDs: ids})
	}
	return recs
}

func sum(v []int) int64 {
	var s int64
	for _, x := range v {
		s += int64(x)
	}
	return s
}

// TestPooledUnlimitedIsIdeal: a cache that never evicts hits what IdealHits
// counts, for engine blocks dividing the trace's and for ones that do not.
func TestPooledUnlimitedIsIdeal(t *testing.T) {
	for _, bs := range [][2]int{{512, 16}, {64, 16}, {64, 48}, {20, 16}} {
		for seed := range uint64(20) {
			recs := randomTrace(rand.New(rand.NewPCG(seed, 1)), 60, bs[0])
			want := IdealHits(recs, bs[0], bs[1])
			got := PooledHits(recs, bs[0], bs[1], 1<<40)
			if !slices.Equal(got, want) {
				t.Fatalf("blocks %v, seed %d: pooled %v, ideal %v", bs, seed, got, want)
			}
		}
	}
}

// TestPooledTinyCapacity: no capacity hits nothing; one block hits at most
// one block per request.
func TestPooledTinyCapacity(t *testing.T) {
	recs := randomTrace(rand.New(rand.NewPCG(3, 1)), 200, 512)
	if s := sum(IdealHits(recs, 512, 16)); s == 0 {
		t.Fatal("the trace has no reuse to lose")
	}
	if s := sum(PooledHits(recs, 512, 16, 15)); s != 0 {
		t.Fatalf("less than a block of cache hit %d tokens", s)
	}
	for i, h := range PooledHits(recs, 512, 16, 16) {
		if h > 16 {
			t.Fatalf("record %d: one block of cache hit %d tokens", i, h)
		}
	}
}

// TestPooledMonotone: more capacity never hits less, record by record.
func TestPooledMonotone(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 2))
		recs := randomTrace(rng, 80, 64)
		prev := PooledHits(recs, 64, 16, 0)
		for c := int64(16); c < 1<<14; c = c*3/2 + 16 {
			cur := PooledHits(recs, 64, 16, c)
			for i := range cur {
				if cur[i] < prev[i] {
					t.Fatalf("seed %d: record %d hits %d at capacity %d, %d with less", seed, i, cur[i], c, prev[i])
				}
			}
			prev = cur
		}
	}
}

// TestPooledEvictsLeavesFirst: a request's deepest blocks are its least
// recently used, so what pressure evicts is a suffix and the prefix still
// hits.
func TestPooledEvictsLeavesFirst(t *testing.T) {
	recs := []Record{
		{InputLength: 48, OutputLength: 1, HashIDs: []int64{1, 2, 3}},
		{InputLength: 16, OutputLength: 1, HashIDs: []int64{9}}, // evicts block 3, the leaf
		{InputLength: 48, OutputLength: 1, HashIDs: []int64{1, 2, 3}},
		{InputLength: 32, OutputLength: 1, HashIDs: []int64{9, 10}}, // 9 was the LRU block when 1, 2, 3 came back
	}
	got := PooledHits(recs, 16, 16, 3*16)
	if want := []int{0, 0, 32, 0}; !slices.Equal(got, want) {
		t.Fatalf("pooled %v, want %v", got, want)
	}
}
