package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Exact vLLM mode: vLLM's "sha256_cbor" prefix-cache block hash
// (--prefix-caching-hash-algo sha256_cbor, vLLM >= v0.10.2), reproduced bit for
// bit. With seed s, block size B and extra keys e_i:
//
//	NONE_HASH = SHA-256(CBOR(s))                      (s as a CBOR text string)
//	d(i)      = SHA-256(CBOR([d(i-1), tokens_i, e_i])) (d(-1) = NONE_HASH)
//
// where the parent is a 32-byte byte string, tokens_i an array of unsigned
// ints and e_i null or an array of items. The CBOR is canonical: definite
// lengths, minimal integer and length heads. vLLM publishes the last 8 bytes of
// each digest as a big-endian uint64 in its KV events ([Digest.Published]).

// DefaultVLLMSeed is the NONE_HASH seed vLLM uses for sha256 and sha256_cbor
// when PYTHONHASHSEED is unset (newer vLLM; older versions used a random seed
// that cannot be reproduced).
const DefaultVLLMSeed = "vllm-none-hash"

// ErrUnsupportedExtraKey is returned when an extra-key item has a type that
// the CBOR encoder does not handle, or is not valid (invalid UTF-8, nesting
// too deep).
var ErrUnsupportedExtraKey = errors.New("blockhash: unsupported vLLM extra key")

// maxExtraKeyDepth bounds the nesting of []any extra-key items, so that a
// self-referencing slice yields an error instead of exhausting the stack.
const maxExtraKeyDepth = 16

// Digest is a full SHA-256 block digest as vLLM chains it.
type Digest [32]byte

// Published returns the value vLLM publishes for the digest in KV events: the
// last 8 bytes read as a big-endian uint64.
func (d Digest) Published() uint64 {
	return binary.BigEndian.Uint64(d[24:])
}

// String returns the digest in lowercase hex.
func (d Digest) String() string {
	return hex.EncodeToString(d[:])
}

// VLLMNoneHash returns vLLM's NONE_HASH for seed, the parent of block 0: the
// SHA-256 of seed encoded as a CBOR text string. seed should be valid UTF-8;
// its bytes are hashed as given.
func VLLMNoneHash(seed string) Digest {
	b := make([]byte, 0, 9+len(seed))
	b = appendHead(b, majorText, uint64(len(seed)))
	b = append(b, seed...)
	return sha256.Sum256(b)
}

// VLLMBlock returns vLLM's sha256_cbor digest of one block with the given
// parent digest, tokens and extra keys (nil or empty for none). Extra-key items
// may be string, int, int64, []byte or []any of these; other types, and
// strings that are not valid UTF-8, are an error.
func VLLMBlock(parent Digest, tokens []uint32, extra []any) (Digest, error) {
	var stack [256]byte
	b, err := VLLMBlockCBOR(stack[:0], parent, tokens, extra)
	if err != nil {
		return Digest{}, err
	}
	return sha256.Sum256(b), nil
}

// VLLMBlockCBOR appends to dst the canonical CBOR that vLLM hashes for one
// block, the 3-array [parent, tokens, extra], and returns the extended slice.
// On error it returns dst unchanged.
func VLLMBlockCBOR(dst []byte, parent Digest, tokens []uint32, extra []any) ([]byte, error) {
	orig := len(dst)
	dst = append(dst, majorArray<<5|3)
	dst = appendHead(dst, majorBytes, uint64(len(parent)))
	dst = append(dst, parent[:]...)
	dst = appendHead(dst, majorArray, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendHead(dst, majorUint, uint64(t))
	}
	if len(extra) == 0 {
		return append(dst, cborNull), nil
	}
	dst, err := appendItem(dst, extra, 0)
	if err != nil {
		return dst[:orig], fmt.Errorf("vllm block cbor: extra keys: %w", err)
	}
	return dst, nil
}

// CBOR major types and simple values used here (RFC 8949, section 3.1).
const (
	majorUint  = 0
	majorNeg   = 1
	majorBytes = 2
	majorText  = 3
	majorArray = 4
	cborNull   = 0xf6
)

// appendHead appends a CBOR head of the given major type with argument v in its
// shortest form.
func appendHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= 0xff:
		return append(dst, m|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, m|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, m|26), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, m|27), v)
	}
}

func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendHead(dst, majorUint, uint64(v))
	}
	return appendHead(dst, majorNeg, uint64(-1-v))
}

// appendItem appends one extra-key item.
func appendItem(dst []byte, item any, depth int) ([]byte, error) {
	switch v := item.(type) {
	case string:
		if !utf8.ValidString(v) {
			return dst, fmt.Errorf("%w: string %q is not valid UTF-8", ErrUnsupportedExtraKey, v)
		}
		dst = appendHead(dst, majorText, uint64(len(v)))
		return append(dst, v...), nil
	case int:
		return appendInt(dst, int64(v)), nil
	case int64:
		return appendInt(dst, v), nil
	case []byte:
		dst = appendHead(dst, majorBytes, uint64(len(v)))
		return append(dst, v...), nil
	case []any:
		if depth >= maxExtraKeyDepth {
			return dst, fmt.Errorf("%w: arrays nested deeper than %d", ErrUnsupportedExtraKey, maxExtraKeyDepth)
		}
		dst = appendHead(dst, majorArray, uint64(len(v)))
		for i, e := range v {
			var err error
			if dst, err = appendItem(dst, e, depth+1); err != nil {
				return dst, fmt.Errorf("item %d: %w", i, err)
			}
		}
		return dst, nil
	default:
		return dst, fmt.Errorf("%w: type %T", ErrUnsupportedExtraKey, item)
	}
}

// VLLMExtraKeys returns the extra keys vLLM's generate_block_hash_extra_keys
// gives block blockIndex of a request, in vLLM's order: the LoRA adapter name
// (every block, if non-empty), then one []any{ID, int64(offset)} per
// multimodal item overlapping the block (offset relative to the block's first
// token, in the order of items, which vLLM keeps sorted by offset), then the
// cache salt (block 0 only, if non-empty). It returns nil if there are none.
// Prompt-embedding keys are not supported.
func VLLMExtraKeys(lora string, items []MMItem, cacheSalt string, blockIndex, blockSize int) []any {
	var keys []any
	if lora != "" {
		keys = append(keys, lora)
	}
	if blockSize >= 1 && blockIndex >= 0 {
		start := blockIndex * blockSize
		end := start + blockSize
		for _, it := range items {
			if it.overlaps(start, end) {
				keys = append(keys, []any{it.ID, int64(it.Offset - start)})
			}
		}
	}
	if blockIndex == 0 && cacheSalt != "" {
		keys = append(keys, cacheSalt)
	}
	return keys
}

// VLLMHasher computes vLLM sha256_cbor block-digest chains for one seed and
// block size. It is immutable and safe for concurrent use.
type VLLMHasher struct {
	none      Digest
	blockSize int
}

// NewVLLM returns a VLLMHasher for the NONE_HASH seed (PYTHONHASHSEED, or
// [DefaultVLLMSeed]) and the engine's block size in tokens.
func NewVLLM(seed string, blockSize int) (*VLLMHasher, error) {
	if err := checkBlockSize(blockSize); err != nil {
		return nil, fmt.Errorf("new vllm hasher: %w", err)
	}
	if !utf8.ValidString(seed) {
		return nil, fmt.Errorf("new vllm hasher: seed is not valid UTF-8")
	}
	return &VLLMHasher{none: VLLMNoneHash(seed), blockSize: blockSize}, nil
}

// NoneHash returns the parent digest of block 0.
func (h *VLLMHasher) NoneHash() Digest { return h.none }

// BlockSize returns the block size in tokens.
func (h *VLLMHasher) BlockSize() int { return h.blockSize }

// Chain returns the digests of the full blocks of a prompt, as vLLM computes
// them for a request with the given LoRA adapter name, cache salt and
// multimodal items (empty or nil for none). A partial tail is ignored.
func (h *VLLMHasher) Chain(tokens []uint32, lora, cacheSalt string, items []MMItem) ([]Digest, error) {
	bs := h.blockSize
	n := FullBlocks(len(tokens), bs)
	if n == 0 {
		return nil, nil
	}
	out := make([]Digest, 0, n)
	parent := h.none
	var stack [256]byte
	buf := stack[:0]
	for i := range n {
		extra := VLLMExtraKeys(lora, items, cacheSalt, i, bs)
		var err error
		buf, err = VLLMBlockCBOR(buf[:0], parent, tokens[i*bs:(i+1)*bs], extra)
		if err != nil {
			return nil, fmt.Errorf("vllm chain: block %d: %w", i, err)
		}
		parent = sha256.Sum256(buf)
		out = append(out, parent)
	}
	return out, nil
}
