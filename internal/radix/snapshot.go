package radix

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/bits"
)

// Snapshot format, version 1. All integers are little-endian; "uvarint" is
// encoding/binary's unsigned varint.
//
//	header   magic "KVDIRRDX" | u16 version (1) | u16 flags (0) | u32 mask words W | u64 stored blocks (a size hint)
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
	maxSizeHint     = 1 << 22
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
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(x.locs)))
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
	buf = binary.AppendUvarint(buf, uint64(len(x.locs)))
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
	x.known = make([]uint64, w)
	defer func() { x.known = nil }()
	x.locs = make(map[uint64]location, min(binary.LittleEndian.Uint64(h[16:]), maxSizeHint))
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
			return x.readEnd(c)
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
	locs := make([]location, n)
	cur, have := x.locs[prev]
	for i := range n {
		h := binary.LittleEndian.Uint64(hb[8*i:])
		if h == Root {
			return fmt.Errorf("%w: %w", ErrCorruptSnapshot, ErrZeroHash)
		}
		if h == prev || (have && x.wouldCycle(h, cur.seg())) {
			return fmt.Errorf("%w: block %016x would be its own ancestor", ErrCorruptSnapshot, h)
		}
		before := len(x.locs)
		cur, have, prev = x.addBlock(h, prev, cur, have), true, h
		if len(x.locs) == before {
			return fmt.Errorf("%w: block %016x repeated", ErrCorruptSnapshot, h)
		}
		locs[i] = cur
	}
	// The blocks are new, so their masks are copied whole and the counters
	// and digest are added up from them.
	keys := make([]uint64, n)
	for i, l := range locs {
		keys[i] = blockKey(x.segs[l.seg()].hashes[l.off()], x.parentOf(l))
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
		x.usedMedia |= 1 << m
		for i, l := range locs {
			s, o := x.segs[l.seg()], l.off()
			if s.masks[m] == nil {
				s.masks[m] = make([]uint64, len(s.hashes)*w, cap(s.hashes)*w)
			}
			for k := range w {
				v := binary.LittleEndian.Uint64(mb[8*(i*w+k):])
				if v&^x.known[k] != 0 {
					return fmt.Errorf("%w: mask names an unknown worker slot", ErrCorruptSnapshot)
				}
				s.masks[m][o*w+k] = v
				for ; v != 0; v &= v - 1 {
					wk := x.workers[k*64+bits.TrailingZeros64(v)]
					wk.media[m]++
					x.digest += entryHash(keys[i], wk.nameHash, m)
				}
			}
		}
	}
	for _, l := range locs {
		s, o := x.segs[l.seg()], l.off()
		live := false
		for k := range w {
			var held uint64
			for _, mask := range s.masks {
				if mask != nil {
					held |= mask[o*w+k]
				}
			}
			live = live || held != 0
			x.entries += int64(bits.OnesCount64(held))
			for ; held != 0; held &= held - 1 {
				x.workers[k*64+bits.TrailingZeros64(held)].entries++
			}
		}
		if live {
			s.live++
			x.heldBlocks++
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
	switch {
	case int(nworkers) != len(x.byName):
		return fmt.Errorf("%w: %d workers recorded, %d read", ErrCorruptSnapshot, nworkers, len(x.byName))
	case int(stored) != len(x.locs):
		return fmt.Errorf("%w: %d blocks recorded, %d read", ErrCorruptSnapshot, stored, len(x.locs))
	case int64(entries) != x.entries:
		return fmt.Errorf("%w: %d entries recorded, %d read", ErrCorruptSnapshot, entries, x.entries)
	case digest != x.digest:
		return fmt.Errorf("%w: digest %016x recorded, %016x computed", ErrCorruptSnapshot, digest, x.digest)
	}
	x.dropped = int64(dropped)
	return nil
}
