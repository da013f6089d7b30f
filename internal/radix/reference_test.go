package radix

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// This file holds the naive reference model the index is checked against, a
// generator of operation sequences shared by the property test and the fuzz
// target, and a full invariant check of the index's internals.

// forest is a fixed random set of chains: every hash has one parent, as
// content hashes do.
type forest struct {
	parent map[uint64]uint64
	nodes  []uint64 // in creation order: parents before children
}

func newForest(r interface{ intn(int) int }, size, roots int) *forest {
	f := &forest{parent: make(map[uint64]uint64)}
	next := uint64(0x1000)
	for i := range size {
		next += uint64(r.intn(1<<20)) + 1
		h := next*0x9e3779b97f4a7c15 | 1
		p := Root
		if i >= roots {
			// Prefer extending recent nodes, so chains get long.
			j := len(f.nodes) - 1 - r.intn(min(len(f.nodes), 8))
			if r.intn(4) == 0 {
				j = r.intn(len(f.nodes))
			}
			p = f.nodes[j]
		}
		f.parent[h] = p
		f.nodes = append(f.nodes, h)
	}
	return f
}

// path returns the chain from the root to h.
func (f *forest) path(h uint64) []uint64 {
	var p []uint64
	for ; h != Root; h = f.parent[h] {
		p = append(p, h)
	}
	slices.Reverse(p)
	return p
}

// reference is the naive model: per worker, a map of block -> media bits.
type reference struct {
	f    *forest
	held map[string]map[uint64]uint8
	// pool, when set, is the workers step draws from instead of
	// testWorkers, and step then also applies operations to many of them
	// at once.
	pool []string
}

func newReference(f *forest) *reference {
	return &reference{f: f, held: make(map[string]map[uint64]uint8)}
}

func (r *reference) insert(w string, hashes []uint64, m Medium) {
	if r.held[w] == nil {
		r.held[w] = make(map[uint64]uint8)
	}
	for _, h := range hashes {
		r.held[w][h] |= 1 << m
	}
}

func (r *reference) remove(w string, hashes []uint64, m Medium) {
	hm := r.held[w]
	for _, h := range hashes {
		if m == AnyMedium {
			delete(hm, h)
			continue
		}
		if v, ok := hm[h]; ok {
			if v &^= 1 << m; v == 0 {
				delete(hm, h)
			} else {
				hm[h] = v
			}
		}
	}
}

func (r *reference) match(chain []uint64) []WorkerMatch {
	var out []WorkerMatch
	if len(chain) == 0 || r.f.parent[chain[0]] != Root {
		return nil
	}
	// The walk only follows real parent links.
	valid := 1
	for valid < len(chain) && r.f.parent[chain[valid]] == chain[valid-1] {
		valid++
	}
	for w, hm := range r.held {
		var wm WorkerMatch
		wm.Worker = w
		for wm.Blocks < valid && hm[chain[wm.Blocks]] != 0 {
			wm.Blocks++
		}
		for m := range NumMedia {
			for wm.Media[m] < valid && hm[chain[wm.Media[m]]]&(1<<m) != 0 {
				wm.Media[m]++
			}
		}
		for wm.GPUOrCPU < valid && hm[chain[wm.GPUOrCPU]]&(1<<GPU|1<<CPU) != 0 {
			wm.GPUOrCPU++
		}
		if wm.Blocks > 0 {
			out = append(out, wm)
		}
	}
	slices.SortFunc(out, func(a, b WorkerMatch) int {
		if a.Blocks != b.Blocks {
			return b.Blocks - a.Blocks
		}
		return strings.Compare(a.Worker, b.Worker)
	})
	return out
}

// digest recomputes the content digest from the model.
func (r *reference) digest() uint64 {
	var d uint64
	for w, hm := range r.held {
		for h, media := range hm {
			for m := range Medium(NumMedia) {
				if media&(1<<m) != 0 {
					d += entryHash(blockKey(h, r.f.parent[h]), hashString(w), m)
				}
			}
		}
	}
	return d
}

func (r *reference) stats() (blocks, entries int64) {
	all := make(map[uint64]bool)
	for _, hm := range r.held {
		for h := range hm {
			all[h] = true
			entries++
		}
	}
	return int64(len(all)), entries
}

// source supplies the generator's choices: random, or from fuzz input.
type source interface{ intn(n int) int }

type randSource struct{ r *rand.Rand }

func (s randSource) intn(n int) int { return s.r.IntN(n) }

// byteSource reads choices from fuzz input; exhausted input yields zeros.
type byteSource struct{ b []byte }

func (s *byteSource) intn(n int) int {
	if n <= 1 {
		return 0
	}
	var v int
	for need := n - 1; need > 0; need >>= 8 {
		v <<= 8
		if len(s.b) > 0 {
			v |= int(s.b[0])
			s.b = s.b[1:]
		}
	}
	return v % n
}

func (s *byteSource) empty() bool { return len(s.b) == 0 }

var testWorkers = []string{"pod-a", "pod-b", "pod-c", "pod-d", "pod-e"}

// step applies one random operation to both the index and the model and
// checks Match answers; it returns a description for failure messages.
func step(t testing.TB, x *Index, ref *reference, src source) string {
	f := ref.f
	w := testWorkers[src.intn(len(testWorkers))]
	if p := ref.pool; p != nil {
		// Half the operations go to a few busy workers, so that their
		// holdings interleave; the rest anywhere in the pool.
		w = p[src.intn(min(len(p), len(testWorkers)))]
		if src.intn(2) == 0 {
			w = p[src.intn(len(p))]
		}
	}
	m := GPU
	if src.intn(4) == 0 {
		m = Medium(1 + src.intn(NumMedia-1))
	}
	if ref.pool != nil && src.intn(12) == 0 {
		return bulkStep(t, x, ref, src, m)
	}
	switch op := src.intn(10); {
	case op < 5: // insert a piece of a chain, possibly out of order
		p := f.path(f.nodes[src.intn(len(f.nodes))])
		a := src.intn(len(p))
		b := a + 1 + src.intn(len(p)-a)
		parent := Root
		if a > 0 {
			parent = p[a-1]
		}
		if err := x.Insert(w, parent, p[a:b], m); err != nil {
			t.Fatalf("insert %s %v: %v", w, p[a:b], err)
		}
		ref.insert(w, p[a:b], m)
		return fmt.Sprintf("insert(%s, %x, %d blocks, %v)", w, parent, b-a, m)
	case op < 7: // remove some blocks, some unknown
		var hs []uint64
		for range 1 + src.intn(6) {
			if src.intn(5) == 0 {
				hs = append(hs, uint64(src.intn(1<<30))<<8|3) // absent
			} else {
				hs = append(hs, f.nodes[src.intn(len(f.nodes))])
			}
		}
		if src.intn(6) == 0 {
			m = AnyMedium
		}
		if src.intn(10) == 0 {
			w = "unknown-worker"
		}
		if err := x.Remove(w, hs, m); err != nil {
			t.Fatalf("remove: %v", err)
		}
		ref.remove(w, hs, m)
		return fmt.Sprintf("remove(%s, %d blocks, %v)", w, len(hs), m)
	case op < 8:
		if src.intn(3) != 0 {
			return "skip clear"
		}
		x.ClearWorker(w)
		delete(ref.held, w)
		return "clear(" + w + ")"
	default: // match a path, maybe with unknown blocks appended
		chain := f.path(f.nodes[src.intn(len(f.nodes))])
		if src.intn(4) == 0 {
			chain = append(chain, 0x77)
		}
		checkMatch(t, x, ref, chain)
		return "match"
	}
}

// bulkStep inserts a chain prefix for, or removes a chain's tail from, a
// run of up to the whole pool, so that holder sets of every size occur.
func bulkStep(t testing.TB, x *Index, ref *reference, src source, m Medium) string {
	p := ref.f.path(ref.f.nodes[src.intn(len(ref.f.nodes))])
	k := 1 + src.intn(len(ref.pool))
	if src.intn(3) == 0 {
		k = len(ref.pool)
	}
	first := src.intn(len(ref.pool))
	remove := src.intn(3) == 0
	cut := src.intn(len(p))
	for i := range k {
		w := ref.pool[(first+i)%len(ref.pool)]
		if remove {
			// Each worker evicts its own length of the tail.
			tail := p[min(len(p)-1, cut+i%7):]
			must(t, x.Remove(w, tail, m))
			ref.remove(w, tail, m)
			continue
		}
		must(t, x.Insert(w, Root, p, m))
		ref.insert(w, p, m)
	}
	return fmt.Sprintf("bulk(remove=%v, %d workers from %d, %d blocks, %v)", remove, k, first, len(p), m)
}

func checkMatch(t testing.TB, x *Index, ref *reference, chain []uint64) {
	t.Helper()
	got, err := x.Match(chain)
	if err != nil {
		t.Fatalf("match: %v", err)
	}
	want := ref.match(chain)
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("match of %d-block chain:\n got %+v\nwant %+v", len(chain), got, want)
	}
}

// checkAgainst compares every observable of the index with the model.
func checkAgainst(t testing.TB, x *Index, ref *reference) {
	t.Helper()
	checkInvariants(t, x)
	blocks, entries := ref.stats()
	st := x.Stats()
	if st.Blocks != blocks || st.Entries != entries {
		t.Fatalf("stats: blocks %d entries %d, model %d %d", st.Blocks, st.Entries, blocks, entries)
	}
	if d := ref.digest(); x.Digest() != d {
		t.Fatalf("digest %016x, model %016x", x.Digest(), d)
	}
	for _, ws := range x.Workers() {
		hm := ref.held[ws.Worker]
		if ws.Blocks != int64(len(hm)) {
			t.Fatalf("worker %s holds %d blocks, model %d", ws.Worker, ws.Blocks, len(hm))
		}
		for m := range Medium(NumMedia) {
			n := 0
			for _, v := range hm {
				if v&(1<<m) != 0 {
					n++
				}
			}
			if ws.Media[m] != int64(n) {
				t.Fatalf("worker %s holds %d blocks on %v, model %d", ws.Worker, ws.Media[m], m, n)
			}
		}
	}
	for _, h := range ref.f.nodes {
		checkMatch(t, x, ref, ref.f.path(h))
	}
}

// checkInvariants recomputes the index's internal bookkeeping from scratch.
func checkInvariants(t testing.TB, x *Index) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("invariant: "+format, args...)
	}
	var stored, held, entries, orphans int64
	var digest uint64
	refs := make(map[setID]int64)
	perWorker := make(map[int]*worker)
	for slot, w := range x.workers {
		if w != nil {
			perWorker[slot] = &worker{}
			if x.byName[w.name] != int32(slot) {
				fail("byName[%s] != %d", w.name, slot)
			}
		}
	}
	if len(perWorker) != len(x.byName) {
		fail("byName has %d workers, slots %d", len(x.byName), len(perWorker))
	}
	for id, s := range x.segs {
		if s == nil {
			continue
		}
		n := len(s.hashes)
		if n == 0 {
			fail("segment %d empty", id)
		}
		stored += int64(n)
		// Orphan flag: is the segment connected to the root?
		root := int32(id)
		for x.segs[root].parent >= 0 {
			root = x.segs[root].parent
		}
		if want := x.segs[root].parent == parentDetached; s.orphan != want {
			fail("segment %d orphan=%v, want %v", id, s.orphan, want)
		}
		if s.orphan {
			orphans += int64(n)
		}
		switch s.parent {
		case parentRoot:
			if s.parentHash != Root {
				fail("root segment %d has parent hash %x", id, s.parentHash)
			}
		case parentDetached:
			if _, ok := x.locs.Get(s.parentHash); ok {
				fail("detached segment %d waits for present block %x", id, s.parentHash)
			}
			if l := x.detached[s.parentHash]; int(s.childIdx) >= len(l) || l[s.childIdx] != int32(id) {
				fail("detached segment %d not in detached list", id)
			}
		default:
			p := x.segs[s.parent]
			if p == nil || int(s.parentOff) >= len(p.hashes) || p.hashes[s.parentOff] != s.parentHash {
				fail("segment %d parent link broken", id)
			}
			if int(s.childIdx) >= len(p.children) || p.children[s.childIdx] != int32(id) {
				fail("segment %d not in its parent's children", id)
			}
		}
		var live int32
		for o, h := range s.hashes {
			if l, _ := x.locs.Get(h); l != at(int32(id), o) {
				fail("locs[%x] wrong", h)
			}
			parent := x.parentOf(at(int32(id), o))
			holders := make(map[int32]bool)
			for m, ids := range s.sets {
				if ids == nil {
					continue
				}
				if len(ids) != n {
					fail("segment %d medium %d has %d holder sets, want %d", id, m, len(ids), n)
				}
				sid := ids[o]
				if sid != 0 {
					refs[sid]++
				}
				for _, slot := range x.hs.slots(sid) {
					wk := perWorker[int(slot)]
					if wk == nil {
						fail("holder set names free slot %d", slot)
					}
					wk.media[m]++
					holders[slot] = true
					digest += entryHash(blockKey(h, parent), x.workers[slot].nameHash, Medium(m))
				}
			}
			isLive := len(holders) > 0
			entries += int64(len(holders))
			for slot := range holders {
				perWorker[int(slot)].entries++
			}
			if isLive {
				live++
			} else if o == n-1 && !x.hasChildAt(s, o) {
				fail("segment %d keeps an unheld childless tail", id)
			}
		}
		if live != s.live {
			fail("segment %d live %d, counted %d", id, s.live, live)
		}
		held += int64(live)
		for i, c := range s.children {
			if cs := x.segs[c]; cs == nil || cs.parent != int32(id) || cs.childIdx != int32(i) {
				fail("segment %d child %d broken", id, c)
			}
		}
	}
	if stored != int64(x.locs.Len()) {
		fail("locs has %d blocks, segments %d", x.locs.Len(), stored)
	}
	if held != x.heldBlocks || entries != x.entries || orphans != x.orphanBlocks || digest != x.digest {
		fail("counters held %d/%d entries %d/%d orphans %d/%d digest %x/%x",
			x.heldBlocks, held, x.entries, entries, x.orphanBlocks, orphans, x.digest, digest)
	}
	for slot, wk := range perWorker {
		if got := x.workers[slot]; got.entries != wk.entries || got.media != wk.media {
			fail("worker %s counts %d %v, counted %d %v", got.name, got.entries, got.media, wk.entries, wk.media)
		}
	}
	for h, list := range x.detached {
		if len(list) == 0 {
			fail("empty detached list for %x", h)
		}
	}
	checkSetTable(t, &x.hs, refs)
}

// checkSetTable checks the holder set table against the references counted
// from the segments: every referenced set is live with that count, every
// live set is referenced, contents are sorted, distinct and findable, and
// bitmaps match slot lists.
func checkSetTable(t testing.TB, hs *setTable, refs map[setID]int64) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("holder sets: "+format, args...)
	}
	if hs.size(0) != 0 || hs.sets[0].refs != 0 {
		fail("set 0 is not the empty set")
	}
	live := 0
	seen := make(map[string]setID)
	for i := 1; i < len(hs.sets); i++ {
		id := setID(i)
		s := &hs.sets[i]
		if s.slots == nil {
			if refs[id] != 0 {
				fail("free set %d referenced %d times", id, refs[id])
			}
			continue
		}
		live++
		if s.refs != refs[id] || s.refs <= 0 {
			fail("set %d refs %d, counted %d", id, s.refs, refs[id])
		}
		var sum uint64
		for j, v := range s.slots {
			if j > 0 && v <= s.slots[j-1] {
				fail("set %d not strictly ascending: %v", id, s.slots)
			}
			sum += slotKey(v)
		}
		if sum != s.sum || hs.find(s.slots, sum) != id {
			fail("set %d not findable by its contents", id)
		}
		key := fmt.Sprint(s.slots)
		if other, dup := seen[key]; dup {
			fail("sets %d and %d hold the same slots", other, id)
		}
		seen[key] = id
		if (len(s.slots) >= bitmapMin) != (s.bits != nil) {
			fail("set %d of %d slots has bitmap %v", id, len(s.slots), s.bits != nil)
		}
		for _, v := range s.slots {
			if !hs.contains(id, v) {
				fail("set %d does not contain its slot %d", id, v)
			}
		}
		if s.bits != nil {
			n := 0
			for _, w := range s.bits {
				n += bits.OnesCount64(w)
			}
			if n != len(s.slots) {
				fail("set %d bitmap has %d bits, %d slots", id, n, len(s.slots))
			}
		}
	}
	if live != hs.live {
		fail("%d live sets, counter %d", live, hs.live)
	}
	if n := len(hs.sets) - 1 - live; n != len(hs.free) {
		fail("%d free sets, free list %d", n, len(hs.free))
	}
}
