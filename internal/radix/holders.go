package radix

import (
	"math/bits"
	"slices"
)

// setID names an interned holder set: a set of worker slots. 0 is the empty
// set, which every unheld (block, medium) pair refers to.
type setID uint32

// bitmapMin is the set size from which a holder set also carries a bitmap of
// its slots, so that a membership test costs one load however large the set
// (see DESIGN.md, "Holder sets", for the measurement behind it). Smaller sets
// are searched in their sorted slot list.
const bitmapMin = 32

// holderSet is one interned set of worker slots. Its contents never change
// while it is referenced: a block that gains or loses a holder moves to
// another set.
type holderSet struct {
	slots []int32  // ascending
	bits  []uint64 // slot bitmap when len(slots) >= bitmapMin, else nil
	sum   uint64   // content hash: the sum of slotKey over slots
	refs  int64    // (block, medium) pairs that refer to the set
	next  setID    // next set with the same sum
	gen   uint32   // bumped when the set is freed, to validate cached transitions
}

// transition caches the result of adding a slot to, or removing one from, a
// set: runs of blocks that share a holder set (a session's blocks, held by
// the same workers) all make the same transition.
type transition struct {
	from, to       setID
	fromGen, toGen uint32
	slot           int32
	add            bool
}

const transitionCache = 256

// setTable interns holder sets, so that each distinct set is stored once and
// a block refers to its set by a 4-byte id. Sets are reference-counted and
// freed when no block refers to them any more.
type setTable struct {
	sets  []holderSet // by id; sets[0] is the empty set and is never freed
	free  []setID
	bySum map[uint64]setID // content hash -> first set with it
	cache [transitionCache]transition
	live  int // sets with an id other than 0, referenced or not
}

func newSetTable() setTable {
	return setTable{sets: make([]holderSet, 1), bySum: make(map[uint64]setID)}
}

// slotKey is a slot's share of a set's content hash: sums of these are
// order-independent and can be updated one slot at a time.
func slotKey(slot int32) uint64 { return fmix(uint64(uint32(slot)) ^ 0x5851f42d4c957f2d) }

// slots returns the set's slots, ascending. The slice is not to be modified;
// it stays valid (unchanged) after the set is freed.
func (t *setTable) slots(id setID) []int32 { return t.sets[id].slots }

// size returns the number of slots in the set.
func (t *setTable) size(id setID) int { return len(t.sets[id].slots) }

// contains reports whether slot is in the set.
func (t *setTable) contains(id setID, slot int32) bool {
	if id == 0 {
		return false
	}
	s := &t.sets[id]
	if s.bits != nil {
		w := int(slot >> 6)
		return w < len(s.bits) && s.bits[w]&(1<<(slot&63)) != 0
	}
	if len(s.slots) <= 8 {
		for _, v := range s.slots {
			if v == slot {
				return true
			}
		}
		return false
	}
	_, ok := slices.BinarySearch(s.slots, slot)
	return ok
}

func (t *setTable) cacheIndex(from setID, slot int32) int {
	return int((uint32(from)*0x9e3779b1 ^ uint32(slot)*0x85ebca6b) >> 24 % transitionCache)
}

func (t *setTable) cached(from setID, slot int32, add bool) (setID, bool) {
	c := &t.cache[t.cacheIndex(from, slot)]
	if c.from == from && c.slot == slot && c.add == add && t.sets[from].gen == c.fromGen && t.sets[c.to].gen == c.toGen {
		return c.to, true
	}
	return 0, false
}

func (t *setTable) remember(from setID, slot int32, add bool, to setID) {
	t.cache[t.cacheIndex(from, slot)] = transition{from: from, to: to, fromGen: t.sets[from].gen, toGen: t.sets[to].gen, slot: slot, add: add}
}

// with returns the set of from's slots and slot, which from lacks. The
// caller moves one reference from from to the result.
func (t *setTable) with(from setID, slot int32) setID {
	if from != 0 && t.sets[from].refs == 1 {
		return t.mutate(from, slot, true)
	}
	if to, ok := t.cached(from, slot, true); ok {
		return to
	}
	old := t.sets[from].slots
	i, _ := slices.BinarySearch(old, slot)
	merged := make([]int32, len(old)+1)
	copy(merged, old[:i])
	merged[i] = slot
	copy(merged[i+1:], old[i:])
	to := t.intern(merged, t.sets[from].sum+slotKey(slot))
	t.remember(from, slot, true, to)
	return to
}

// without returns the set of from's slots but slot, which from holds. The
// caller moves one reference from from to the result.
func (t *setTable) without(from setID, slot int32) setID {
	old := t.sets[from].slots
	if len(old) == 1 {
		return 0
	}
	if t.sets[from].refs == 1 {
		return t.mutate(from, slot, false)
	}
	if to, ok := t.cached(from, slot, false); ok {
		return to
	}
	i, _ := slices.BinarySearch(old, slot)
	rest := make([]int32, 0, len(old)-1)
	rest = append(append(rest, old[:i]...), old[i+1:]...)
	to := t.intern(rest, t.sets[from].sum-slotKey(slot))
	t.remember(from, slot, false, to)
	return to
}

// leaving calls f for every slot of set a that set b lacks: word by word
// when both are bitmaps, else by looking a's slots up in b.
func (t *setTable) leaving(a, b setID, f func(slot int32)) {
	sa, sb := &t.sets[a], &t.sets[b]
	if sa.bits != nil && sb.bits != nil {
		for k, v := range sa.bits {
			if k < len(sb.bits) {
				v &^= sb.bits[k]
			}
			for ; v != 0; v &= v - 1 {
				f(int32(k*64 + bits.TrailingZeros64(v)))
			}
		}
		return
	}
	for _, slot := range sa.slots {
		if !t.contains(b, slot) {
			f(slot)
		}
	}
}

// mutate adds slot to (or removes it from) the set id in place: id has one
// reference, the caller's, which is about to move, so nothing else sees the
// change. Without it, a block whose set is its own (a shape where every
// block of a widely held prefix has different holders) would copy its whole
// set for each holder it gains or loses. If the new contents already exist
// as another set, that set is returned, and id, unlinked, is freed when the
// caller drops its reference.
func (t *setTable) mutate(id setID, slot int32, add bool) setID {
	t.unlinkSum(id)
	s := &t.sets[id]
	i, _ := slices.BinarySearch(s.slots, slot)
	if add {
		s.slots = slices.Insert(s.slots, i, slot)
		s.sum += slotKey(slot)
	} else {
		s.slots = slices.Delete(s.slots, i, i+1)
		s.sum -= slotKey(slot)
	}
	switch {
	case len(s.slots) < bitmapMin:
		s.bits = nil
	case s.bits == nil:
		s.bits = bitmapOf(s.slots)
	case add:
		for int(slot>>6) >= len(s.bits) {
			s.bits = append(s.bits, 0)
		}
		s.bits[slot>>6] |= 1 << (slot & 63)
	default:
		s.bits[slot>>6] &^= 1 << (slot & 63)
	}
	s.gen++ // cached transitions from or to id no longer hold
	if dup := t.find(s.slots, s.sum); dup != 0 {
		return dup
	}
	s.next = t.bySum[s.sum]
	t.bySum[s.sum] = id
	return id
}

func bitmapOf(slots []int32) []uint64 {
	bits := make([]uint64, slots[len(slots)-1]/64+1)
	for _, v := range slots {
		bits[v>>6] |= 1 << (v & 63)
	}
	return bits
}

// internSlots returns the id of the set of slots (ascending, not empty),
// creating it if needed. The table keeps slots.
func (t *setTable) internSlots(slots []int32) setID {
	var sum uint64
	for _, s := range slots {
		sum += slotKey(s)
	}
	return t.intern(slots, sum)
}

// find returns the id of an existing set with these contents, or 0.
func (t *setTable) find(slots []int32, sum uint64) setID {
	for id := t.bySum[sum]; id != 0; id = t.sets[id].next {
		if slices.Equal(t.sets[id].slots, slots) {
			return id
		}
	}
	return 0
}

func (t *setTable) intern(slots []int32, sum uint64) setID {
	if id := t.find(slots, sum); id != 0 {
		return id
	}
	var id setID
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		id = setID(len(t.sets))
		t.sets = append(t.sets, holderSet{})
	}
	s := &t.sets[id]
	s.slots, s.sum, s.refs = slots, sum, 0
	s.bits = nil
	if len(slots) >= bitmapMin {
		s.bits = bitmapOf(slots)
	}
	s.next = t.bySum[sum]
	t.bySum[sum] = id
	t.live++
	return id
}

// ref adds a reference to the set.
func (t *setTable) ref(id setID) {
	if id != 0 {
		t.sets[id].refs++
	}
}

// unref drops a reference to the set, freeing it when none is left.
func (t *setTable) unref(id setID) {
	if id == 0 {
		return
	}
	s := &t.sets[id]
	if s.refs--; s.refs == 0 {
		t.release(id)
	}
}

// unlinkSum removes id from the sets found by its content hash, if it is
// among them.
func (t *setTable) unlinkSum(id setID) {
	s := &t.sets[id]
	if head := t.bySum[s.sum]; head == id {
		if s.next == 0 {
			delete(t.bySum, s.sum)
		} else {
			t.bySum[s.sum] = s.next
		}
	} else {
		for p := head; p != 0; p = t.sets[p].next {
			if t.sets[p].next == id {
				t.sets[p].next = s.next
				break
			}
		}
	}
	s.next = 0
}

// release frees a set that nothing refers to.
func (t *setTable) release(id setID) {
	t.unlinkSum(id)
	s := &t.sets[id]
	s.slots, s.bits, s.next, s.refs = nil, nil, 0, 0
	s.gen++
	t.free = append(t.free, id)
	t.live--
}

// bytes estimates the table's memory.
func (t *setTable) bytes() int64 {
	const setSize = 64
	n := int64(cap(t.sets))*setSize + int64(cap(t.free))*4 + int64(len(t.bySum))*24
	for i := range t.sets {
		n += int64(cap(t.sets[i].slots))*4 + int64(cap(t.sets[i].bits))*8
	}
	return n
}
