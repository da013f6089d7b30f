package radix

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/bits"
	"slices"
)

// Snapshot format, version 2. All integers are little-endian; "uvarint" is
// encoding/binary's unsigned varint.
//
//	header   magic "KVDIRRDX" | u16 version (2) | u16 flags (0) | u32 holder sets K | u64 stored blocks
//	worker   'W' | u32 slot | uvarint name length | name             (every worker, before any set)
//	set      'H' | uvarint c (1..workers) | uvarint first slot | c-1 × uvarint (slot - previous slot - 1)
//	         (K records, numbered 1..K in order, each a distinct set of known slots, before any segment)
//	segment  'S' | u64 parent hash | uvarint n (1..65,536) | u8 media bitmap |
//	         n × u64 block hashes | for each medium in the bitmap, lowest first: n × u32 set number (0: none)
//	end      'E' | uvarint workers | uvarint stored blocks | uvarint entries | u64 digest | uvarint dropped orphan blocks
//	trailer  u32 CRC-32C (Castagnoli) of every byte from the magic through the end record
//
// Version 1 differs in the header's third field (u32 mask words W), has no
// set records, and stores for each medium in a segment's bitmap n × W × u64
// mask words (bit i of word k: the worker in slot 64k+i holds the block).
// This build writes version 2 and reads both; the digest is defined over
// (block, parent, worker, medium) entries, so it is the same whichever format
// the contents came from.
//
// Segment records come parents first: a record's parent hash is Root, a block
// of an earlier record, or (for a detached piece) a hash the snapshot lacks. A
// run longer than 65,536 blocks is written as several records.
const (
	snapshotMagic   = "KVDIRRDX"
	snapshotVersion = 2
	maxRecordBlocks = 1 << 16
)

// ErrCorruptSnapshot is returned, wrapped with details, for any snapshot that
// is truncated, fails its checksum or is inconsistent.
var ErrCorruptSnapshot = errors.New("radix: corrupt snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crcWriter checksums what passes through it.
type crcWriter struct {
	w   io.Writer
	crc hash.Hash32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// WriteSnapshot streams the index to w and returns the bytes written. It
// holds the writer lock, so concurrent writers wait while readers go on.
func (x *Index) WriteSnapshot(w io.Writer) (int64, error) {
	x.wmu.Lock()
	defer x.wmu.Unlock()
	cw := &crcWriter{w: w, crc: crc32.New(castagnoli)}
	bw := bufio.NewWriterSize(cw, 1<<18)
	if err := x.writeBody(bw); err != nil {
		return cw.n, fmt.Errorf("write snapshot: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return cw.n, fmt.Errorf("write snapshot: %w", err)
	}
	var tr [4]byte
	binary.LittleEndian.PutUint32(tr[:], cw.crc.Sum32())
	if _, err := cw.Write(tr[:]); err != nil {
		return cw.n, fmt.Errorf("write snapshot trailer: %w", err)
	}
	return cw.n, nil
}

func (x *Index) writeBody(bw *bufio.Writer) error {
	buf := make([]byte, 0, 1<<16)
	buf = append(buf, snapshotMagic...)
	buf = binary.LittleEndian.AppendUint16(buf, snapshotVersion)
	buf = binary.LittleEndian.AppendUint16(buf, 0)
	// Referenced sets get dense numbers 1..K.
	number := make([]uint32, len(x.hs.sets))
	var nsets uint32
	for id := range x.hs.sets {
		if id != 0 && x.hs.sets[id].refs > 0 {
			nsets++
			number[id] = nsets
		}
	}
	buf = binary.LittleEndian.AppendUint32(buf, nsets)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(x.locs.Len()))
	nworkers := 0
	for slot, wk := range x.workers {
		if wk == nil {
			continue
		}
		nworkers++
		buf = append(buf, 'W')
		buf = binary.LittleEndian.AppendUint32(buf, uint32(slot))
		buf = binary.AppendUvarint(buf, uint64(len(wk.name)))
		buf = append(buf, wk.name...)
	}
	flush := func() error {
		_, err := bw.Write(buf)
		buf = buf[:0]
		return err
	}
	for id := range x.hs.sets {
		if number[id] == 0 {
			continue
		}
		slots := x.hs.sets[id].slots
		buf = append(buf, 'H')
		buf = binary.AppendUvarint(buf, uint64(len(slots)))
		prev := int32(-1)
		for _, v := range slots {
			buf = binary.AppendUvarint(buf, uint64(v-prev-1))
			prev = v
			if len(buf) > cap(buf)-16 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	// Parents first: roots and detached roots, then depth first.
	var stack []int32
	for id, s := range x.segs {
		if s != nil && s.parent < 0 {
			stack = append(stack, int32(id))
		}
	}
	for len(stack) > 0 {
		s := x.segs[stack[len(stack)-1]]
		stack = stack[:len(stack)-1]
		stack = append(stack, s.children...)
		for start := 0; start < len(s.hashes); start += maxRecordBlocks {
			end := min(start+maxRecordBlocks, len(s.hashes))
			parent := s.parentHash
			if start > 0 {
				parent = s.hashes[start-1]
			}
			var media uint8
			for m, ids := range s.sets {
				if ids != nil {
					media |= 1 << m
				}
			}
			buf = append(buf, 'S')
			buf = binary.LittleEndian.AppendUint64(buf, parent)
			buf = binary.AppendUvarint(buf, uint64(end-start))
			buf = append(buf, media)
			if err := appendWords(&buf, s.hashes[start:end], flush); err != nil {
				return err
			}
			for _, ids := range s.sets {
				if ids != nil {
					if err := appendSets(&buf, ids[start:end], number, flush); err != nil {
						return err
					}
				}
			}
		}
	}
	buf = append(buf, 'E')
	buf = binary.AppendUvarint(buf, uint64(nworkers))
	buf = binary.AppendUvarint(buf, uint64(x.locs.Len()))
	buf = binary.AppendUvarint(buf, uint64(x.entries))
	buf = binary.LittleEndian.AppendUint64(buf, x.digest)
	buf = binary.AppendUvarint(buf, uint64(x.dropped))
	return flush()
}

// appendWords appends words to *buf, flushing whenever the buffer fills.
func appendWords(buf *[]byte, words []uint64, flush func() error) error {
	for len(words) > 0 {
		room := (cap(*buf) - len(*buf)) / 8
		if room == 0 {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		n := min(room, len(words))
		b := *buf
		for _, v := range words[:n] {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
		*buf = b
		words = words[n:]
	}
	return nil
}

// appendSets appends the set numbers of ids to *buf, flushing whenever the
// buffer fills.
func appendSets(buf *[]byte, ids []setID, number []uint32, flush func() error) error {
	for len(ids) > 0 {
		room := (cap(*buf) - len(*buf)) / 4
		if room == 0 {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		n := min(room, len(ids))
		b := *buf
		for _, id := range ids[:n] {
			b = binary.LittleEndian.AppendUint32(b, number[id])
		}
		*buf = b
		ids = ids[n:]
	}
	return nil
}

// crcReader checksums what the parser consumes.
type crcReader struct {
	r   *bufio.Reader
	crc uint32
	buf []byte
}

func (c *crcReader) full(n int) ([]byte, error) {
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
	b := c.buf[:n]
	if _, err := io.ReadFull(c.r, b); err != nil {
		return nil, truncated(err)
	}
	c.crc = crc32.Update(c.crc, castagnoli, b)
	return b, nil
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err != nil {
		return 0, truncated(err)
	}
	c.crc = crc32.Update(c.crc, castagnoli, []byte{b})
	return b, nil
}

func (c *crcReader) uvarint(what string, limit uint64) (uint64, error) {
	v, err := binary.ReadUvarint(c)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrCorruptSnapshot, what, err)
	}
	if v > limit {
		return 0, fmt.Errorf("%w: %s %d exceeds %d", ErrCorruptSnapshot, what, v, limit)
	}
	return v, nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated", ErrCorruptSnapshot)
	}
	return err
}

// ReadSnapshot builds a new index from a snapshot written by WriteSnapshot.
// It checks the checksum, every structural rule and the recorded counters and
// digest, and returns ErrCorruptSnapshot (wrapped) when any fails; nothing is
// returned half built. When r is a *bufio.Reader it consumes exactly the
// snapshot's bytes; any other reader may be read ahead of the snapshot's end.
func ReadSnapshot(r io.Reader, opts Options) (*Index, error) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 1<<18)
	}
	x := New(opts)
	if err := x.readBody(&crcReader{r: br}); err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	return x, nil
}

// snapshotReader is the state of one snapshot being read.
type snapshotReader struct {
	c       *crcReader
	version uint16
	w       int     // version 1: mask words per block
	sets    []setID // version 2: set number -> interned set (0 -> 0)
	nsets   int     // version 2: set records announced
	slots   []int32 // version 1: scratch for a mask's slots
}

func (x *Index) readBody(c *crcReader) error {
	h, err := c.full(24)
	if err != nil {
		return err
	}
	if string(h[:8]) != snapshotMagic {
		return fmt.Errorf("%w: bad magic %q", ErrCorruptSnapshot, h[:8])
	}
	rd := &snapshotReader{c: c, version: binary.LittleEndian.Uint16(h[8:])}
	if rd.version != 1 && rd.version != snapshotVersion {
		return fmt.Errorf("%w: unsupported version %d (this build reads 1 to %d)", ErrCorruptSnapshot, rd.version, snapshotVersion)
	}
	if f := binary.LittleEndian.Uint16(h[10:]); f != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrCorruptSnapshot, f)
	}
	third := int(binary.LittleEndian.Uint32(h[12:]))
	if rd.version == 1 {
		if third < 1 || third > (x.opts.MaxWorkers+63)/64 {
			return fmt.Errorf("%w: %d mask words per block (limit %d workers)", ErrCorruptSnapshot, third, x.opts.MaxWorkers)
		}
		rd.w = third
	} else {
		rd.nsets = third
		rd.sets = make([]setID, 1, min(third, 1<<16)+1)
	}
	blocks := binary.LittleEndian.Uint64(h[16:]) // h is reused by later reads
	for {
		tag, err := c.ReadByte()
		if err != nil {
			return err
		}
		switch tag {
		case 'W':
			err = x.readWorker(rd)
		case 'H':
			err = x.readSet(rd)
		case 'S':
			if len(rd.sets) != rd.nsets+1 && rd.version != 1 {
				return fmt.Errorf("%w: %d holder sets announced, %d before the first segment", ErrCorruptSnapshot, rd.nsets, len(rd.sets)-1)
			}
			err = x.readSegment(rd)
		case 'E':
			if len(rd.sets) != rd.nsets+1 && rd.version != 1 {
				return fmt.Errorf("%w: %d holder sets announced, %d read", ErrCorruptSnapshot, rd.nsets, len(rd.sets)-1)
			}
			if err := x.readEnd(c); err != nil {
				return err
			}
			if blocks != uint64(x.locs.Len()) {
				return fmt.Errorf("%w: header names %d blocks, %d read", ErrCorruptSnapshot, blocks, x.locs.Len())
			}
			return nil
		default:
			err = fmt.Errorf("%w: unknown record tag %#x", ErrCorruptSnapshot, tag)
		}
		if err != nil {
			return err
		}
	}
}

func (x *Index) readWorker(rd *snapshotReader) error {
	c := rd.c
	if len(x.segs) > 0 || len(rd.sets) > 1 {
		return fmt.Errorf("%w: worker record after sets or segments", ErrCorruptSnapshot)
	}
	b, err := c.full(4)
	if err != nil {
		return err
	}
	slot := int(binary.LittleEndian.Uint32(b))
	n, err := c.uvarint("worker name length", maxWorkerName)
	if err != nil {
		return err
	}
	nb, err := c.full(int(n))
	if err != nil {
		return err
	}
	name := string(nb)
	if slot >= x.opts.MaxWorkers || (rd.version == 1 && slot >= rd.w*64) {
		return fmt.Errorf("%w: worker slot %d out of range", ErrCorruptSnapshot, slot)
	}
	if _, dup := x.byName[name]; dup || name == "" {
		return fmt.Errorf("%w: empty or repeated worker name %q", ErrCorruptSnapshot, name)
	}
	for len(x.workers) <= slot {
		x.workers = append(x.workers, nil)
	}
	if x.workers[slot] != nil {
		return fmt.Errorf("%w: worker slot %d repeated", ErrCorruptSnapshot, slot)
	}
	x.workers[slot] = &worker{name: name, nameHash: hashString(name)}
	x.byName[name] = int32(slot)
	return nil
}

// knownSlot reports whether slot names a worker read so far.
func (x *Index) knownSlot(slot int64) bool {
	return slot >= 0 && slot < int64(len(x.workers)) && x.workers[slot] != nil
}

func (x *Index) readSet(rd *snapshotReader) error {
	c := rd.c
	if rd.version == 1 {
		return fmt.Errorf("%w: holder set record in a version 1 snapshot", ErrCorruptSnapshot)
	}
	if len(x.segs) > 0 {
		return fmt.Errorf("%w: holder set record after segments", ErrCorruptSnapshot)
	}
	if len(rd.sets) > rd.nsets {
		return fmt.Errorf("%w: more than the %d holder sets announced", ErrCorruptSnapshot, rd.nsets)
	}
	n, err := c.uvarint("holder set size", uint64(len(x.byName)))
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: empty holder set", ErrCorruptSnapshot)
	}
	slots := make([]int32, n)
	prev := int64(-1)
	for i := range slots {
		d, err := c.uvarint("holder set slot", 1<<31)
		if err != nil {
			return err
		}
		v := prev + 1 + int64(d)
		if !x.knownSlot(v) {
			return fmt.Errorf("%w: holder set names an unknown worker slot %d", ErrCorruptSnapshot, v)
		}
		slots[i], prev = int32(v), v
	}
	var sum uint64
	for _, v := range slots {
		sum += slotKey(v)
	}
	if x.hs.find(slots, sum) != 0 {
		return fmt.Errorf("%w: holder set repeated", ErrCorruptSnapshot)
	}
	rd.sets = append(rd.sets, x.hs.intern(slots, sum))
	return nil
}

func (x *Index) readSegment(rd *snapshotReader) error {
	c := rd.c
	b, err := c.full(8)
	if err != nil {
		return err
	}
	prev := binary.LittleEndian.Uint64(b)
	n64, err := c.uvarint("segment length", maxRecordBlocks)
	if err != nil {
		return err
	}
	n := int(n64)
	if n == 0 {
		return fmt.Errorf("%w: empty segment record", ErrCorruptSnapshot)
	}
	media, err := c.ReadByte()
	if err != nil {
		return err
	}
	if media >= 1<<NumMedia {
		return fmt.Errorf("%w: media bitmap %#x", ErrCorruptSnapshot, media)
	}
	hb, err := c.full(8 * n)
	if err != nil {
		return err
	}
	// The record becomes a segment of its own; it is linked to its parent
	// and entered in the block table once the whole snapshot is read (see
	// link).
	x.created++
	seg := &segment{parentHash: prev, created: x.created, hashes: make([]uint64, n)}
	for i := range seg.hashes {
		if seg.hashes[i] = binary.LittleEndian.Uint64(hb[8*i:]); seg.hashes[i] == Root {
			return fmt.Errorf("%w: %w", ErrCorruptSnapshot, ErrZeroHash)
		}
	}
	for m := Medium(0); m < NumMedia; m++ {
		if media&(1<<m) == 0 {
			continue
		}
		var err error
		if rd.version == 1 {
			seg.sets[m], err = x.readMasksV1(rd, n)
		} else {
			seg.sets[m], err = x.readSetNumbers(rd, n)
		}
		if err != nil {
			return err
		}
	}
	x.segs = append(x.segs, seg)
	return nil
}

// readSetNumbers reads a version 2 segment's n set numbers for one medium.
func (x *Index) readSetNumbers(rd *snapshotReader, n int) ([]setID, error) {
	b, err := rd.c.full(4 * n)
	if err != nil {
		return nil, err
	}
	ids := make([]setID, n)
	for i := range ids {
		v := binary.LittleEndian.Uint32(b[4*i:])
		if int64(v) >= int64(len(rd.sets)) {
			return nil, fmt.Errorf("%w: set number %d of %d", ErrCorruptSnapshot, v, len(rd.sets)-1)
		}
		ids[i] = rd.sets[v]
	}
	return ids, nil
}

// readMasksV1 reads a version 1 segment's n × W mask words for one medium and
// turns each block's mask into an interned holder set. Neighbouring blocks
// mostly share a mask, which is then interned once.
func (x *Index) readMasksV1(rd *snapshotReader, n int) ([]setID, error) {
	w := rd.w
	mb, err := rd.c.full(8 * n * w)
	if err != nil {
		return nil, err
	}
	ids := make([]setID, n)
	var last []byte
	var lastID setID
	for o := range n {
		words := mb[8*w*o : 8*w*(o+1)]
		if last != nil && bytes.Equal(words, last) {
			ids[o] = lastID
			continue
		}
		slots := rd.slots[:0]
		for k := range w {
			for v := binary.LittleEndian.Uint64(words[8*k:]); v != 0; v &= v - 1 {
				slot := int64(k*64 + bits.TrailingZeros64(v))
				if !x.knownSlot(slot) {
					return nil, fmt.Errorf("%w: mask names an unknown worker slot", ErrCorruptSnapshot)
				}
				slots = append(slots, int32(slot))
			}
		}
		rd.slots = slots
		var id setID
		if len(slots) > 0 {
			id = x.hs.internSlots(slices.Clone(slots))
		}
		ids[o], last, lastID = id, words, id
	}
	return ids, nil
}

// link builds the block table from the segments read and hangs each segment
// under its parent: the root, a block of an earlier record, or (when the
// snapshot lacks the parent) the detached set.
func (x *Index) link() error {
	if dup, ok := x.locs.buildFrom(x.segs); !ok {
		return fmt.Errorf("%w: block %016x repeated", ErrCorruptSnapshot, dup)
	}
	x.recount()
	for id := 1; id < len(x.hs.sets); id++ {
		if hs := &x.hs.sets[id]; hs.slots != nil && hs.refs == 0 {
			return fmt.Errorf("%w: holder set %v that no block refers to", ErrCorruptSnapshot, hs.slots)
		}
	}
	for id, s := range x.segs {
		switch l, ok := x.locs.Get(s.parentHash); {
		case s.parentHash == Root:
			s.parent = parentRoot
		case ok:
			if l.seg() >= int32(id) {
				return fmt.Errorf("%w: segment %d precedes its parent", ErrCorruptSnapshot, id)
			}
			p := x.segs[l.seg()]
			s.parent, s.parentOff = l.seg(), int32(l.off())
			s.childIdx = int32(len(p.children))
			s.orphan = p.orphan
			p.children = append(p.children, int32(id))
		default:
			s.parent = parentDetached
			s.orphan = true
			list := x.detached[s.parentHash]
			s.childIdx = int32(len(list))
			x.detached[s.parentHash] = append(list, int32(id))
			x.orphanQ = append(x.orphanQ, orphanRef{seg: int32(id), created: s.created})
		}
		if s.orphan {
			x.orphanBlocks += int64(len(s.hashes))
		}
	}
	// A writer never leaves an unheld block at a run's end with nothing
	// under it (such blocks are collected at once).
	for id, s := range x.segs {
		if n := len(s.hashes); !x.blockLive(s, n-1) && !x.hasChildAt(s, n-1) {
			return fmt.Errorf("%w: segment %d ends in a block nobody holds", ErrCorruptSnapshot, id)
		}
	}
	return nil
}

func (x *Index) readEnd(c *crcReader) error {
	const limit = 1 << 62
	nworkers, err := c.uvarint("worker count", limit)
	if err != nil {
		return err
	}
	stored, err := c.uvarint("stored blocks", limit)
	if err != nil {
		return err
	}
	entries, err := c.uvarint("entries", limit)
	if err != nil {
		return err
	}
	db, err := c.full(8)
	if err != nil {
		return err
	}
	digest := binary.LittleEndian.Uint64(db)
	dropped, err := c.uvarint("dropped orphans", limit)
	if err != nil {
		return err
	}
	want := c.crc
	tb, err := c.full(4)
	if err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint32(tb); got != want {
		return fmt.Errorf("%w: checksum %08x, computed %08x", ErrCorruptSnapshot, got, want)
	}
	if err := x.link(); err != nil {
		return err
	}
	switch {
	case int(nworkers) != len(x.byName):
		return fmt.Errorf("%w: %d workers recorded, %d read", ErrCorruptSnapshot, nworkers, len(x.byName))
	case int(stored) != x.locs.Len():
		return fmt.Errorf("%w: %d blocks recorded, %d read", ErrCorruptSnapshot, stored, x.locs.Len())
	case int64(entries) != x.entries:
		return fmt.Errorf("%w: %d entries recorded, %d read", ErrCorruptSnapshot, entries, x.entries)
	case digest != x.digest:
		return fmt.Errorf("%w: digest %016x recorded, %016x computed", ErrCorruptSnapshot, digest, x.digest)
	}
	x.dropped = int64(dropped)
	return nil
}
