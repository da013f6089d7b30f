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

// KV-cache spec kinds (kv_cache_spec_kind), the values of vLLM's
// KVCacheSpecKind enum in vllm/v1/kv_cache_interface.py (added after
// bc8282e6, the revision the search tool holds; the values were read from
// quoted copies of the enum).
const (
	// SpecKindFullAttention is the kind of full-attention groups, the only
	// kind for which the decoder requires token_ids to cover every
	// announced block.
	SpecKindFullAttention        = "full_attention"
	SpecKindMLAAttention         = "mla_attention"
	SpecKindSinkFullAttention    = "sink_full_attention"
	SpecKindSlidingWindow        = "sliding_window"
	SpecKindSlidingWindowMLA     = "sliding_window_mla"
	SpecKindChunkedLocal         = "chunked_local_attention"
	SpecKindMamba                = "mamba"
	SpecKindEncoderOnlyAttention = "encoder_only_attention"
	SpecKindCrossAttention       = "cross_attention"
	SpecKindUnknown              = "unknown"
)

// IsFullAttentionKind reports whether a group of this kv_cache_spec_kind
// keeps the KV of every token of a prefix, so that its blocks alone decide a
// prefix-cache hit: full attention, MLA and sink full attention. Sliding
// window (incl. MLA), chunked local, Mamba, encoder-only, cross-attention
// and unknown groups keep only part of a prefix (or none of the decoder's)
// and are not. The empty kind (older vLLM, SGLang) is not a kind; callers
// decide what it means.
func IsFullAttentionKind(kind string) bool {
	switch kind {
	case SpecKindFullAttention, SpecKindMLAAttention, SpecKindSinkFullAttention:
		return true
	}
	return false
}

// LocalityRemote is the locality of blocks held in a pool shared by other
// workers (TensorRT-LLM's BlockStored.locality, vLLM's offloading managers).
const LocalityRemote = "REMOTE"

// MaxTokenStringLen bounds a string token id (TensorRT-LLM multimodal
// placeholders).
const MaxTokenStringLen = 1024

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
	// Locality is locality (TensorRT-LLM, after the sliding window):
	// "LOCAL", "REMOTE" (a shared pool, see LocalityRemote); "" for None.
	Locality string
	// CacheSalt is SGLang's cache salt: the cache_salt of the metadata map
	// of BlockStoredWithMetadata (array layout: the item after medium; map
	// layout: the "metadata" key) or a top-level "cache_salt" key. "" when
	// absent. vLLM puts its salt into ExtraKeys instead.
	CacheSalt string
	// Bigram is true when token_ids arrived as SGLang's EAGLE/NEXTN/MTP
	// bigram pairs [[t0,t1],[t1,t2],...,[tn-1,next]]: TokenIDs then holds
	// the first item of each pair (the block's tokens) and BigramNext the
	// second item of the last pair (the token after the last block).
	Bigram     bool
	BigramNext uint32
	// StrTokens lists the token_ids items that were strings (TensorRT-LLM
	// multimodal placeholders), in order; TokenIDs holds 0 at their index.
	StrTokens []StrToken
}

// StrToken is a token_ids item that was a string.
type StrToken struct {
	Index int
	Value string
}

// BlockRemoved announces evicted blocks.
type BlockRemoved struct {
	BlockHashes []Hash
	// Medium is e.g. "GPU"; "" stands for None.
	Medium string
	// GroupIdx is the KV-cache group index; nil for None.
	GroupIdx *int
	// Locality is locality (TensorRT-LLM); "" for None.
	Locality string
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
