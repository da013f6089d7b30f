package simengine

import (
	"container/list"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// The offload tier: a second, bounded prefix cache below the GPU one, as
// vLLM's KV offloading (the OffloadingConnector over vllm/v1/kv_offload/)
// and SGLang's HiCache keep one. The simulator keeps a block on the tier
// when the GPU cache evicts it, as a write-back tier does, and announces
// it as the engine does:
//
//   - vLLM: vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py
//     turns the offloading manager's OffloadingEvent(keys, medium, removed)
//     into BlockStored / BlockRemoved on that medium; with self-describing
//     events the store carries the block's parent_block_hash, token_ids,
//     block_size, lora_id and lora_name as the GPU store did. The media
//     are the load-store specs' names (vllm/v1/kv_offload/mediums.py: "CPU",
//     "Disk"; the file-system and object-store backends "STORAGE", "FS",
//     "OBJ").
//   - SGLang: python/sglang/srt/disaggregation/kv_events.py, StorageMedium
//     "CPU_PINNED", "DISK", "EXTERNAL", and HiCache's tier names
//     "CPU_TIER1" (host memory) and "CPU_TIER2" (storage); one page per
//     event, the salt as for GPU pages.
//
// A prefix of blocks the GPU cache misses but the tier holds is loaded
// back at admission, as vLLM's offloading connector does (the scheduler
// parks the request, WAITING_FOR_REMOTE_KVS, while the worker copies the
// blocks, and schedules its prefill once they are in): the blocks are
// allocated on the GPU, the copy takes the profile's
// [costmodel.Profile.TransferMillis] for the tier's medium (host memory
// for "CPU", "CPU_PINNED" and "CPU_TIER1", the disk link for the others),
// one copy at a time over the tier's link, while the engine's steps go
// on without the request. When the copy ends the blocks are cached and
// announced on the GPU again (BlockStored on GPU, as the GPU cache caches
// loaded blocks), count as cached tokens, and the request's prefill
// starts at the next step. The engine loads only when the copy is faster
// than recomputing the blocks (Prefill.Millis with and without them, the
// rule the kvdir placement policy prices), and computes them otherwise.
// The tier keeps its copy (a later GPU eviction of the block adds
// nothing), drops its least recently used block when full (BlockRemoved on
// its medium) and is cleared, silently, with the GPU cache on a reset: the
// reset's AllBlocksCleared covers every medium.

// offloadMedia lists the tier media the simulator emits, per dialect, as
// the engines spell them.
var offloadMedia = map[Dialect][]string{
	DialectVLLM:   {"CPU", "Disk", "STORAGE", "FS", "OBJ"},
	DialectSGLang: {"CPU_PINNED", "CPU_TIER1", "CPU_TIER2", "DISK", "EXTERNAL"},
}

// MaxOffloadBlocks bounds the tier's capacity (it keeps every block's
// tokens, as the GPU cache does).
const MaxOffloadBlocks = 1 << 22

// CheckOffload validates the offload tier settings against the shape (New
// checks them too).
func (c Config) CheckOffload() error {
	if c.OffloadMedium == "" {
		if c.OffloadBlocks != 0 {
			return fmt.Errorf("%w: OffloadBlocks %d without an offload medium", ErrInvalidConfig, c.OffloadBlocks)
		}
		return nil
	}
	names := offloadMedia[c.Shape.Dialect]
	switch {
	case names == nil:
		return fmt.Errorf("%w: offloading is not emulated in the %v dialect", ErrInvalidConfig, c.Shape.Dialect)
	case !slices.Contains(names, c.OffloadMedium):
		return fmt.Errorf("%w: offload medium %q: the %v dialect's are %s", ErrInvalidConfig, c.OffloadMedium, c.Shape.Dialect, strings.Join(names, ", "))
	case c.OffloadBlocks < 1 || c.OffloadBlocks > MaxOffloadBlocks:
		return fmt.Errorf("%w: OffloadBlocks %d not in [1, %d]", ErrInvalidConfig, c.OffloadBlocks, MaxOffloadBlocks)
	case c.OffloadBlocks > MaxCacheTokens/c.BlockSize:
		return fmt.Errorf("%w: OffloadBlocks %d × BlockSize %d exceeds %d tokens", ErrInvalidConfig, c.OffloadBlocks, c.BlockSize, MaxCacheTokens)
	case len(c.Shape.Groups) > 0 || c.Shape.Bigrams:
		return fmt.Errorf("%w: offloading with KV-cache groups or bigram token_ids is not emulated", ErrInvalidConfig)
	}
	return nil
}

// reqMeta is what a request's blocks carry into later events: its
// namespace's event fields and, in TensorRT-LLM's dialect, whether its
// blocks are announced as remote or with multimodal placeholders.
type reqMeta struct {
	lora   string
	loraID int64
	salt   string
	remote bool // locality "REMOTE" (DialectTRTLLM)
	mm     bool // a multimodal placeholder token (DialectTRTLLM)
}

// tierBlock is one block held on the tier.
type tierBlock struct {
	hash, parent BlockHash
	hasParent    bool
	tokens       []uint32
	meta         *reqMeta
}

// media is the engine's state beyond the GPU prefix cache: who stored each
// GPU block, and the offload tier. The Cache calls it on evictions and
// resets.
type media struct {
	engine *Engine
	owner  []*reqMeta // per GPU block id: the request that stored it

	medium   string // "" without a tier
	capacity int
	lru      *list.List // of *tierBlock, most recently used first
	byHash   map[BlockHash]*list.Element
}

func newMedia(e *Engine) *media {
	m := &media{engine: e, owner: make([]*reqMeta, e.cfg.CapacityBlocks)}
	if e.cfg.OffloadMedium != "" {
		m.medium, m.capacity = e.cfg.OffloadMedium, e.cfg.OffloadBlocks
		m.lru, m.byHash = list.New(), make(map[BlockHash]*list.Element)
	}
	return m
}

// OffloadedBlocks returns the number of blocks on the offload tier.
func (e *Engine) OffloadedBlocks() int {
	if e.media.lru == nil {
		return 0
	}
	return e.media.lru.Len()
}

// noteStored records that request s stored its blocks [first, full).
func (m *media) noteStored(s *seq, first, full int) {
	for _, id := range s.blocks[first:full] {
		m.owner[id] = s.meta
	}
}

// evicted is called by the Cache when it evicts GPU block id, still
// cached, after appending rm, the eviction's BlockRemoved: it gives rm the
// block's locality and keeps the block on the tier.
func (m *media) evicted(c *Cache, id int32, rm *kvevents.BlockRemoved) {
	meta := m.owner[id]
	m.owner[id] = nil
	if meta != nil && meta.remote {
		rm.Locality = kvevents.LocalityRemote
	}
	if m.lru == nil {
		return
	}
	b := &c.blocks[id]
	if el, ok := m.byHash[b.hash]; ok {
		m.lru.MoveToFront(el)
		return
	}
	for m.lru.Len() >= m.capacity {
		old := m.lru.Remove(m.lru.Back()).(*tierBlock)
		delete(m.byHash, old.hash)
		c.events = append(c.events, &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{old.hash.Wire()}, Medium: m.medium})
	}
	tb := &tierBlock{hash: b.hash, parent: b.parent, hasParent: b.hasParent, tokens: slices.Clone(c.blockTokens(id)), meta: meta}
	if tb.meta == nil {
		tb.meta = &reqMeta{}
	}
	m.byHash[b.hash] = m.lru.PushFront(tb)
	c.events = append(c.events, m.tierStored(tb))
}

// tierStored is the BlockStored announcing tb on the tier, in the
// engine's dialect.
func (m *media) tierStored(tb *tierBlock) *kvevents.BlockStored {
	ev := &kvevents.BlockStored{
		BlockHashes: []kvevents.Hash{tb.hash.Wire()},
		TokenIDs:    slices.Clone(tb.tokens),
		BlockSize:   len(tb.tokens),
		Medium:      m.medium,
	}
	if tb.hasParent {
		p := tb.parent.Wire()
		ev.Parent = &p
	}
	meta := tb.meta
	if m.engine.cfg.Shape.Dialect == DialectSGLang {
		ev.CacheSalt = meta.salt
		return ev
	}
	ev.LoRAName = meta.lora
	if meta.loraID != 0 {
		id := meta.loraID
		ev.LoRAID = &id
	}
	// The extra keys as the GPU store had them (see appendStored).
	var k []any
	if meta.lora != "" {
		k = append(k, meta.lora)
	}
	if !tb.hasParent && meta.salt != "" {
		k = append(k, meta.salt)
	}
	if meta.lora != "" || meta.salt != "" {
		ev.ExtraKeys = [][]any{k}
	}
	return ev
}

// tierHits returns how many leading blocks of hashes the tier holds,
// marking them most recently used.
func (m *media) tierHits(hashes []BlockHash) int {
	if m.lru == nil {
		return 0
	}
	n := 0
	for _, h := range hashes {
		el, ok := m.byHash[h]
		if !ok {
			break
		}
		m.lru.MoveToFront(el)
		n++
	}
	return n
}

// reset empties the tier (the GPU cache's reset announces
// AllBlocksCleared, which covers it).
func (m *media) reset() {
	clear(m.owner)
	if m.lru != nil {
		m.lru.Init()
		clear(m.byHash)
	}
}

// hostMedia are the tier media in host memory (the others load over the
// disk link).
var hostMedia = []string{"CPU", "CPU_PINNED", "CPU_TIER1"}

// tier is where the offload tier's blocks load from, in the cost model.
func (m *media) tier() costmodel.Tier {
	if slices.Contains(hostMedia, m.medium) {
		return costmodel.TierHost
	}
	return costmodel.TierDisk
}

// worthLoading reports whether loading s's blocks [hits, hits+loaded) from
// the tier is faster than recomputing them.
func (e *Engine) worthLoading(s *seq, hits, loaded int) bool {
	bs, p := e.cfg.BlockSize, &e.cfg.Profile
	h, l := hits*bs, (hits+loaded)*bs
	saved := p.Prefill.Millis(s.promptLen-h, h) - p.Prefill.Millis(s.promptLen-l, l)
	return p.TransferMillis(loaded*bs, e.media.tier()) < saved
}

// startLoad starts loading s's blocks [first, last), allocated on the GPU,
// from the tier at now: the copy follows those already on the link. A copy
// of no time completes at once.
func (e *Engine) startLoad(s *seq, first, last int, now time.Duration) {
	d := costmodel.MillisToDuration(e.cfg.Profile.TransferMillis((last-first)*e.cfg.BlockSize, e.media.tier()))
	if d <= 0 {
		e.loadFromTier(s, first, last)
		return
	}
	e.link = max(e.link, now) + d
	s.readyAt, s.loadFirst, s.loadLast = e.link, first, last
}

// finishLoad caches the blocks s loaded, once its copy has ended.
func (e *Engine) finishLoad(s *seq) {
	e.loadFromTier(s, s.loadFirst, s.loadLast)
	s.readyAt = 0
}

// nextReady returns the earliest end of a load in progress, or 0.
func (e *Engine) nextReady() time.Duration {
	var t time.Duration
	for _, s := range e.running {
		if s.readyAt > 0 && (t == 0 || s.readyAt < t) {
			t = s.readyAt
		}
	}
	return t
}

// loadFromTier caches blocks [first, last) of s, just allocated on the GPU
// for a prefix the tier holds, and announces them on the GPU.
func (e *Engine) loadFromTier(s *seq, first, last int) {
	bs := e.cfg.BlockSize
	for i := first; i < last; i++ {
		var parent BlockHash
		if i > 0 {
			parent = s.hashes[i-1]
		}
		e.cache.store(s.blocks[i], s.hashes[i], parent, i > 0, s.tokens[i*bs:(i+1)*bs])
	}
	e.media.noteStored(s, first, last)
	e.cache.events = e.appendStored(e.cache.events, s, first, last)
	s.numStored = last
}
