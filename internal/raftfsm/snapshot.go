package raftfsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// State snapshot format, version 2:
//
//	magic "KVDIRFSM" | u32 LE version (1 or 2)
//	'W' record per worker, 'M' record per member, 'S' record per session
//	    (least recently recorded first): tag | uvarint length | protobuf | u32 LE CRC-32C of tag and protobuf
//	'P' (version 2 only) | u64 LE epoch floor | u32 LE CRC-32C of those 8 bytes
//	'I' | the index snapshot (internal/radix format, self-delimiting and checksummed)
//	'E' | u64 LE applied index | u32 LE CRC-32C of those 8 bytes
//
// Version 2 adds the 'P' record, the highest epoch of a pruned worker
// record. A state without one (no record pruned yet) is written as version
// 1, which builds that predate version 2 read, so a cluster being upgraded
// node by node keeps exchanging snapshots until the first prune. Fields
// added to the records' protobufs (a worker's owner, token hash, block
// quota and gone index) need no new version: older readers skip them, and
// a record written without one reads as its zero value. A gone worker's
// record without a gone index (written before builds recorded it) is
// pruned as if it went gone at its registration (see goneAt), which keeps
// the order those builds pruned in among such records and puts them before
// every worker retired since.
//
// Capture (on the apply goroutine) encodes everything into memory, which at
// 10 M index entries takes tens of milliseconds; Persist streams the bytes to
// the snapshot sink while the state machine goes on applying.
const (
	stateMagic   = "KVDIRFSM"
	stateVersion = 2
	maxRecord    = 1 << 20
)

// ErrCorruptState is returned (wrapped) for a state snapshot that fails any
// check.
var ErrCorruptState = errors.New("raftfsm: corrupt state snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordCRC checksums a record's tag and body, so that neither can change
// unnoticed.
func recordCRC(tag byte, body []byte) uint32 {
	return crc32.Update(crc32.Checksum([]byte{tag}, castagnoli), castagnoli, body)
}

type snapshot struct{ data []byte }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s.data); err != nil {
		sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return nil
}

func (s *snapshot) Release() {}

// capture encodes the state; f.mu is held for reading.
func (f *FSM) capture() (*snapshot, error) {
	var buf bytes.Buffer
	if err := writeState(&buf, f.st, f.applied.Load()); err != nil {
		return nil, err
	}
	return &snapshot{data: buf.Bytes()}, nil
}

// WriteState writes the state snapshot to w (the same bytes Persist writes).
func (f *FSM) WriteState(w io.Writer) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return writeState(w, f.st, f.applied.Load())
}

// WriteStateIndex is WriteState that also returns the applied index the
// written state holds.
func (f *FSM) WriteStateIndex(w io.Writer) (uint64, error) {
	var applied uint64
	err := f.WriteStateAt(w, func(i uint64) { applied = i })
	return applied, err
}

// WriteStateAt is WriteState that first calls at with the applied index
// the written state holds, before it writes anything (for a writer that
// labels what it passes on with the index). Applies wait while it writes,
// so w must not block for long.
func (f *FSM) WriteStateAt(w io.Writer, at func(applied uint64)) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	applied := f.applied.Load()
	at(applied)
	return writeState(w, f.st, applied)
}

func writeState(w io.Writer, st *state, applied uint64) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString(stateMagic)
	version := uint32(1)
	if st.epochFloor > 0 {
		version = stateVersion
	}
	binary.Write(bw, binary.LittleEndian, version)
	record := func(tag byte, m proto.Message) error {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return err
		}
		bw.WriteByte(tag)
		bw.Write(binary.AppendUvarint(nil, uint64(len(b))))
		bw.Write(b)
		return binary.Write(bw, binary.LittleEndian, recordCRC(tag, b))
	}
	ids := make([]string, 0, len(st.workers))
	for id := range st.workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := record('W', st.workers[id]); err != nil {
			return fmt.Errorf("write worker %q: %w", id, err)
		}
	}
	members := make([]string, 0, len(st.members))
	for id := range st.members {
		members = append(members, id)
	}
	slices.Sort(members)
	for _, id := range members {
		if err := record('M', &kvdirv1.MemberAPICommand{Id: id, ApiAddress: st.members[id]}); err != nil {
			return fmt.Errorf("write member %q: %w", id, err)
		}
	}
	for e := st.sessions.order.Front(); e != nil; e = e.Next() {
		if err := record('S', entryOf(e).rec); err != nil {
			return fmt.Errorf("write session: %w", err)
		}
	}
	if version >= 2 {
		bw.WriteByte('P')
		bw.Write(u64CRC(st.epochFloor))
	}
	bw.WriteByte('I')
	if _, err := st.index.WriteSnapshot(bw); err != nil {
		return err
	}
	bw.WriteByte('E')
	bw.Write(u64CRC(applied))
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write state snapshot: %w", err)
	}
	return nil
}

// u64CRC encodes v as u64 LE followed by the u32 LE CRC-32C of those 8
// bytes.
func u64CRC(v uint64) []byte {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], v)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], castagnoli))
	return b[:]
}

// readState reads a state snapshot into a new state.
func readState(r io.Reader, opts Options) (*state, uint64, error) {
	br := bufio.NewReaderSize(r, 1<<18)
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorruptState, fmt.Sprintf(format, args...))
	}
	var head [12]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return nil, 0, corrupt("header: %v", err)
	}
	if string(head[:8]) != stateMagic {
		return nil, 0, corrupt("bad magic %q", head[:8])
	}
	version := binary.LittleEndian.Uint32(head[8:])
	if version < 1 || version > stateVersion {
		return nil, 0, corrupt("unsupported version %d (this build reads 1 to %d)", version, stateVersion)
	}
	st := newState(opts)
	var buf []byte
	for {
		tag, err := br.ReadByte()
		if err != nil {
			return nil, 0, corrupt("truncated")
		}
		switch tag {
		case 'W', 'M', 'S':
			n, err := binary.ReadUvarint(br)
			if err != nil || n > maxRecord {
				return nil, 0, corrupt("record length")
			}
			buf = slices.Grow(buf[:0], int(n)+4)[:n+4]
			if _, err := io.ReadFull(br, buf); err != nil {
				return nil, 0, corrupt("truncated record")
			}
			b := buf[:n]
			if recordCRC(tag, b) != binary.LittleEndian.Uint32(buf[n:]) {
				return nil, 0, corrupt("record checksum")
			}
			if err := readRecord(st, tag, b); err != nil {
				return nil, 0, corrupt("%c record: %v", tag, err)
			}
		case 'P':
			if version < 2 {
				return nil, 0, corrupt("epoch floor record in a version %d snapshot", version)
			}
			var rec [12]byte
			if _, err := io.ReadFull(br, rec[:]); err != nil {
				return nil, 0, corrupt("truncated epoch floor")
			}
			if crc32.Checksum(rec[:8], castagnoli) != binary.LittleEndian.Uint32(rec[8:]) {
				return nil, 0, corrupt("epoch floor checksum")
			}
			st.epochFloor = binary.LittleEndian.Uint64(rec[:8])
		case 'I':
			x, err := radix.ReadSnapshot(br, opts.Index)
			if err != nil {
				return nil, 0, fmt.Errorf("%w: %w", ErrCorruptState, err)
			}
			st.index = x
		case 'E':
			var end [12]byte
			if _, err := io.ReadFull(br, end[:]); err != nil {
				return nil, 0, corrupt("truncated end")
			}
			if crc32.Checksum(end[:8], castagnoli) != binary.LittleEndian.Uint32(end[8:]) {
				return nil, 0, corrupt("end checksum")
			}
			st.countAlive()
			return st, binary.LittleEndian.Uint64(end[:8]), nil
		default:
			return nil, 0, corrupt("unknown record tag %#x", tag)
		}
	}
}

func readRecord(st *state, tag byte, b []byte) error {
	switch tag {
	case 'W':
		w := new(kvdirv1.Worker)
		if err := proto.Unmarshal(b, w); err != nil {
			return err
		}
		if w.Spec == nil || w.Spec.Id == "" {
			return errors.New("worker without id")
		}
		st.workers[w.Spec.Id] = w
	case 'M':
		m := new(kvdirv1.MemberAPICommand)
		if err := proto.Unmarshal(b, m); err != nil {
			return err
		}
		st.members[m.Id] = m.ApiAddress
	case 'S':
		s := new(kvdirv1.SessionRecord)
		if err := proto.Unmarshal(b, s); err != nil {
			return err
		}
		if err := validSession(s); err != nil {
			return err
		}
		st.sessions.put(s)
	}
	return nil
}
