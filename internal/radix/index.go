package radix

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Root is the parent hash of a chain's first block. No block may have hash 0.
const Root uint64 = 0

// Medium is where a worker holds a block.
type Medium uint8

// Storage media, fastest first.
const (
	GPU Medium = iota
	CPU
	Disk
	Remote
	// NumMedia is the number of media the index tracks.
	NumMedia = 4
	// AnyMedium, given to Remove, removes a block from every medium.
	AnyMedium Medium = 255
)

var mediumNames = [NumMedia]string{"GPU", "CPU", "DISK", "REMOTE"}

// String returns the medium's upper-case name.
func (m Medium) String() string {
	if m < NumMedia {
		return mediumNames[m]
	}
	if m == AnyMedium {
		return "ANY"
	}
	return fmt.Sprintf("Medium(%d)", uint8(m))
}

// ParseMedium maps an engine's medium name (case-insensitive "GPU", "CPU",
// "DISK", "REMOTE") to a Medium. The empty string means GPU, as engines that
// predate the medium field only ever stored on the GPU.
func ParseMedium(s string) (Medium, error) {
	if s == "" {
		return GPU, nil
	}
	for i, n := range mediumNames {
		if strings.EqualFold(s, n) {
			return Medium(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrBadMedium, s)
}

// Errors returned by the index. Callers branch on them with errors.Is.
var (
	ErrChainTooLong   = errors.New("radix: chain longer than the configured limit")
	ErrZeroHash       = errors.New("radix: block hash 0 is reserved for the root")
	ErrParentMismatch = errors.New("radix: block already indexed under a different parent")
	ErrBadMedium      = errors.New("radix: unknown medium")
	ErrBadWorker      = errors.New("radix: invalid worker name")
	ErrTooManyWorkers = errors.New("radix: too many workers")
)

// Options bound the index. Zero fields take the defaults.
type Options struct {
	// MaxChain is the longest chain Insert, Remove and Match accept, in blocks
	// (default 65,536: a million tokens at 16 tokens per block).
	MaxChain int
	// MaxOrphanBlocks bounds the blocks kept in detached (out-of-order) pieces
	// (default 1,048,576).
	MaxOrphanBlocks int
	// MaxWorkers bounds the number of distinct workers (default 65,536). A
	// block's cost follows the workers that hold it, not this bound.
	MaxWorkers int
}

// Defaults for Options.
const (
	DefaultMaxChain        = 1 << 16
	DefaultMaxOrphanBlocks = 1 << 20
	DefaultMaxWorkers      = 1 << 16
	maxWorkerName          = 1 << 10
)

func (o Options) withDefaults() Options {
	if o.MaxChain <= 0 {
		o.MaxChain = DefaultMaxChain
	}
	if o.MaxOrphanBlocks <= 0 {
		o.MaxOrphanBlocks = DefaultMaxOrphanBlocks
	}
	if o.MaxWorkers <= 0 {
		o.MaxWorkers = DefaultMaxWorkers
	}
	return o
}

// writeChunk is how many blocks a writer processes before it releases the
// data lock so that waiting readers can run.
const writeChunk = 256

// Segment parent markers.
const (
	parentRoot     int32 = -1
	parentDetached int32 = -2
)

// segment is a run of blocks, each the parent of the next.
type segment struct {
	hashes []uint64
	// sets[m] holds, for each block, the holder set of the workers that
	// hold it on medium m (0: none); nil when no block of the segment was
	// ever held on m.
	sets       [NumMedia][]setID
	parentHash uint64 // parent of hashes[0]; Root for chains' first blocks
	parent     int32  // parent segment, parentRoot or parentDetached
	parentOff  int32  // offset of the parent block in the parent segment
	children   []int32
	childIdx   int32  // index in the parent's children (or the detached list)
	live       int32  // blocks held by some worker on some medium
	orphan     bool   // not connected to the root
	created    uint64 // creation sequence number, for oldest-first eviction
}

// location packs a segment id (high 32 bits) and an offset.
type location uint64

func at(seg int32, off int) location { return location(uint64(uint32(seg))<<32 | uint64(uint32(off))) }
func (l location) seg() int32        { return int32(l >> 32) }
func (l location) off() int          { return int(uint32(l)) }

type worker struct {
	name     string
	nameHash uint64
	entries  int64           // blocks held on any medium
	media    [NumMedia]int64 // blocks held per medium
}

type orphanRef struct {
	seg     int32
	created uint64
}

// Index is the block-prefix index. The zero value is not usable; call New.
type Index struct {
	opts Options

	wmu sync.Mutex   // serialises writers
	mu  sync.RWMutex // guards everything below against readers

	hs       setTable // interned holder sets
	segs     []*segment
	free     []int32
	locs     blockTable
	detached map[uint64][]int32 // missing parent hash -> detached segments
	orphanQ  []orphanRef        // detached roots, oldest first (may be stale)
	created  uint64

	workers []*worker // by slot; nil when free
	byName  map[string]int32

	usedMedia    uint8 // bit m set once any block was held on medium m
	heldBlocks   int64
	entries      int64
	orphanBlocks int64
	dropped      int64
	digest       uint64
}

// New returns an empty index.
func New(opts Options) *Index {
	return &Index{
		opts:     opts.withDefaults(),
		hs:       newSetTable(),
		locs:     newBlockTable(),
		detached: make(map[uint64][]int32),
		byName:   make(map[string]int32),
	}
}

// Options returns the index's effective options.
func (x *Index) Options() Options { return x.opts }

// Insert records that worker holds the blocks hashes on medium m, hashes[0]
// hanging under parent (Root for a chain's first block) and each further block
// under the one before it. Blocks already recorded are left as they are, so
// repeating an insert changes nothing. A piece whose parent is unknown is kept
// detached until its parent arrives (see the package documentation). An empty
// piece is a no-op.
//
// If a block is already indexed under a different parent, Insert stops there and
// returns ErrParentMismatch; the blocks before it stay applied.
func (x *Index) Insert(workerName string, parent uint64, hashes []uint64, m Medium) error {
	if len(hashes) == 0 {
		return nil
	}
	if err := x.checkPiece(hashes); err != nil {
		return err
	}
	if m >= NumMedia {
		return fmt.Errorf("insert: %w: %d", ErrBadMedium, m)
	}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()

	slot, err := x.slotFor(workerName)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	prev := parent
	cur, have := x.locs.Get(parent)
	have = have && parent != Root
	for i, h := range hashes {
		if i%writeChunk == writeChunk-1 {
			x.yieldToReaders()
		}
		l, ok := x.nextInRun(cur, have, h)
		if !ok {
			l, ok = x.locs.Get(h)
		}
		switch {
		case ok:
			if p := x.parentOf(l); p != prev {
				return fmt.Errorf("insert: %w: block %016x (position %d) has parent %016x, insert names %016x",
					ErrParentMismatch, h, i, p, prev)
			}
		case h == prev || (have && x.wouldCycle(h, cur.seg())):
			return fmt.Errorf("insert: %w: block %016x (position %d) would be its own ancestor",
				ErrParentMismatch, h, i)
		default:
			l = x.addBlock(h, prev, cur, have)
		}
		x.set(l, slot, m, prev)
		cur, have, prev = l, true, h
	}
	x.evictOrphans()
	return nil
}

// Remove records that worker no longer holds hashes on medium m (AnyMedium:
// on any medium). Absent blocks, blocks the worker does not hold and unknown
// workers are no-ops.
func (x *Index) Remove(workerName string, hashes []uint64, m Medium) error {
	if len(hashes) > x.opts.MaxChain {
		return fmt.Errorf("remove: %w: %d blocks, limit %d", ErrChainTooLong, len(hashes), x.opts.MaxChain)
	}
	if m >= NumMedia && m != AnyMedium {
		return fmt.Errorf("remove: %w: %d", ErrBadMedium, m)
	}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.byName[workerName]
	if !ok {
		return nil
	}
	for i, h := range hashes {
		if i%writeChunk == writeChunk-1 {
			x.yieldToReaders()
		}
		l, ok := x.locs.Get(h)
		if !ok {
			continue
		}
		if m == AnyMedium {
			for mm := Medium(0); mm < NumMedia; mm++ {
				x.unset(l, slot, mm)
			}
		} else {
			x.unset(l, slot, m)
		}
		x.collect(l)
	}
	return nil
}

// ClearWorker removes every block the worker holds and forgets the worker. An
// unknown worker is a no-op.
func (x *Index) ClearWorker(workerName string) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.byName[workerName]
	if !ok {
		return
	}
	wk := x.workers[slot]
	done := 0
	for id := 0; id < len(x.segs) && wk.entries > 0; id++ {
		s := x.segs[id]
		if s == nil {
			continue
		}
		touched := false
		for m := Medium(0); m < NumMedia; m++ {
			ids := s.sets[m]
			if ids == nil {
				continue
			}
			// Neighbouring blocks mostly share a set: test each set once.
			last, hit := setID(0), false
			for o, sid := range ids {
				if sid != last {
					last, hit = sid, x.hs.contains(sid, slot)
				}
				if hit {
					x.unset(at(int32(id), o), slot, m)
					touched = true
				}
			}
		}
		done += len(s.hashes)
		if touched {
			x.collectSegment(int32(id))
		}
		if done >= writeChunk*16 {
			done = 0
			x.yieldToReaders()
		}
	}
	x.workers[slot] = nil
	delete(x.byName, workerName)
}

// yieldToReaders lets readers waiting on the data lock run. Only writers,
// which also hold wmu, call it, so no other writer can interleave.
func (x *Index) yieldToReaders() {
	x.mu.Unlock()
	x.mu.Lock()
}

func (x *Index) checkPiece(hashes []uint64) error {
	if len(hashes) > x.opts.MaxChain {
		return fmt.Errorf("insert: %w: %d blocks, limit %d", ErrChainTooLong, len(hashes), x.opts.MaxChain)
	}
	for i, h := range hashes {
		if h == Root {
			return fmt.Errorf("insert: %w (position %d)", ErrZeroHash, i)
		}
	}
	return nil
}

// slotFor returns the worker's slot, assigning the lowest free one to a new
// worker (deterministically, so replicas agree).
func (x *Index) slotFor(name string) (int32, error) {
	if s, ok := x.byName[name]; ok {
		return s, nil
	}
	if name == "" || len(name) > maxWorkerName {
		return 0, fmt.Errorf("%w: %q (1 to %d bytes)", ErrBadWorker, name, maxWorkerName)
	}
	slot := -1
	for i, w := range x.workers {
		if w == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		if len(x.workers) >= x.opts.MaxWorkers {
			return 0, fmt.Errorf("%w: limit %d", ErrTooManyWorkers, x.opts.MaxWorkers)
		}
		slot = len(x.workers)
		x.workers = append(x.workers, nil)
	}
	x.workers[slot] = &worker{name: name, nameHash: hashString(name)}
	x.byName[name] = int32(slot)
	return int32(slot), nil
}

// wouldCycle reports whether creating block h under segment seg would close
// a cycle: a detached segment waiting for h is seg or one of its ancestors.
// Content hashes make this impossible; it guards against corrupt input.
func (x *Index) wouldCycle(h uint64, seg int32) bool {
	if len(x.detached) == 0 {
		return false
	}
	waiting := x.detached[h]
	if len(waiting) == 0 {
		return false
	}
	for id := seg; id >= 0; id = x.segs[id].parent {
		for _, c := range waiting {
			if c == id {
				return true
			}
		}
	}
	return false
}

// nextInRun returns the location of block h if it is the block after cur in
// cur's segment (have: cur is a block's location). A piece inserted again
// by another holder walks a run the index already has: each block is then
// found next to the one before it, in the segment's contiguous hash array,
// instead of by a look-up in the block table, whose random accesses miss
// the cache once the index outgrows it. The answer is the table's: a hash
// is stored at one location only.
func (x *Index) nextInRun(cur location, have bool, h uint64) (location, bool) {
	if !have {
		return 0, false
	}
	s, o := x.segs[cur.seg()], cur.off()+1
	if o < len(s.hashes) && s.hashes[o] == h {
		return at(cur.seg(), o), true
	}
	return 0, false
}

// parentOf returns the parent hash of the block at l.
func (x *Index) parentOf(l location) uint64 {
	s := x.segs[l.seg()]
	if o := l.off(); o > 0 {
		return s.hashes[o-1]
	}
	return s.parentHash
}

// addBlock creates block h under prev. cur is prev's location when have is
// true; otherwise prev is the root or unknown.
func (x *Index) addBlock(h, prev uint64, cur location, have bool) location {
	var id int32
	if have && cur.off() == len(x.segs[cur.seg()].hashes)-1 {
		id = cur.seg() // extend the run prev ends
	} else {
		id = x.newSegment(prev, cur, have)
	}
	s := x.segs[id]
	o := len(s.hashes)
	s.hashes = append(s.hashes, h)
	for m, ids := range s.sets {
		if ids != nil {
			s.sets[m] = append(ids, 0)
		}
	}
	if s.orphan {
		x.orphanBlocks++
	}
	l := at(id, o)
	x.locs.Put(h, l)
	if len(x.detached) == 0 {
		return l
	}
	if waiting, ok := x.detached[h]; ok {
		delete(x.detached, h)
		for _, c := range waiting {
			x.attach(c, l, s.orphan)
		}
	}
	return l
}

func (x *Index) newSegment(parentHash uint64, parent location, have bool) int32 {
	x.created++
	s := &segment{parentHash: parentHash, created: x.created}
	var id int32
	if n := len(x.free); n > 0 {
		id = x.free[n-1]
		x.free = x.free[:n-1]
		x.segs[id] = s
	} else {
		id = int32(len(x.segs))
		x.segs = append(x.segs, s)
	}
	switch {
	case have:
		p := x.segs[parent.seg()]
		s.parent, s.parentOff = parent.seg(), int32(parent.off())
		s.childIdx = int32(len(p.children))
		s.orphan = p.orphan
		p.children = append(p.children, id)
	case parentHash == Root:
		s.parent = parentRoot
	default:
		s.parent = parentDetached
		s.orphan = true
		list := x.detached[parentHash]
		s.childIdx = int32(len(list))
		x.detached[parentHash] = append(list, id)
		x.orphanQ = append(x.orphanQ, orphanRef{seg: id, created: s.created})
	}
	return id
}

// attach hangs detached segment c under the block at l.
func (x *Index) attach(c int32, l location, orphan bool) {
	s, p := x.segs[c], x.segs[l.seg()]
	s.parent, s.parentOff = l.seg(), int32(l.off())
	s.childIdx = int32(len(p.children))
	p.children = append(p.children, c)
	if !orphan {
		x.setOrphan(c, false)
	}
}

// setOrphan marks a subtree connected (or not) and keeps orphanBlocks exact.
func (x *Index) setOrphan(id int32, orphan bool) {
	stack := []int32{id}
	for len(stack) > 0 {
		s := x.segs[stack[len(stack)-1]]
		stack = stack[:len(stack)-1]
		if s.orphan == orphan {
			continue
		}
		s.orphan = orphan
		if orphan {
			x.orphanBlocks += int64(len(s.hashes))
		} else {
			x.orphanBlocks -= int64(len(s.hashes))
		}
		stack = append(stack, s.children...)
	}
}

// set marks the block at l held by slot on medium m.
func (x *Index) set(l location, slot int32, m Medium, parent uint64) {
	s, o := x.segs[l.seg()], l.off()
	ids := s.sets[m]
	if ids == nil {
		ids = make([]setID, len(s.hashes), cap(s.hashes))
		s.sets[m] = ids
	} else if x.hs.contains(ids[o], slot) {
		return
	}
	heldElsewhere, live := x.heldBy(s, o, slot)
	old := ids[o]
	nw := x.hs.with(old, slot)
	x.hs.ref(nw)
	x.hs.unref(old)
	ids[o] = nw
	wk := x.workers[slot]
	wk.media[m]++
	if !heldElsewhere {
		wk.entries++
		x.entries++
	}
	if !live {
		s.live++
		x.heldBlocks++
	}
	x.usedMedia |= 1 << m
	x.digest += entryHash(blockKey(s.hashes[o], parent), wk.nameHash, m)
}

// unset removes slot from the holders of the block at l on medium m.
func (x *Index) unset(l location, slot int32, m Medium) {
	s, o := x.segs[l.seg()], l.off()
	ids := s.sets[m]
	if ids == nil || !x.hs.contains(ids[o], slot) {
		return
	}
	old := ids[o]
	nw := x.hs.without(old, slot)
	x.hs.ref(nw)
	x.hs.unref(old)
	ids[o] = nw
	heldElsewhere, live := x.heldBy(s, o, slot)
	wk := x.workers[slot]
	wk.media[m]--
	if !heldElsewhere {
		wk.entries--
		x.entries--
	}
	if !live {
		s.live--
		x.heldBlocks--
	}
	x.digest -= entryHash(blockKey(s.hashes[o], x.parentOf(l)), wk.nameHash, m)
}

// heldBy reports whether slot holds the block at offset o on any medium, and
// whether anyone holds it on any medium.
func (x *Index) heldBy(s *segment, o int, slot int32) (held, live bool) {
	for _, ids := range s.sets {
		if ids == nil || ids[o] == 0 {
			continue
		}
		live = true
		if !held && x.hs.contains(ids[o], slot) {
			held = true
		}
	}
	return held, live
}

func (x *Index) blockLive(s *segment, o int) bool {
	for _, ids := range s.sets {
		if ids != nil && ids[o] != 0 {
			return true
		}
	}
	return false
}

// collect drops the block at l from the structure if nothing holds it and
// nothing hangs under it, along with any ancestors that become so.
func (x *Index) collect(l location) {
	s := x.segs[l.seg()]
	if l.off() == len(s.hashes)-1 && !x.blockLive(s, l.off()) {
		x.collectSegment(l.seg())
	}
}

// collectSegment trims a segment's unheld tail blocks that have no children;
// an emptied segment is unlinked and its parent trimmed in turn.
func (x *Index) collectSegment(id int32) {
	for {
		s := x.segs[id]
		n := len(s.hashes)
		for n > 0 && !x.blockLive(s, n-1) && !x.hasChildAt(s, n-1) {
			n--
			x.locs.Delete(s.hashes[n])
			if s.orphan {
				x.orphanBlocks--
			}
		}
		if n == len(s.hashes) {
			return
		}
		s.hashes = s.hashes[:n]
		for m, ids := range s.sets {
			if ids != nil {
				s.sets[m] = ids[:n]
			}
		}
		if n > 0 {
			return
		}
		parent := s.parent
		x.unlink(id)
		if parent < 0 {
			return
		}
		id = parent
	}
}

func (x *Index) hasChildAt(s *segment, o int) bool {
	for _, c := range s.children {
		if int(x.segs[c].parentOff) == o {
			return true
		}
	}
	return false
}

// unlink removes an empty segment from its parent's children (or the detached
// set) and frees its id.
func (x *Index) unlink(id int32) {
	s := x.segs[id]
	var list []int32
	switch s.parent {
	case parentRoot:
	case parentDetached:
		list = x.detached[s.parentHash]
		list = swapRemove(x.segs, list, s.childIdx)
		if len(list) == 0 {
			delete(x.detached, s.parentHash)
		} else {
			x.detached[s.parentHash] = list
		}
	default:
		p := x.segs[s.parent]
		p.children = swapRemove(x.segs, p.children, s.childIdx)
	}
	x.segs[id] = nil
	x.free = append(x.free, id)
}

// swapRemove removes list[i], moving the last element into its place and
// fixing that segment's childIdx.
func swapRemove(segs []*segment, list []int32, i int32) []int32 {
	last := int32(len(list) - 1)
	if i != last {
		list[i] = list[last]
		segs[list[i]].childIdx = i
	}
	return list[:last]
}

// evictOrphans drops the oldest detached subtrees while detached blocks
// exceed the limit.
func (x *Index) evictOrphans() {
	for x.orphanBlocks > int64(x.opts.MaxOrphanBlocks) && len(x.orphanQ) > 0 {
		ref := x.orphanQ[0]
		x.orphanQ = x.orphanQ[1:]
		s := x.segs[ref.seg]
		if s == nil || s.created != ref.created || s.parent != parentDetached {
			continue // attached or removed since
		}
		x.dropSubtree(ref.seg)
	}
	if len(x.orphanQ) > 0 && cap(x.orphanQ) > 4*len(x.orphanQ)+64 {
		x.orphanQ = append([]orphanRef(nil), x.orphanQ...)
	}
}

// dropSubtree removes every entry and block of a detached subtree.
func (x *Index) dropSubtree(root int32) {
	var order []int32
	stack := []int32{root}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		order = append(order, id)
		stack = append(stack, x.segs[id].children...)
	}
	// Children first, so each segment is a leaf when it is unlinked.
	for i := len(order) - 1; i >= 0; i-- {
		id := order[i]
		s := x.segs[id]
		var holders []int32
		for m := Medium(0); m < NumMedia; m++ {
			ids := s.sets[m]
			for o := range ids {
				// A copy: unset may change a set held by this block
				// alone in place.
				holders = append(holders[:0], x.hs.slots(ids[o])...)
				for _, slot := range holders {
					x.unset(at(id, o), slot, m)
				}
			}
		}
		for _, h := range s.hashes {
			x.locs.Delete(h)
		}
		x.orphanBlocks -= int64(len(s.hashes))
		x.dropped += int64(len(s.hashes))
		s.hashes = s.hashes[:0]
		s.children = nil
		x.unlink(id)
	}
}
