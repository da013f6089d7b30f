package radix

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// Snapshot format, version 1. All integers are little-endian; "uvarint" is
// encoding/binary's unsigned varint.
//
//	header   magic "KVDIRRDX" | u16 version (1) | u16 flags (0) | u32 mask words W | u64 stored blocks
//	worker   'W' | u32 slot | uvarint name length | name             (every worker, before any segment)
//	segment  'S' | u64 parent hash | uvarint n (1..65,536) | u8 media bitmap |
//	         n × u64 block hashes | for each medium in the bitmap, lowest first: n × W × u64 mask words
//	end      'E' | uvarint workers | uvarint stored blocks | uvarint entries | u64 digest | uvarint dropped orphan blocks
//	trailer  u32 CRC-32C (Castagnoli) of every byte from the magic through the end record
//
// Segment records come parents first: a record's parent hash is Root, a block
// of an earlier record, or (for a detached piece) a hash the snapshot lacks. A
// run longer than 65,536 blocks is written as several records.
const (
	snapshotMagic   = "KVDIRRDX"
	snapshotVersion = 1
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
	buf = binary.LittleEndian.AppendUint32(buf, uint32(x.w))
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
			for m, mask := range s.masks {
				if mask != nil {
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
			for _, mask := range s.masks {
				if mask != nil {
					if err := appendWords(&buf, mask[start*x.w:end*x.w], flush); err != nil {
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

func (x *Index) readBody(c *crcReader) error {
	h, err := c.full(24)
	if err != nil {
		return err
	}
	if string(h[:8]) != snapshotMagic {
		return fmt.Errorf("%w: bad magic %q", ErrCorruptSnapshot, h[:8])
	}
	if v := binary.LittleEndian.Uint16(h[8:]); v != snapshotVersion {
		return fmt.Errorf("%w: unsupported version %d (this build reads %d)", ErrCorruptSnapshot, v, snapshotVersion)
	}
	if f := binary.LittleEndian.Uint16(h[10:]); f != 0 {
		return fmt.Errorf("%w: unknown flags %#x", ErrCorruptSnapshot, f)
	}
	w := int(binary.LittleEndian.Uint32(h[12:]))
	if w < 1 || w > (x.opts.MaxWorkers+63)/64 {
		return fmt.Errorf("%w: %d mask words per block (limit %d workers)", ErrCorruptSnapshot, w, x.opts.MaxWorkers)
	}
	x.w = w
	blocks := binary.LittleEndian.Uint64(h[16:]) // h is reused by later reads
	x.known = make([]uint64, w)
	defer func() { x.known = nil }()
	for {
		tag, err := c.ReadByte()
		if err != nil {
			return err
		}
		switch tag {
		case 'W':
			err = x.readWorker(c)
		case 'S':
			err = x.readSegment(c)
		case 'E':
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

func (x *Index) readWorker(c *crcReader) error {
	if len(x.segs) > 0 {
		return fmt.Errorf("%w: worker record after segments", ErrCorruptSnapshot)
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
	if slot >= x.w*64 || slot >= x.opts.MaxWorkers {
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
	x.known[slot/64] |= 1 << (slot % 64)
	return nil
}

func (x *Index) readSegment(c *crcReader) error {
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
	w := x.w
	for m := Medium(0); m < NumMedia; m++ {
		if media&(1<<m) == 0 {
			continue
		}
		mb, err := c.full(8 * n * w)
		if err != nil {
			return err
		}
		mask := make([]uint64, n*w)
		for i := range mask {
			mask[i] = binary.LittleEndian.Uint64(mb[8*i:])
		}
		for o := range n {
			for k, v := range mask[o*w : o*w+w] {
				if v&^x.known[k] != 0 {
					return fmt.Errorf("%w: mask names an unknown worker slot", ErrCorruptSnapshot)
				}
			}
		}
		seg.masks[m] = mask
	}
	x.segs = append(x.segs, seg)
	return nil
}

// link builds the block table from the segments read and hangs each segment
// under its parent: the root, a block of an earlier record, or (when the
// snapshot lacks the parent) the detached set.
func (x *Index) link() error {
	if dup, ok := x.locs.buildFrom(x.segs); !ok {
		return fmt.Errorf("%w: block %016x repeated", ErrCorruptSnapshot, dup)
	}
	x.recount()
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
