package radix

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// BenchmarkSetContains times the membership test that writers and match
// refinement make, on a sorted slot list (linear up to 8 slots, binary
// search above) and on a bitmap, for sets of several sizes in a 65,536-slot
// pool: the measurement behind bitmapMin.
func BenchmarkSetContains(b *testing.B) {
	for _, n := range []int{4, 8, 16, 32, 64, 256, 4096} {
		r := rand.New(rand.NewPCG(uint64(n), 1))
		perm := r.Perm(1 << 16)[:n]
		slots := make([]int32, n)
		for i, v := range perm {
			slots[i] = int32(v)
		}
		slices.Sort(slots)
		probes := make([]int32, 1024)
		for i := range probes {
			if i%2 == 0 {
				probes[i] = slots[r.IntN(n)]
			} else {
				probes[i] = int32(r.IntN(1 << 16))
			}
		}
		for _, bitmap := range []bool{false, true} {
			t := newSetTable()
			id := t.intern(slices.Clone(slots), 0)
			if bitmap {
				t.sets[id].bits = bitmapOf(slots)
			} else {
				t.sets[id].bits = nil
			}
			kind := map[bool]string{false: "list", true: "bitmap"}[bitmap]
			b.Run(fmt.Sprintf("size=%d/%s", n, kind), func(b *testing.B) {
				hits := 0
				for i := 0; b.Loop(); i++ {
					if t.contains(id, probes[i%len(probes)]) {
						hits++
					}
				}
				if hits == 0 {
					b.Fatal("no hits")
				}
			})
		}
	}
}

// TestSetTableReusesAndFrees checks interning, in-place changes of sets with
// one reference, and freeing, directly on the table.
func TestSetTableReusesAndFrees(t *testing.T) {
	tb := newSetTable()
	a := tb.with(0, 5) // {5}
	tb.ref(a)
	tb.ref(a) // two blocks hold {5}
	b := tb.with(a, 9)
	tb.ref(b)
	tb.unref(a) // one block moved to {5, 9}
	if tb.size(b) != 2 || !tb.contains(b, 9) || tb.contains(a, 9) {
		t.Fatalf("sets %v %v", tb.slots(a), tb.slots(b))
	}
	// The other block makes the same transition: it gets the same set.
	if c := tb.with(a, 9); c != b {
		t.Fatalf("same contents, sets %d and %d", c, b)
	}
	tb.ref(b)
	tb.unref(a) // a is freed
	if tb.live != 1 || len(tb.free) != 1 {
		t.Fatalf("live %d free %d", tb.live, len(tb.free))
	}
	// b has two references: removing 5 from one block copies.
	c := tb.without(b, 5)
	tb.ref(c)
	tb.unref(b)
	if c == b || !slices.Equal(tb.slots(c), []int32{9}) || !slices.Equal(tb.slots(b), []int32{5, 9}) {
		t.Fatalf("copy on change: %v %v", tb.slots(b), tb.slots(c))
	}
	// Now b has one reference: adding 7 changes it in place...
	if d := tb.with(b, 7); d != b || !slices.Equal(tb.slots(b), []int32{5, 7, 9}) {
		t.Fatalf("in place: set %d %v", d, tb.slots(d))
	}
	// ...unless the result exists already, which is then shared.
	e := tb.internSlots([]int32{5, 9})
	tb.ref(e)
	if d := tb.without(b, 7); d != e {
		t.Fatalf("in place onto an existing set: %d, want %d", d, e)
	}
	tb.ref(e)
	tb.unref(b)
	refs := map[setID]int64{c: 1, e: 2}
	checkSetTable(t, &tb, refs)
}
