package kvevents

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"
)

// Event type tags as they appear on the wire.
const (
	TypeBlockStored      = "BlockStored"
	TypeBlockRemoved     = "BlockRemoved"
	TypeAllBlocksCleared = "AllBlocksCleared"
)

// SpecKindFullAttention is the kv_cache_spec_kind of full-attention groups,
// the only kind for which token_ids must cover every announced block.
const SpecKindFullAttention = "full_attention"

// Batch is one KVEventBatch: the payload of one ZMQ message.
type Batch struct {
	// TS is the publisher's wall-clock time in seconds (time.time()).
	TS float64
	// Events are the decoded events, in wire order.
	Events []Event
	// DPRank is data_parallel_rank; nil when absent or None.
	DPRank *int
}

// Event is one KV-cache event: *BlockStored, *BlockRemoved or
// *AllBlocksCleared.
type Event interface {
	// EventType returns the wire tag, e.g. "BlockStored".
	EventType() string
	isEvent()
}

// BlockStored announces blocks that just became full and cached.
type BlockStored struct {
	BlockHashes []Hash
	// Parent is parent_block_hash; nil when the run starts at block 0.
	Parent *Hash
	// TokenIDs holds the tokens of all blocks of the event.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is the deprecated lora_id; nil for None.
	LoRAID *int64
	// Medium is e.g. "GPU" or "CPU"; "" stands for None.
	Medium string
	// LoRAName is lora_name; "" stands for None.
	LoRAName string
	// ExtraKeys is nil (None) or has one entry per block, each nil (None) or
	// the list of extra hash keys of that block. Items are nil, bool,
	// int64, uint64 (only above MaxInt64), float64, string, []byte, []any
	// or map[string]any.
	ExtraKeys [][]any
	// GroupIdx is the KV-cache group index; nil for None.
	GroupIdx *int
	// SpecKind is kv_cache_spec_kind; "" stands for None.
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window; nil for None.
	SlidingWindow *int
}

// BlockRemoved announces evicted blocks.
type BlockRemoved struct {
	BlockHashes []Hash
	// Medium is e.g. "GPU"; "" stands for None.
	Medium string
	// GroupIdx is the KV-cache group index; nil for None.
	GroupIdx *int
}

// AllBlocksCleared announces that the whole prefix cache was reset.
type AllBlocksCleared struct{}

// EventType implements Event.
func (*BlockStored) EventType() string { return TypeBlockStored }

// EventType implements Event.
func (*BlockRemoved) EventType() string { return TypeBlockRemoved }

// EventType implements Event.
func (*AllBlocksCleared) EventType() string { return TypeAllBlocksCleared }

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}

// MaxHashBytes is the longest raw (msgpack bin) block hash accepted.
const MaxHashBytes = 64

// Hash is an engine block hash as it appeared on the wire: either an integer
// (msgpack int or uint, kept as its uint64 bit pattern, so negative values
// are stored in two's complement) or a raw digest (msgpack bin, usually 16 or
// 32 bytes). Hash values are comparable and can be used as map keys; use Key
// to get a uint64 that is the same for both wire forms of a vLLM hash.
type Hash struct {
	u   uint64 // integer value, or Key() of raw
	raw string // raw digest bytes; "" for integer hashes
}

// HashFromUint64 returns the integer hash u.
func HashFromUint64(u uint64) Hash { return Hash{u: u} }

// HashFromInt64 returns the integer hash i, stored as its two's-complement
// bit pattern.
func HashFromInt64(i int64) Hash { return Hash{u: uint64(i)} }

// HashFromBytes returns a raw-digest hash holding a copy of b. An empty b
// yields the integer hash 0, and b is truncated to its last MaxHashBytes
// bytes.
func HashFromBytes(b []byte) Hash {
	if len(b) == 0 {
		return Hash{}
	}
	if len(b) > MaxHashBytes {
		b = b[len(b)-MaxHashBytes:]
	}
	return Hash{u: tail64(b), raw: string(b)}
}

// tail64 reads the last (up to) 8 bytes of b as a big-endian integer, which
// is what vLLM's int.from_bytes(digest, "big") & (2**64-1) computes.
func tail64(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var u uint64
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return u
}

// Key returns the hash as a uint64: the integer's bit pattern, or for a raw
// digest its last 8 bytes read big-endian (vLLM's conversion).
func (h Hash) Key() uint64 { return h.u }

// IsBytes reports whether the hash arrived as a raw digest (msgpack bin).
func (h Hash) IsBytes() bool { return h.raw != "" }

// Bytes returns a copy of the raw digest, or nil for an integer hash.
func (h Hash) Bytes() []byte {
	if h.raw == "" {
		return nil
	}
	return []byte(h.raw)
}

// String returns the decimal integer, or the digest in hex.
func (h Hash) String() string {
	if h.raw != "" {
		return hex.EncodeToString([]byte(h.raw))
	}
	return strconv.FormatUint(h.u, 10)
}
