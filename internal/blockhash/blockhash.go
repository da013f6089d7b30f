package blockhash

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Version is the content-hash layout version described in the package
// documentation. Any change to the hashed bytes bumps it.
const Version = 1

// DomainTag is the ASCII prefix of the bytes hashed into a namespace root.
const DomainTag = "kvdir.blockhash.v1"

// ZeroReplacement is returned instead of 0 by [Namespace.Root], [Block] and the
// [Hasher] methods: the index reserves 0 to mean "no parent". It is 2^64
// divided by the golden ratio, a fixed constant of layout version 1.
const ZeroReplacement uint64 = 0x9E3779B97F4A7C15

// Limits on a [Namespace].
const (
	// MaxBlockSize is the largest block size, in tokens.
	MaxBlockSize = 1 << 16
	// MaxStringLen is the largest length, in bytes, of a namespace string.
	MaxStringLen = 1 << 16
)

// Errors returned when a namespace or block size is out of range.
var (
	ErrInvalidBlockSize = errors.New("blockhash: invalid block size")
	ErrStringTooLong    = errors.New("blockhash: namespace string too long")
)

// hostLittleEndian selects the zero-copy view of token slices. On a big-endian
// host the tokens are encoded one by one instead; both produce the same bytes.
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Namespace is what, besides the tokens, separates one prefix cache from
// another: the model, the LoRA adapter, the request's cache salt and the
// engine's block size in tokens.
type Namespace struct {
	Model     string
	LoRA      string
	CacheSalt string
	BlockSize int
}

// Root returns the namespace root hash, the parent of block 0. It fails if the
// block size is outside [1, MaxBlockSize] or a string is longer than
// MaxStringLen bytes.
func (ns Namespace) Root() (uint64, error) {
	if err := checkBlockSize(ns.BlockSize); err != nil {
		return 0, fmt.Errorf("namespace root: %w", err)
	}
	fields := [...]struct{ name, s string }{
		{"model", ns.Model}, {"lora", ns.LoRA}, {"cache salt", ns.CacheSalt},
	}
	n := len(DomainTag) + 4
	for _, f := range fields {
		if len(f.s) > MaxStringLen {
			return 0, fmt.Errorf("namespace root: %s is %d bytes, limit %d: %w",
				f.name, len(f.s), MaxStringLen, ErrStringTooLong)
		}
		n += 4 + len(f.s)
	}
	b := make([]byte, 0, n)
	b = append(b, DomainTag...)
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.BlockSize))
	for _, f := range fields {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f.s)))
		b = append(b, f.s...)
	}
	return nonZero(xxh3.Hash(b)), nil
}

func checkBlockSize(bs int) error {
	if bs < 1 || bs > MaxBlockSize {
		return fmt.Errorf("%w: %d not in [1, %d]", ErrInvalidBlockSize, bs, MaxBlockSize)
	}
	return nil
}

// ExtraKey is one extra key of a block: a multimodal item's identifier and the
// item's start offset relative to the block's first token (negative when the
// item began in an earlier block).
type ExtraKey struct {
	ID     string
	Offset int64
}

// MMItem is a multimodal placeholder span in the token sequence: the item's
// identifier (e.g. a content hash of the image) and its start offset and
// length in tokens, relative to the start of the whole prompt.
type MMItem struct {
	ID     string
	Offset int
	Length int
}

// overlaps reports whether the item overlaps the tokens [start, end).
func (it MMItem) overlaps(start, end int) bool {
	return it.Length > 0 && it.Offset < end && it.Offset+it.Length > start
}

// FullBlocks returns the number of full blocks of blockSize tokens in nTokens
// tokens; a partial tail does not count. It is 0 if either argument is < 1.
func FullBlocks(nTokens, blockSize int) int {
	if nTokens < 1 || blockSize < 1 {
		return 0
	}
	return nTokens / blockSize
}

// AppendExtraKeys appends to dst the extra keys of block blockIndex (covering
// tokens [blockIndex*blockSize, (blockIndex+1)*blockSize)): one key per item
// that overlaps the block, in the order of items, with the item's offset made
// relative to the block's first token.
func AppendExtraKeys(dst []ExtraKey, items []MMItem, blockIndex, blockSize int) []ExtraKey {
	if blockSize < 1 || blockIndex < 0 {
		return dst
	}
	start := blockIndex * blockSize
	end := start + blockSize
	for _, it := range items {
		if it.overlaps(start, end) {
			dst = append(dst, ExtraKey{ID: it.ID, Offset: int64(it.Offset - start)})
		}
	}
	return dst
}

// Block returns the layout-v1 hash of one block: XXH3-64 seeded with parent
// over the tokens as little-endian uint32, followed by the extra-key section
// if extra is not empty (see the package documentation). It never returns 0.
func Block(parent uint64, tokens []uint32, extra []ExtraKey) uint64 {
	if len(extra) == 0 && hostLittleEndian {
		return nonZero(xxh3.HashSeed(tokenBytes(tokens), parent))
	}
	return blockBuffered(parent, tokens, extra, hostLittleEndian)
}

// blockBuffered builds the block's bytes in a buffer (on the stack when they
// are small) and hashes them. With zeroCopy false the tokens are encoded one
// by one, which is correct on any host.
func blockBuffered(parent uint64, tokens []uint32, extra []ExtraKey, zeroCopy bool) uint64 {
	var stack [512]byte
	b := stack[:0]
	if n := blockLen(tokens, extra); n > len(stack) {
		b = make([]byte, 0, n)
	}
	if zeroCopy {
		b = append(b, tokenBytes(tokens)...)
	} else {
		for _, t := range tokens {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
	}
	if len(extra) > 0 {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(extra)))
		for _, k := range extra {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(k.ID)))
			b = append(b, k.ID...)
			b = binary.LittleEndian.AppendUint64(b, uint64(k.Offset))
		}
	}
	return nonZero(xxh3.HashSeed(b, parent))
}

// blockLen is the number of bytes hashed for a block.
func blockLen(tokens []uint32, extra []ExtraKey) int {
	n := 4 * len(tokens)
	if len(extra) > 0 {
		n += 4
		for _, k := range extra {
			n += 4 + len(k.ID) + 8
		}
	}
	return n
}

// tokenBytes views tokens as their in-memory bytes without copying. Only on a
// little-endian host are these the layout's bytes.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return ZeroReplacement
	}
	return h
}

// Hasher hashes prompts of one namespace into chains of block hashes. It is
// immutable and safe for concurrent use.
type Hasher struct {
	ns   Namespace
	root uint64
}

// New returns a Hasher for ns, computing its root once.
func New(ns Namespace) (*Hasher, error) {
	root, err := ns.Root()
	if err != nil {
		return nil, fmt.Errorf("new hasher: %w", err)
	}
	return &Hasher{ns: ns, root: root}, nil
}

// Root returns the namespace root hash, the parent of block 0.
func (h *Hasher) Root() uint64 { return h.root }

// Namespace returns the namespace the Hasher was built for.
func (h *Hasher) Namespace() Namespace { return h.ns }

// BlockSize returns the block size in tokens.
func (h *Hasher) BlockSize() int { return h.ns.BlockSize }

// Chain appends to dst one hash per full block of tokens, chained from the
// root, and returns the extended slice. items are the prompt's multimodal
// spans (nil if none). A partial tail is ignored. With no items and enough
// capacity in dst it does not allocate.
func (h *Hasher) Chain(dst []uint64, tokens []uint32, items []MMItem) []uint64 {
	return h.Extend(dst, h.root, 0, tokens, items)
}

// Extend appends to dst the hashes of the full blocks of tokens, where tokens
// is the part of a prompt that starts at block index firstBlock (token
// firstBlock*BlockSize) and parent is the hash of block firstBlock-1, or the
// root if firstBlock is 0. Offsets in items are relative to the whole prompt.
// Chain(nil, p, items) equals Chain(nil, p[:k*B], items) followed by
// Extend(nil, last, k, p[k*B:], items), so a router can hash only the new
// blocks of a turn. A negative firstBlock appends nothing.
func (h *Hasher) Extend(dst []uint64, parent uint64, firstBlock int, tokens []uint32, items []MMItem) []uint64 {
	bs := h.ns.BlockSize
	n := FullBlocks(len(tokens), bs)
	if n == 0 || firstBlock < 0 {
		return dst
	}
	dst = slices.Grow(dst, n)
	if len(items) == 0 && hostLittleEndian {
		b := tokenBytes(tokens[:n*bs])
		w := 4 * bs
		for i := range n {
			parent = nonZero(xxh3.HashSeed(b[i*w:(i+1)*w], parent))
			dst = append(dst, parent)
		}
		return dst
	}
	var keyBuf [8]ExtraKey
	for i := range n {
		keys := AppendExtraKeys(keyBuf[:0], items, firstBlock+i, bs)
		parent = Block(parent, tokens[i*bs:(i+1)*bs], keys)
		dst = append(dst, parent)
	}
	return dst
}
