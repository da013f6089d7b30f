package simengine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// Limits on the cache geometry.
const (
	// DefaultBlockSize is the default block size in tokens (vLLM's default).
	DefaultBlockSize = 16
	// MaxBlockSize is the largest block size in tokens.
	MaxBlockSize = 1 << 12
	// MaxCacheTokens bounds CapacityBlocks × BlockSize: the cache keeps a copy
	// of every block's tokens.
	MaxCacheTokens = 1 << 26
)

// ErrCacheBusy is returned by a reset while some blocks are still in use by
// running requests (vLLM's reset_prefix_cache refuses in the same case).
var ErrCacheBusy = errors.New("engine: cache blocks in use")

const none = -1 // no block / end of the free list

// block is one physical KV-cache block.
type block struct {
	ref        int32 // requests using the block
	prev, next int32 // free-list links, valid while inFree
	inFree     bool
	cached     bool // hash, parent and tokens are valid and the block is indexed
	hasParent  bool
	hash       BlockHash
	parent     BlockHash
}

// Cache is a paged KV cache with prefix caching, modelled on vLLM V1's block
// pool: a fixed number of blocks, full blocks indexed by their chained hash,
// reference counts, and a free queue in LRU order whose head is evicted
// first. Blocks freed by a request go to the tail, its last block first.
// An unreferenced cached block stays cached (and can be hit) until it is
// reallocated; the eviction emits a BlockRemoved event.
//
// The engine owns the cache; its exported methods only read it.
type Cache struct {
	blockSize int
	blocks    []block
	tokens    []uint32 // blockSize tokens per cached block

	freeHead, freeTail int32
	numFree            int

	index map[BlockHash]int32   // hash → a cached block with that hash
	dups  map[BlockHash][]int32 // further cached blocks with the same hash (vLLM does not de-duplicate)

	events  []kvevents.Event
	queries int64
	hits    int64

	media *media // told of evictions and resets; nil without (offload.go)
}

func newCache(capacity, blockSize int) *Cache {
	c := &Cache{
		blockSize: blockSize,
		blocks:    make([]block, capacity),
		tokens:    make([]uint32, capacity*blockSize),
		index:     make(map[BlockHash]int32),
		dups:      make(map[BlockHash][]int32),
		freeHead:  none,
		freeTail:  none,
	}
	for i := range c.blocks {
		c.pushTail(int32(i))
	}
	return c
}

// BlockSize returns the block size in tokens.
func (c *Cache) BlockSize() int { return c.blockSize }

// Capacity returns the number of blocks.
func (c *Cache) Capacity() int { return len(c.blocks) }

// NumFree returns the number of unreferenced blocks (empty or cached).
func (c *Cache) NumFree() int { return c.numFree }

// Usage returns the fraction of blocks referenced by requests, as vLLM's
// kv_cache_usage_perc (unreferenced cached blocks count as free).
func (c *Cache) Usage() float64 {
	return float64(len(c.blocks)-c.numFree) / float64(len(c.blocks))
}

// PrefixQueries returns the prompt tokens looked up in the prefix cache
// (vLLM's prefix_cache_queries).
func (c *Cache) PrefixQueries() int64 { return c.queries }

// PrefixHits returns the looked-up tokens found in the prefix cache (vLLM's
// prefix_cache_hits).
func (c *Cache) PrefixHits() int64 { return c.hits }

// CachedBlock describes one cached block, for inspection.
type CachedBlock struct {
	ID        int       // physical block number
	Hash      BlockHash // the block's hash
	Parent    BlockHash // the previous block's hash, if HasParent
	HasParent bool      // false for a request's first block
	Tokens    []uint32  // the block's tokens (a copy)
	Refs      int       // requests currently using the block
}

// Contents returns every cached block in block-number order. Several blocks
// may share a hash (duplicates).
func (c *Cache) Contents() []CachedBlock {
	var out []CachedBlock
	for i := range c.blocks {
		b := &c.blocks[i]
		if !b.cached {
			continue
		}
		out = append(out, CachedBlock{
			ID: i, Hash: b.hash, Parent: b.parent, HasParent: b.hasParent,
			Tokens: slices.Clone(c.blockTokens(int32(i))),
			Refs:   int(b.ref),
		})
	}
	return out
}

func (c *Cache) blockTokens(id int32) []uint32 {
	off := int(id) * c.blockSize
	return c.tokens[off : off+c.blockSize : off+c.blockSize]
}

// Free-list operations.

func (c *Cache) pushTail(id int32) {
	b := &c.blocks[id]
	b.prev, b.next, b.inFree = c.freeTail, none, true
	if c.freeTail == none {
		c.freeHead = id
	} else {
		c.blocks[c.freeTail].next = id
	}
	c.freeTail = id
	c.numFree++
}

func (c *Cache) unlink(id int32) {
	b := &c.blocks[id]
	if b.prev == none {
		c.freeHead = b.next
	} else {
		c.blocks[b.prev].next = b.next
	}
	if b.next == none {
		c.freeTail = b.prev
	} else {
		c.blocks[b.next].prev = b.prev
	}
	b.prev, b.next, b.inFree = none, none, false
	c.numFree--
}

// lookup appends to dst the blocks of the longest cached prefix of hashes.
func (c *Cache) lookup(dst []int32, hashes []BlockHash) []int32 {
	for _, h := range hashes {
		id, ok := c.index[h]
		if !ok {
			break
		}
		dst = append(dst, id)
	}
	return dst
}

// evictableAmong counts the blocks of ids that are unreferenced, i.e. that
// touching them takes out of the free queue.
func (c *Cache) evictableAmong(ids []int32) int {
	n := 0
	for _, id := range ids {
		if c.blocks[id].ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on each block of ids.
func (c *Cache) touch(ids []int32) {
	for _, id := range ids {
		b := &c.blocks[id]
		if b.inFree {
			c.unlink(id)
		}
		b.ref++
	}
}

// allocate appends n fresh blocks to dst, evicting cached blocks from the
// head of the free queue as needed. The caller has checked n <= NumFree.
func (c *Cache) allocate(dst []int32, n int) []int32 {
	for range n {
		id := c.freeHead
		c.unlink(id)
		c.evict(id)
		c.blocks[id].ref = 1
		dst = append(dst, id)
	}
	return dst
}

// evict drops block id from the index, if it is cached, and records a
// BlockRemoved event.
func (c *Cache) evict(id int32) {
	b := &c.blocks[id]
	if !b.cached {
		return
	}
	c.unindex(b.hash, id)
	rm := &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{b.hash.Wire()}, Medium: MediumGPU}
	c.events = append(c.events, rm)
	if c.media != nil {
		c.media.evicted(c, id, rm)
	}
	b.cached, b.hasParent = false, false
}

func (c *Cache) unindex(h BlockHash, id int32) {
	d := c.dups[h]
	if c.index[h] == id {
		if len(d) == 0 {
			delete(c.index, h)
			return
		}
		c.index[h] = d[len(d)-1]
		d = d[:len(d)-1]
	} else if i := slices.Index(d, id); i >= 0 {
		d = slices.Delete(d, i, i+1)
	}
	if len(d) == 0 {
		delete(c.dups, h)
	} else {
		c.dups[h] = d
	}
}

// store marks block id as cached with the given hash, parent and tokens.
func (c *Cache) store(id int32, h, parent BlockHash, hasParent bool, tokens []uint32) {
	b := &c.blocks[id]
	b.cached, b.hash, b.parent, b.hasParent = true, h, parent, hasParent
	copy(c.blockTokens(id), tokens)
	if _, ok := c.index[h]; ok {
		c.dups[h] = append(c.dups[h], id)
	} else {
		c.index[h] = id
	}
}

// release drops one reference on each block of ids, last block first, so
// that a request's tail blocks are evicted before its head.
func (c *Cache) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &c.blocks[id]
		b.ref--
		if b.ref == 0 {
			c.pushTail(id)
		}
	}
}

// reset uncaches every block and records AllBlocksCleared; it fails if any
// block is referenced.
func (c *Cache) reset() error {
	if used := len(c.blocks) - c.numFree; used > 0 {
		return fmt.Errorf("reset prefix cache: %w (%d blocks)", ErrCacheBusy, used)
	}
	for i := range c.blocks {
		c.blocks[i].cached, c.blocks[i].hasParent = false, false
	}
	clear(c.index)
	clear(c.dups)
	if c.media != nil {
		c.media.reset()
	}
	c.events = append(c.events, &kvevents.AllBlocksCleared{})
	return nil
}

// takeEvents returns and clears the pending events.
func (c *Cache) takeEvents() []kvevents.Event {
	ev := c.events
	c.events = nil
	return ev
}
