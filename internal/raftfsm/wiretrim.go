package raftfsm

import (
	"encoding/binary"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the messages TrimBatchWire reads (proto/kvdir/v1/types.proto).
const (
	batchWorkerID = 1 // EventBatch.worker_id
	batchEpoch    = 2 // EventBatch.epoch
	batchEvents   = 5 // EventBatch.events
	eventStored   = 1 // Event.stored
	eventRemoved  = 2 // Event.removed
	eventCleared  = 3 // Event.cleared
	eventLayout   = 4 // Event.layout
	storedHashes  = 2 // StoredBlocks.hashes
	removedHashes = 1 // RemovedBlocks.hashes
)

// wireEvent is what TrimBatchWire learnt of one events field.
type wireEvent struct {
	field []byte // the whole field: tag, length, content
	body  []byte // the Event's content
	// For a stored event: the StoredBlocks field within body, and the
	// hashes field within the StoredBlocks (whole, and its packed data).
	stored, hashesField, hashes []byte
	keep                        uint64 // hashes kept
	// The sizes of the hashes field, the StoredBlocks and the Event once
	// cut.
	hashesLen, storedLen, eventLen int
}

// TrimBatchWire is CutOverQuota on an encoded EventBatch, before it is
// decoded, so that the leader never materialises the blocks it would cut:
// it writes src with the stored blocks past the worker's quota cut out into
// alloc(size)[:0], and returns that and how many blocks it cut. ok is false when it
// cuts nothing, or src is not in the plain form it reads (a packed hashes
// field per piece, one kind per event): then decode src whole. It never
// hides from CheckBatch a reason to refuse the batch: a batch whose cut
// pieces are over the chain limit or hold the reserved hash, or that is
// over the block limit, is left whole. freed is as for CutOverQuota.
func (f *FSM) TrimBatchWire(src []byte, freed func(worker string) (uint64, bool), alloc func(size int) []byte) (out []byte, cut uint64, ok bool) {
	var worker []byte
	var epoch uint64
	var nEvents int
	if !eachField(src, func(num protowire.Number, typ protowire.Type, _, v []byte, x uint64) bool {
		switch num {
		case batchWorkerID:
			worker = v
		case batchEpoch:
			epoch = x
		case batchEvents:
			nEvents++
		}
		// A known field in another wire type: leave it to the generated
		// code.
		return num > batchEvents || typ == protowire.VarintType && num > batchWorkerID && num < batchEvents ||
			typ == protowire.BytesType && (num == batchWorkerID || num == batchEvents)
	}) || nEvents == 0 {
		return nil, 0, false
	}
	room, ok := f.quotaRoom(string(worker), epoch)
	if !ok {
		return nil, 0, false
	}
	fr, ok := freed(string(worker))
	if !ok {
		return nil, 0, false
	}
	room = satAdd(room, fr)
	limits := f.index.Load().Options()
	evs := make([]wireEvent, 0, nEvents)
	var blocks uint64
	if !eachField(src, func(num protowire.Number, typ protowire.Type, field, v []byte, _ uint64) bool {
		if num != batchEvents {
			return true
		}
		ev := wireEvent{field: field, body: v}
		kinds := 0
		good := eachField(v, func(num protowire.Number, typ protowire.Type, field, v []byte, _ uint64) bool {
			if num < eventStored || num > eventLayout {
				return true
			}
			if kinds++; kinds > 1 || typ != protowire.BytesType {
				return false
			}
			switch num {
			case eventStored:
				ev.stored = field
				return eachField(v, func(num protowire.Number, typ protowire.Type, field, v []byte, _ uint64) bool {
					if num != storedHashes {
						return true
					}
					if ev.hashesField != nil || typ != protowire.BytesType || len(v)%8 != 0 {
						return false
					}
					ev.hashesField, ev.hashes = field, v
					return true
				})
			case eventRemoved:
				return eachField(v, func(num protowire.Number, typ protowire.Type, _, v []byte, _ uint64) bool {
					switch {
					case num != removedHashes:
					case typ == protowire.BytesType:
						blocks += uint64(len(v) / 8)
						room = satAdd(room, uint64(len(v)/8))
					case typ == protowire.Fixed64Type:
						blocks++
						room = satAdd(room, 1)
					default:
						return false
					}
					return true
				})
			case eventCleared:
				room = math.MaxUint64
			}
			return true
		})
		if !good {
			return false
		}
		if ev.stored != nil {
			n := uint64(len(ev.hashes) / 8)
			blocks += n
			ev.keep = n
			if n > room {
				if n > uint64(limits.MaxChain) || hasZero(ev.hashes[room*8:]) {
					return false
				}
				ev.keep = room
				cut += n - room
			}
		}
		evs = append(evs, ev)
		return true
	}) || cut == 0 || blocks > uint64(f.opts.MaxBatchBlocks) {
		return nil, 0, false
	}

	// The cut events' new sizes: of the hashes field, the StoredBlocks and
	// the Event.
	size := len(src)
	for i := range evs {
		ev := &evs[i]
		if ev.stored == nil || ev.keep == uint64(len(ev.hashes)/8) {
			continue
		}
		if ev.keep > 0 {
			ev.hashesLen = protowire.SizeTag(storedHashes) + protowire.SizeBytes(int(ev.keep*8))
		}
		ev.storedLen = len(bytesFieldBody(ev.stored)) - len(ev.hashesField) + ev.hashesLen
		ev.eventLen = len(ev.body) - len(ev.stored) + protowire.SizeTag(eventStored) + protowire.SizeBytes(ev.storedLen)
		size += protowire.SizeTag(batchEvents) + protowire.SizeBytes(ev.eventLen) - len(ev.field)
	}
	// Copy src, rewriting them.
	out = alloc(size)[:0]
	pos := 0
	for _, ev := range evs {
		if ev.stored == nil || ev.keep == uint64(len(ev.hashes)/8) {
			continue
		}
		start := offset(src, ev.field)
		out = append(out, src[pos:start]...)
		pos = start + len(ev.field)
		out = protowire.AppendTag(out, batchEvents, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(ev.eventLen))
		so := offset(ev.body, ev.stored)
		out = append(out, ev.body[:so]...)
		out = protowire.AppendTag(out, eventStored, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(ev.storedLen))
		storedBody := bytesFieldBody(ev.stored)
		ho := offset(storedBody, ev.hashesField)
		out = append(out, storedBody[:ho]...)
		if ev.keep > 0 {
			out = protowire.AppendTag(out, storedHashes, protowire.BytesType)
			out = protowire.AppendBytes(out, ev.hashes[:ev.keep*8])
		}
		out = append(out, storedBody[ho+len(ev.hashesField):]...)
		out = append(out, ev.body[so+len(ev.stored):]...)
	}
	out = append(out, src[pos:]...)
	return out, cut, true
}

// quotaRoom is the room CutOverQuota starts from: the quota less the
// blocks the worker holds, if it went over its quota in epoch.
func (f *FSM) quotaRoom(worker string, epoch uint64) (uint64, bool) {
	v, ok := f.overQuota.Load(worker)
	if !ok || v.(quotaMark).epoch != epoch {
		return 0, false
	}
	quota := v.(quotaMark).quota
	var have uint64
	if ws, ok := f.index.Load().Worker(worker); ok {
		have = uint64(ws.Blocks)
	}
	return quota - min(have, quota), true
}

// eachField calls fn with each field of an encoded message: its number,
// wire type, the whole field, the content of a length-delimited field and
// the value of a varint. It returns false if b does not parse or fn
// returned false.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, field, v []byte, x uint64) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return false
		}
		field, val := b[:n+m], b[n:n+m]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, _ = protowire.ConsumeBytes(val)
		case protowire.VarintType:
			x, _ = protowire.ConsumeVarint(val)
		}
		if !fn(num, typ, field, v, x) {
			return false
		}
		b = b[n+m:]
	}
	return true
}

// bytesFieldBody returns a length-delimited field's content.
func bytesFieldBody(field []byte) []byte {
	_, _, n := protowire.ConsumeTag(field)
	v, _ := protowire.ConsumeBytes(field[n:])
	return v
}

// offset is where sub, a subslice of b (sharing its end of capacity),
// starts in b.
func offset(b, sub []byte) int { return cap(b) - cap(sub) }

func hasZero(packed []byte) bool {
	for i := 0; i+8 <= len(packed); i += 8 {
		if binary.LittleEndian.Uint64(packed[i:]) == 0 {
			return true
		}
	}
	return false
}
