package agent

import (
	"cmp"
	"container/list"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Problem kinds counted by the Translator (label values of
// kvdir_agent_problems_total).
const (
	ProblemUnknownParent    = "unknown_parent"
	ProblemTokenMismatch    = "token_mismatch"
	ProblemBadBlockSize     = "bad_block_size"
	ProblemUnknownMedium    = "unknown_medium"
	ProblemUnsupportedExtra = "unsupported_extra_keys"
	ProblemOtherGroup       = "non_attention_group"
	ProblemUnknownRemoved   = "unknown_removed"
	ProblemHashConflict     = "hash_conflict"
	ProblemMapEvicted       = "map_evicted"
	ProblemNamespace        = "bad_namespace"
	ProblemNilEvent         = "nil_event"
	// ProblemRemoteLocality counts blocks of locality "REMOTE": held in a
	// pool the worker shares with others, not by the worker itself.
	ProblemRemoteLocality = "remote_locality"
	// ProblemBlockSizeMismatch counts indexed blocks whose block_size
	// differs from the configured one (see SetBlockSize); they are indexed
	// in their own block size's namespace, which a router hashing with the
	// configured size never computes.
	ProblemBlockSizeMismatch = "block_size_mismatch"
	// ProblemStringToken counts blocks with a string token id (TensorRT-LLM
	// multimodal placeholders), whose content hash cannot be computed.
	ProblemStringToken = "string_token"
	// ProblemLayoutFull counts groups not recorded in the Layout because
	// maxGroups were already recorded.
	ProblemLayoutFull = "layout_full"
)

// ReportMode says how BlockStored events relate to what the engine holds.
type ReportMode int

const (
	// ReportIncremental (vLLM's default kv_cache_report_mode) announces
	// each physical copy of a block once; duplicate stores are
	// reference-counted and need as many removals.
	ReportIncremental ReportMode = iota
	// ReportFull is vLLM's kv_cache_report_mode="full" (set per request):
	// blocks reused from the prefix cache are announced again, in events
	// identical to the first store (upstream marks them with no field),
	// without a matching removal. A store of a block already held on its
	// medium then does not add a reference, so the first removal drops it.
	// Two physical copies of one block (rare) are then under-counted, and
	// the directory may miss a block the engine still holds, never the
	// reverse.
	ReportFull
)

// ParseReportMode reads a report mode by its vLLM name: "incremental" or
// "full".
func ParseReportMode(s string) (ReportMode, error) {
	switch s {
	case "incremental", "":
		return ReportIncremental, nil
	case "full":
		return ReportFull, nil
	}
	return 0, fmt.Errorf("agent: report mode %q: want incremental or full", s)
}

// maxGroups bounds the KV-cache groups a Layout records; maxBlockSizes the
// distinct block sizes.
const (
	maxGroups     = 64
	maxBlockSizes = 16
)

// GroupLayout is what the Translator saw of one KV-cache group.
type GroupLayout struct {
	// Group is group_idx; -1 for events without one.
	Group int
	// Kind is the last kv_cache_spec_kind seen ("" when absent).
	Kind string
	// BlockSize is the last block_size seen; SlidingWindow the last
	// kv_cache_spec_sliding_window (0 for none).
	BlockSize, SlidingWindow int
	// Indexed says whether the group's blocks enter the directory.
	Indexed bool
	// Stores counts the group's BlockStored events; Skipped the blocks of
	// the group that were not indexed because of the group's kind.
	Stores, Skipped uint64
}

// Layout is the KV-cache layout a Translator learned from events.
type Layout struct {
	// BlockSizes are the distinct block sizes of indexed stores, ascending.
	BlockSizes []int
	// Groups are the groups seen, by group index.
	Groups []GroupLayout
}

// numMedia covers kvdirv1.Medium values GPU..REMOTE (index = enum value).
const numMedia = 5

// DefaultMapCapacity is the engine-hash map capacity used when none is set.
const DefaultMapCapacity = 1 << 20

// maxRoots bounds the cache of namespace roots (one per LoRA and salt).
const maxRoots = 4096

// TranslatorStats counts what a Translator did.
type TranslatorStats struct {
	// Events counts decoded engine events by wire type.
	Events map[string]uint64
	// BlocksStored and BlocksRemoved count blocks in the directory events
	// produced (a removal only when the last reference goes).
	BlocksStored, BlocksRemoved uint64
	// Cleared counts AllBlocksCleared events.
	Cleared uint64
	// Problems counts skipped blocks or events by kind.
	Problems map[string]uint64
	// MapEntries is the current size of the engine-hash map.
	MapEntries int
	// Rereported counts blocks stored again while held, which in
	// ReportFull mode added no reference.
	Rereported uint64
}

// entry is one engine block: its content hash and how many times the engine
// holds it per medium.
type entry struct {
	engine  kvevents.Hash
	content uint64
	refs    [numMedia]int32
	elem    *list.Element
}

func (e *entry) held() bool {
	for _, r := range e.refs {
		if r > 0 {
			return true
		}
	}
	return false
}

// Translator turns decoded engine event batches into directory events in
// content hashes. It is pure (no I/O) and not safe for concurrent use.
//
// Entries whose reference counts reach zero stay in the map (an engine hash
// always names the same content), so a later child of an evicted parent can
// still be translated; the map is bounded by its capacity and drops the least
// recently used entries. Dropping an entry the engine still holds publishes
// its removal, so the directory never keeps a block the agent can no longer
// account for.
type Translator struct {
	model    string
	capacity int
	log      *slog.Logger

	m     map[kvevents.Hash]*entry
	lru   *list.List // front = most recently used
	roots map[blockhash.Namespace]uint64

	events   map[string]uint64
	problems map[string]uint64
	logged   map[string]bool
	stored   uint64
	removed  uint64
	cleared  uint64
	rereport uint64

	mode       ReportMode
	blockSize  int // configured; 0 = not checked
	groups     map[int]*GroupLayout
	blockSizes []int
	// layoutDirty says the layout changed since the last layout event.
	layoutDirty bool

	// scratch
	chain []uint64
	extra []blockhash.ExtraKey
}

// NewTranslator returns a Translator for a model. capacity bounds the
// engine-hash map (DefaultMapCapacity if <= 0); a good value is twice the
// engine's KV-cache blocks. log may be nil.
func NewTranslator(model string, capacity int, log *slog.Logger) *Translator {
	if capacity <= 0 {
		capacity = DefaultMapCapacity
	}
	if log == nil {
		log = slog.Default()
	}
	return &Translator{
		model: model, capacity: capacity, log: log,
		m:        make(map[kvevents.Hash]*entry),
		lru:      list.New(),
		roots:    make(map[blockhash.Namespace]uint64),
		events:   make(map[string]uint64),
		problems: make(map[string]uint64),
		logged:   make(map[string]bool),
		groups:   make(map[int]*GroupLayout),
	}
}

// SetReportMode sets how stores are counted (ReportIncremental by default).
func (t *Translator) SetReportMode(m ReportMode) { t.mode = m }

// SetBlockSize sets the block size the worker is configured with
// (--block-size); an indexed store of another size is then logged and
// counted as ProblemBlockSizeMismatch. 0 disables the check.
func (t *Translator) SetBlockSize(bs int) { t.blockSize = max(bs, 0) }

// Layout returns the groups and block sizes seen so far. It survives
// AllBlocksCleared and Reset: the layout is the engine's configuration.
func (t *Translator) Layout() Layout {
	l := Layout{BlockSizes: slices.Clone(t.blockSizes), Groups: make([]GroupLayout, 0, len(t.groups))}
	for _, g := range t.groups {
		l.Groups = append(l.Groups, *g)
	}
	slices.SortFunc(l.Groups, func(a, b GroupLayout) int { return cmp.Compare(a.Group, b.Group) })
	return l
}

// group returns the layout entry of group_idx g (nil: -1), creating it; nil
// when maxGroups are recorded already.
func (t *Translator) group(g *int) *GroupLayout {
	idx := -1
	if g != nil {
		idx = *g
	}
	if gl, ok := t.groups[idx]; ok {
		return gl
	}
	if len(t.groups) >= maxGroups {
		t.problem(ProblemLayoutFull, 1, "more KV-cache groups than the layout records")
		return nil
	}
	gl := &GroupLayout{Group: idx}
	t.groups[idx] = gl
	t.layoutDirty = true
	return gl
}

// noteBlockSize records the block size of an indexed store and checks it
// against the configured one.
func (t *Translator) noteBlockSize(bs, n int) {
	if !slices.Contains(t.blockSizes, bs) && len(t.blockSizes) < maxBlockSizes {
		t.blockSizes = append(t.blockSizes, bs)
		slices.Sort(t.blockSizes)
		t.layoutDirty = true
		if t.blockSize > 0 && bs != t.blockSize {
			t.log.Warn(fmt.Sprintf("agent: --block-size %d, but the engine sends blocks of %d tokens: set --block-size %d or leave it unset (the directory learns block sizes from the events)",
				t.blockSize, bs, bs),
				"engine_block_size", bs, "configured_block_size", t.blockSize)
		}
	}
	if t.blockSize > 0 && bs != t.blockSize {
		// Counted, not skipped: the warning above is the log line.
		t.problems[ProblemBlockSizeMismatch] += uint64(n)
	}
}

// indexable decides whether a store's group enters the directory, and says
// why not.
func indexable(kind string, group *int) (bool, string) {
	switch {
	case kind == "":
		// Older vLLM and SGLang name no kind: as before, only group 0.
		if group == nil || *group == 0 {
			return true, ""
		}
		return false, "group_idx " + strconv.Itoa(*group) + " without kv_cache_spec_kind: only group 0 is indexed"
	case kvevents.IsFullAttentionKind(kind):
		return true, ""
	}
	return false, "kv_cache_spec_kind " + kind + " not indexed: only full-attention groups make a prefix reusable"
}

// removable decides whether a removal's group is indexed, from the kinds the
// group's stores had: an unknown group is indexed only if it is group 0 (or
// none), as before.
func (t *Translator) removable(group *int) bool {
	idx := -1
	if group != nil {
		idx = *group
	}
	if gl, ok := t.groups[idx]; ok && gl.Stores > 0 {
		return gl.Indexed
	}
	return group == nil || *group == 0
}

// Reset forgets every mapping and reference count (engine restart).
func (t *Translator) Reset() {
	clear(t.m)
	t.lru.Init()
}

// ForgetHeld sets every reference count to zero but keeps the mappings (the
// engine lost track of what it holds, but engine hashes still name the same
// content): used when events were lost and the directory is cleared.
func (t *Translator) ForgetHeld() {
	for _, e := range t.m {
		e.refs = [numMedia]int32{}
	}
}

// Len returns the number of mappings.
func (t *Translator) Len() int { return len(t.m) }

// Lookup returns the content hash an engine hash maps to.
func (t *Translator) Lookup(h kvevents.Hash) (uint64, bool) {
	e, ok := t.m[h]
	if !ok {
		return 0, false
	}
	return e.content, true
}

// Stats returns a copy of the counters.
func (t *Translator) Stats() TranslatorStats {
	s := TranslatorStats{
		Events:       make(map[string]uint64, len(t.events)),
		Problems:     make(map[string]uint64, len(t.problems)),
		BlocksStored: t.stored, BlocksRemoved: t.removed, Cleared: t.cleared,
		MapEntries: len(t.m), Rereported: t.rereport,
	}
	for k, v := range t.events {
		s.Events[k] = v
	}
	for k, v := range t.problems {
		s.Problems[k] = v
	}
	return s
}

// problem counts n occurrences of a problem and logs the first of each kind.
func (t *Translator) problem(kind string, n int, detail string) {
	t.problems[kind] += uint64(n)
	if !t.logged[kind] {
		t.logged[kind] = true
		t.log.Warn("agent: skipping engine event data (logged once per kind)", "kind", kind, "detail", detail)
	}
}

// Translate appends to dst the directory events for batch b and returns dst
// and the number of blocks they carry.
func (t *Translator) Translate(dst []*kvdirv1.Event, b kvevents.Batch) ([]*kvdirv1.Event, int) {
	blocks := 0
	for _, ev := range b.Events {
		var n int
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			if e == nil {
				t.problem(ProblemNilEvent, 1, "nil BlockStored")
				continue
			}
			t.events[kvevents.TypeBlockStored]++
			dst, n = t.stored1(dst, e)
		case *kvevents.BlockRemoved:
			if e == nil {
				t.problem(ProblemNilEvent, 1, "nil BlockRemoved")
				continue
			}
			t.events[kvevents.TypeBlockRemoved]++
			dst, n = t.removed1(dst, e)
		case *kvevents.AllBlocksCleared:
			t.events[kvevents.TypeAllBlocksCleared]++
			t.cleared++
			t.Reset()
			dst = append(dst, &kvdirv1.Event{Kind: &kvdirv1.Event_Cleared{Cleared: &kvdirv1.AllCleared{}}})
			n = 1
		default:
			t.problem(ProblemNilEvent, 1, "unknown event value")
		}
		blocks += n
	}
	return dst, blocks
}

// parseMedium maps a wire medium to the directory's; ok false if unknown.
//
// vLLM names "GPU", "CPU" and, for its offloading connectors, "STORAGE"
// (earlier "FS", a file system, and "OBJ", an object store); SGLang's
// StorageMedium is "GPU", "CPU_PINNED", "DISK" and "EXTERNAL" (a shared pool
// such as Mooncake), its HiCache tiers "CPU_TIER1" (host memory) and
// "CPU_TIER2" (storage).
func parseMedium(s string) (kvdirv1.Medium, bool) {
	switch strings.ToUpper(s) {
	case "", "GPU", "CUDA", "HBM", "DEVICE":
		return kvdirv1.Medium_MEDIUM_GPU, true
	case "CPU", "CPU_TIER", "DRAM", "CPU_PINNED", "CPU_TIER1", "HOST":
		return kvdirv1.Medium_MEDIUM_CPU, true
	case "DISK", "SSD", "LOCAL_DISK", "STORAGE", "FS", "NVME", "CPU_TIER2":
		return kvdirv1.Medium_MEDIUM_DISK, true
	case "REMOTE", "LMCACHE", "S3", "OBJ", "EXTERNAL":
		return kvdirv1.Medium_MEDIUM_REMOTE, true
	}
	return 0, false
}

// isRemote reports a locality of "REMOTE".
func isRemote(locality string) bool { return strings.EqualFold(locality, kvevents.LocalityRemote) }

// rootFor returns the namespace root, caching it.
func (t *Translator) rootFor(ns blockhash.Namespace) (uint64, bool) {
	if r, ok := t.roots[ns]; ok {
		return r, true
	}
	r, err := ns.Root()
	if err != nil {
		t.problem(ProblemNamespace, 1, err.Error())
		return 0, false
	}
	if len(t.roots) >= maxRoots {
		clear(t.roots)
	}
	t.roots[ns] = r
	return r, true
}

// saltOf returns the cache salt vLLM put in block 0's extra keys: the last
// string that is not the LoRA name (LoRA comes first, then multimodal
// tuples, then the salt).
func saltOf(keys []any, lora string) string {
	salt := ""
	skippedLoRA := false
	for _, k := range keys {
		s, ok := k.(string)
		if !ok {
			continue
		}
		if !skippedLoRA && lora != "" && s == lora {
			skippedLoRA = true
			continue
		}
		salt = s
	}
	return salt
}

// blockExtra converts one block's extra keys to blockhash extra keys
// (multimodal (identifier, offset) tuples). ok is false for keys that cannot
// be represented (prompt-embedding bytes, unknown shapes).
func blockExtra(dst []blockhash.ExtraKey, keys []any) ([]blockhash.ExtraKey, bool) {
	for _, k := range keys {
		switch v := k.(type) {
		case string, nil:
			// LoRA name or salt: part of the namespace.
		case []any:
			if len(v) != 2 {
				return dst, false
			}
			id, ok := v[0].(string)
			if !ok {
				return dst, false
			}
			var off int64
			switch o := v[1].(type) {
			case int64:
				off = o
			default:
				return dst, false
			}
			dst = append(dst, blockhash.ExtraKey{ID: id, Offset: off})
		default:
			return dst, false
		}
	}
	return dst, true
}

func (t *Translator) stored1(dst []*kvdirv1.Event, e *kvevents.BlockStored) ([]*kvdirv1.Event, int) {
	n := len(e.BlockHashes)
	if n == 0 {
		return dst, 0
	}
	ok, why := indexable(e.SpecKind, e.GroupIdx)
	if gl := t.group(e.GroupIdx); gl != nil {
		sw := 0
		if e.SlidingWindow != nil {
			sw = *e.SlidingWindow
		}
		if gl.Kind != e.SpecKind || gl.BlockSize != e.BlockSize || gl.SlidingWindow != sw || gl.Indexed != ok {
			t.layoutDirty = true
		}
		gl.Kind, gl.BlockSize, gl.SlidingWindow, gl.Indexed = e.SpecKind, e.BlockSize, sw, ok
		gl.Stores++
		if !ok {
			gl.Skipped += uint64(n)
		}
	}
	if !ok {
		t.problem(ProblemOtherGroup, n, why)
		return dst, 0
	}
	// A remote store (a shared pool, not the worker's own) is hashed and
	// mapped, so that local blocks stored under it still resolve their
	// parent, but it gains no reference and nothing is published.
	remote := isRemote(e.Locality)
	if remote {
		t.problem(ProblemRemoteLocality, n, "locality REMOTE: a shared pool, not the worker's own")
	}
	if e.BlockSize < 1 || e.BlockSize > blockhash.MaxBlockSize {
		t.problem(ProblemBadBlockSize, n, "block_size out of range")
		return dst, 0
	}
	t.noteBlockSize(e.BlockSize, n)
	if len(e.TokenIDs) != n*e.BlockSize {
		t.problem(ProblemTokenMismatch, n, "len(token_ids) != len(block_hashes) * block_size")
		return dst, 0
	}
	med, ok := parseMedium(e.Medium)
	if !ok {
		t.problem(ProblemUnknownMedium, n, "medium "+e.Medium)
		return dst, 0
	}
	if e.ExtraKeys != nil && len(e.ExtraKeys) != n {
		t.problem(ProblemUnsupportedExtra, n, "extra_keys length differs from block_hashes")
		return dst, 0
	}
	// Blocks from the first one with a string token on cannot be hashed.
	hashable := n
	if len(e.StrTokens) > 0 {
		hashable = min(n, max(e.StrTokens[0].Index, 0)/e.BlockSize)
		t.problem(ProblemStringToken, n-hashable, "token_ids with a string (multimodal placeholder)")
		if hashable == 0 {
			return dst, 0
		}
	}
	// parent seeds the first block's hash; chainParent is what the directory
	// gets: 0 for a chain's first block (the namespace root is only a seed).
	var parent, chainParent uint64
	if e.Parent == nil {
		ns := blockhash.Namespace{Model: t.model, LoRA: e.LoRAName, BlockSize: e.BlockSize}
		switch {
		case e.CacheSalt != "":
			ns.CacheSalt = e.CacheSalt // SGLang
		case e.ExtraKeys != nil:
			ns.CacheSalt = saltOf(e.ExtraKeys[0], e.LoRAName)
		}
		if parent, ok = t.rootFor(ns); !ok {
			return dst, 0
		}
	} else {
		pe, ok := t.m[*e.Parent]
		if !ok {
			t.problem(ProblemUnknownParent, n, "parent engine hash not in the map")
			return dst, 0
		}
		t.lru.MoveToFront(pe.elem)
		parent = pe.content
		chainParent = parent
	}
	t.chain = t.chain[:0]
	for i := range hashable {
		t.extra = t.extra[:0]
		if e.ExtraKeys != nil {
			if t.extra, ok = blockExtra(t.extra, e.ExtraKeys[i]); !ok {
				t.problem(ProblemUnsupportedExtra, n-i, "extra key that cannot be hashed")
				break
			}
		}
		tokens := e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize]
		h := blockhash.Block(parent, tokens, t.extra)
		eh := e.BlockHashes[i]
		ent, exists := t.m[eh]
		if exists {
			if ent.content != h {
				t.problem(ProblemHashConflict, 1, "engine hash already maps to another content hash")
				ent.content = h
				ent.refs = [numMedia]int32{}
			}
			t.lru.MoveToFront(ent.elem)
		} else {
			ent = &entry{engine: eh, content: h}
			ent.elem = t.lru.PushFront(ent)
			t.m[eh] = ent
		}
		switch {
		case remote:
		case t.mode == ReportFull && ent.refs[med] > 0:
			t.rereport++
		default:
			ent.refs[med]++
		}
		t.chain = append(t.chain, h)
		parent = h
	}
	if remote {
		return t.evict(dst), 0
	}
	if len(t.chain) == 0 {
		return dst, 0
	}
	hashes := make([]uint64, len(t.chain))
	copy(hashes, t.chain)
	dst = append(dst, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{
		Parent: chainParent, Hashes: hashes, Medium: med,
	}}})
	t.stored += uint64(len(hashes))
	return t.evict(dst), len(hashes)
}

// evict drops least recently used mappings above the capacity, publishing
// the removal of those still held.
func (t *Translator) evict(dst []*kvdirv1.Event) []*kvdirv1.Event {
	for len(t.m) > t.capacity {
		back := t.lru.Back()
		ent := back.Value.(*entry)
		t.lru.Remove(back)
		delete(t.m, ent.engine)
		if ent.held() {
			t.problem(ProblemMapEvicted, 1, "engine-hash map full; dropped a held block")
			for m, r := range ent.refs {
				if r > 0 {
					dst = append(dst, removedEvent([]uint64{ent.content}, kvdirv1.Medium(m)))
					t.removed++
				}
			}
		}
	}
	return dst
}

func removedEvent(hashes []uint64, m kvdirv1.Medium) *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: hashes, Medium: m}}}
}

func (t *Translator) removed1(dst []*kvdirv1.Event, e *kvevents.BlockRemoved) ([]*kvdirv1.Event, int) {
	med, ok := parseMedium(e.Medium)
	if !ok {
		t.problem(ProblemUnknownMedium, len(e.BlockHashes), "medium "+e.Medium)
		return dst, 0
	}
	if !t.removable(e.GroupIdx) {
		t.problem(ProblemOtherGroup, len(e.BlockHashes), "removal from a group that is not indexed")
		return dst, 0
	}
	if isRemote(e.Locality) {
		t.problem(ProblemRemoteLocality, len(e.BlockHashes), "locality REMOTE: a shared pool, not the worker's own")
		return dst, 0
	}
	var out []uint64
	for _, h := range e.BlockHashes {
		ent, ok := t.m[h]
		if !ok || ent.refs[med] <= 0 {
			t.problem(ProblemUnknownRemoved, 1, "removal of a block the agent does not know as held")
			continue
		}
		ent.refs[med]--
		if ent.refs[med] == 0 {
			out = append(out, ent.content)
		}
	}
	if len(out) == 0 {
		return dst, 0
	}
	t.removed += uint64(len(out))
	return append(dst, removedEvent(out, med)), len(out)
}
