package simengine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// Engine shapes: how the engine presents its KV cache in its events. The
// cache itself is always one paged prefix cache, the full-attention group
// of the model, which alone decides prefix hits; a Shape changes what the
// events say about it.
//
// Upstream sources the shapes follow (field order as declared there):
//
//   - vLLM: vllm/distributed/kv_events.py (BlockStored: block_hashes,
//     parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//     extra_keys, group_idx, kv_cache_spec_kind,
//     kv_cache_spec_sliding_window; BlockRemoved: block_hashes, medium,
//     group_idx) and vllm/v1/kv_cache_interface.py (the spec kinds);
//     sliding-window groups free the blocks that left the window as
//     SlidingWindowManager.remove_skipped_blocks does in
//     vllm/v1/core/single_type_kv_cache_manager.py.
//   - SGLang: python/sglang/srt/disaggregation/kv_events.py (BlockStored:
//     block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//     medium; BlockStoredWithMetadata adds the kw_only metadata
//     {"cache_salt": ...}; StorageMedium "GPU"; EventBatch [ts, events,
//     attn_dp_rank]), events cut one page per event with bigram token_ids
//     under EAGLE/NEXTN/MTP as its radix cache records them
//     (python/sglang/srt/mem_cache).

// Dialect is the engine whose event encoding the simulator speaks.
type Dialect uint8

const (
	// DialectVLLM is vLLM's BlockStored with lora_name, extra_keys and,
	// with KV-cache groups, group_idx and the spec kind.
	DialectVLLM Dialect = iota
	// DialectSGLang is SGLang's: one page per BlockStored, no lora_name,
	// the cache salt in BlockStoredWithMetadata (array layout) or a
	// top-level cache_salt (map layout); see EncodeSGLangBatch.
	DialectSGLang
	// DialectTRTLLM is TensorRT-LLM's ZMQ publisher's: tagged maps
	// without defaults, no lora_name, locality and multimodal string
	// tokens with mm_keys (see Shape.RemoteEvery, Shape.MMEvery and
	// EncodeTRTLLMBatch).
	DialectTRTLLM
)

// String names the dialect as ParseDialect reads it.
func (d Dialect) String() string {
	switch d {
	case DialectVLLM:
		return "vllm"
	case DialectSGLang:
		return "sglang"
	case DialectTRTLLM:
		return "trtllm"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// ParseDialect reads "vllm", "sglang" or "trtllm".
func ParseDialect(s string) (Dialect, error) {
	switch s {
	case "vllm", "":
		return DialectVLLM, nil
	case "sglang":
		return DialectSGLang, nil
	case "trtllm":
		return DialectTRTLLM, nil
	}
	return 0, fmt.Errorf("%w: events dialect %q, want vllm, sglang or trtllm", ErrInvalidConfig, s)
}

// KVGroup is one KV-cache group the engine reports: its
// kv_cache_spec_kind and, for sliding-window kinds, the window in tokens.
type KVGroup struct {
	Kind          string
	SlidingWindow int
}

// MaxKVGroups bounds the groups of a Shape.
const MaxKVGroups = 16

// windowed reports whether the group keeps only a sliding window.
func (g KVGroup) windowed() bool {
	return g.Kind == kvevents.SpecKindSlidingWindow || g.Kind == kvevents.SpecKindSlidingWindowMLA
}

// String formats the group as ParseKVGroups reads it.
func (g KVGroup) String() string {
	if g.windowed() {
		return g.Kind + ":" + strconv.Itoa(g.SlidingWindow)
	}
	return g.Kind
}

// ParseKVGroups reads a comma-separated list of groups in group_idx order,
// each a kind, sliding-window kinds with ":WINDOW" (tokens): e.g.
// "sliding_window:1024,full_attention" (a hybrid model whose
// full-attention group is group 1) or "mla_attention". The empty string is
// no groups: events without group_idx or kind, as vLLM before the hybrid
// allocator's fields. The kinds are those the simulator can emulate:
// full_attention, mla_attention, sink_full_attention (prefix-keeping),
// sliding_window, sliding_window_mla (windowed) and mamba (see
// reportmode.go); at least one must keep the prefix.
func ParseKVGroups(spec string) ([]KVGroup, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	var out []KVGroup
	for i, item := range strings.Split(spec, ",") {
		kind, win, hasWin := strings.Cut(strings.TrimSpace(item), ":")
		g := KVGroup{Kind: kind}
		if hasWin {
			w, err := strconv.Atoi(win)
			if err != nil {
				return nil, fmt.Errorf("%w: KV-cache group %d (%q): window %q is not a number", ErrInvalidConfig, i, item, win)
			}
			g.SlidingWindow = w
		}
		out = append(out, g)
	}
	if err := checkGroups(out); err != nil {
		return nil, err
	}
	return out, nil
}

func checkGroups(gs []KVGroup) error {
	if len(gs) > MaxKVGroups {
		return fmt.Errorf("%w: %d KV-cache groups, at most %d", ErrInvalidConfig, len(gs), MaxKVGroups)
	}
	full := false
	for i, g := range gs {
		switch {
		case g.windowed():
			if g.SlidingWindow < 1 {
				return fmt.Errorf("%w: KV-cache group %d (%s) needs a window of at least 1 token, e.g. %s:1024", ErrInvalidConfig, i, g.Kind, g.Kind)
			}
		case kvevents.IsFullAttentionKind(g.Kind) || g.mamba():
			if g.SlidingWindow != 0 {
				return fmt.Errorf("%w: KV-cache group %d (%s) has no sliding window", ErrInvalidConfig, i, g.Kind)
			}
			full = full || !g.mamba()
		default:
			return fmt.Errorf("%w: KV-cache group %d: kind %q not emulated, want one of %s, %s, %s, %s, %s, %s", ErrInvalidConfig, i, g.Kind,
				kvevents.SpecKindFullAttention, kvevents.SpecKindMLAAttention, kvevents.SpecKindSinkFullAttention,
				kvevents.SpecKindSlidingWindow, kvevents.SpecKindSlidingWindowMLA, kvevents.SpecKindMamba)
		}
	}
	if len(gs) > 0 && !full {
		return fmt.Errorf("%w: KV-cache groups %v: none keeps the whole prefix (full_attention, mla_attention or sink_full_attention), so nothing could be hit", ErrInvalidConfig, gs)
	}
	return nil
}

// Shape is how the engine's events present its KV cache. The zero Shape is
// the plain vLLM engine: one group, no group_idx.
type Shape struct {
	// Groups are the KV-cache groups, in group_idx order (vLLM only). Each
	// stored block is announced once per group with its group_idx, kind
	// and window; evictions from the prefix cache once per prefix-keeping
	// group. A windowed group removes a request's blocks as soon as they
	// leave its window (vLLM frees them then and publishes the removal
	// when the freed block is evicted: the simulator evicts at once, the
	// hardest case for a consumer, since the prefix-keeping groups still
	// hold the same hashes).
	Groups []KVGroup
	// Dialect is the event encoding: vLLM's or SGLang's.
	Dialect Dialect
	// Bigrams makes token_ids SGLang's EAGLE/NEXTN/MTP bigram pairs
	// [[t0,t1],[t1,t2],...]: a page is stored only once the token after it
	// is known (SGLang only).
	Bigrams bool
	// ReportMode is vLLM's kv_cache_report_mode for every request (vLLM
	// only): ReportFull re-announces prefix-cache hits (see reportmode.go).
	ReportMode ReportMode
	// RemoteEvery N > 0 announces the blocks of every Nth request
	// submitted with locality "REMOTE", stores and evictions, as if they
	// went to a pool shared with other workers (TensorRT-LLM only).
	RemoteEvery int
	// MMEvery N > 0 makes every Nth request submitted multimodal: one
	// token of its prompt, the first of its second block (of its first
	// if it has one block), is announced as a string placeholder with
	// the block's mm_keys (TensorRT-LLM only).
	MMEvery int
}

// Validate checks the shape.
func (sh Shape) Validate() error {
	if sh.Dialect > DialectTRTLLM {
		return fmt.Errorf("%w: unknown events dialect %d", ErrInvalidConfig, sh.Dialect)
	}
	if err := checkGroups(sh.Groups); err != nil {
		return err
	}
	if sh.Dialect == DialectSGLang && len(sh.Groups) > 0 {
		return fmt.Errorf("%w: KV-cache groups need the vllm dialect: SGLang's events carry no group_idx or spec kind", ErrInvalidConfig)
	}
	if err := sh.checkReportMode(); err != nil {
		return err
	}
	if sh.Bigrams && sh.Dialect != DialectSGLang {
		return fmt.Errorf("%w: bigram token_ids are SGLang's (EAGLE/NEXTN/MTP); set the sglang dialect", ErrInvalidConfig)
	}
	return sh.validateTRTLLM()
}

// storable returns how many leading blocks of s may be cached: the full
// ones, and with bigrams only those whose next token is known.
func (e *Engine) storable(s *seq) int {
	full := s.numComputed / e.cfg.BlockSize
	if e.cfg.Shape.Bigrams {
		full = min(full, (len(s.tokens)-1)/e.cfg.BlockSize)
	}
	return full
}

// appendStored appends the events announcing blocks [first, full) of s,
// which were just cached, in the engine's shape.
func (e *Engine) appendStored(dst []kvevents.Event, s *seq, first, full int) []kvevents.Event {
	return e.appendStoredAs(dst, s, first, full, false)
}

// appendStoredAs is appendStored; reused says the blocks are prefix-cache
// hits re-announced in ReportFull mode, which every group announces whole.
func (e *Engine) appendStoredAs(dst []kvevents.Event, s *seq, first, full int, reused bool) []kvevents.Event {
	bs := e.cfg.BlockSize
	sh := &e.cfg.Shape
	if sh.Dialect == DialectTRTLLM {
		return e.appendStoredTRTLLM(dst, s, first, full)
	}
	if sh.Dialect == DialectSGLang {
		// One page per event, chained by parent_block_hash.
		for i := first; i < full; i++ {
			ev := &kvevents.BlockStored{
				BlockHashes: wireHashes(s.hashes[i : i+1]),
				TokenIDs:    slices.Clone(s.tokens[i*bs : (i+1)*bs]),
				BlockSize:   bs,
				Medium:      MediumGPU,
				CacheSalt:   s.salt,
			}
			if i > 0 {
				parent := s.hashes[i-1].Wire()
				ev.Parent = &parent
			}
			if sh.Bigrams {
				ev.Bigram, ev.BigramNext = true, s.tokens[(i+1)*bs]
			}
			dst = append(dst, ev)
		}
		return dst
	}
	ev := e.storedRun(s, first, full)
	ev.LoRAName = s.lora
	if s.salt != "" || s.lora != "" {
		// vLLM hashes every block of an adapter's request with the
		// adapter's name as its first extra key, and a salted request's
		// first block with the salt as its last.
		ev.ExtraKeys = make([][]any, full-first)
		for i := range ev.ExtraKeys {
			var k []any
			if s.lora != "" {
				k = append(k, s.lora)
			}
			if first+i == 0 && s.salt != "" {
				k = append(k, s.salt)
			}
			ev.ExtraKeys[i] = k
		}
	}
	if len(sh.Groups) == 0 {
		return append(dst, ev)
	}
	for g, grp := range sh.Groups {
		gev := *ev
		gev.GroupIdx, gev.SpecKind = ptrInt(g), grp.Kind
		if grp.windowed() {
			gev.SlidingWindow = ptrInt(grp.SlidingWindow)
		}
		if grp.mamba() && !reused {
			dst = e.mambaStore(dst, &gev, g, s, full)
			continue
		}
		dst = append(dst, &gev)
	}
	return dst
}

// slideWindows appends, for every windowed group, the removal of the blocks
// of s that left the group's window: vLLM's sliding-window manager skips
// the first num_computed_tokens - sliding_window + 1 tokens, freeing every
// block wholly inside them.
func (e *Engine) slideWindows(dst []kvevents.Event, s *seq) []kvevents.Event {
	if len(s.swNext) == 0 {
		return dst
	}
	bs := e.cfg.BlockSize
	for g, grp := range e.cfg.Shape.Groups {
		if !grp.windowed() {
			continue
		}
		limit := min(max(s.numComputed-grp.SlidingWindow+1, 0)/bs, s.numStored)
		if limit <= s.swNext[g] {
			continue
		}
		dst = append(dst, &kvevents.BlockRemoved{
			BlockHashes: wireHashes(s.hashes[s.swNext[g]:limit]), Medium: MediumGPU, GroupIdx: ptrInt(g),
		})
		s.swNext[g] = limit
	}
	return dst
}

// resetWindows marks the first stored blocks of s as the first its
// windowed groups hold: blocks hit in the cache were not stored by s.
func (e *Engine) resetWindows(s *seq) {
	for g := range s.swNext {
		s.swNext[g] = s.numStored
	}
}

// newWindows returns the per-group window cursors of a new request, nil
// when no group is windowed.
func (e *Engine) newWindows() []int {
	for _, g := range e.cfg.Shape.Groups {
		if g.windowed() {
			return make([]int, len(e.cfg.Shape.Groups))
		}
	}
	return nil
}

// groupRemovals gives the prefix cache's evictions (BlockRemoved without a
// group) the group_idx of every prefix-keeping group; other events pass.
func (e *Engine) groupRemovals(evs []kvevents.Event) []kvevents.Event {
	groups := e.cfg.Shape.Groups
	if len(groups) == 0 {
		return evs
	}
	out := make([]kvevents.Event, 0, len(evs))
	for _, ev := range evs {
		rm, ok := ev.(*kvevents.BlockRemoved)
		if !ok || rm.GroupIdx != nil {
			out = append(out, ev)
			continue
		}
		for g, grp := range groups {
			if !kvevents.IsFullAttentionKind(grp.Kind) {
				continue
			}
			grm := *rm
			grm.GroupIdx = ptrInt(g)
			out = append(out, &grm)
		}
		out = e.mambaEvicted(out, rm)
	}
	return out
}

func ptrInt(v int) *int { return &v }

// ErrNotSGLang is returned by EncodeSGLangBatch for events SGLang's
// classes cannot carry.
var ErrNotSGLang = errors.New("simengine: not expressible in SGLang's events")

// storedRun is the BlockStored of s's blocks first to full (exclusive) on
// the GPU, under the block before them, with the request's LoRA id: what
// every dialect's store starts from.
func (e *Engine) storedRun(s *seq, first, full int) *kvevents.BlockStored {
	bs := e.cfg.BlockSize
	ev := &kvevents.BlockStored{
		BlockHashes: wireHashes(s.hashes[first:full]),
		TokenIDs:    slices.Clone(s.tokens[first*bs : full*bs]),
		BlockSize:   bs,
		Medium:      MediumGPU,
	}
	if s.loraID != 0 {
		id := s.loraID
		ev.LoRAID = &id
	}
	if first > 0 {
		parent := s.hashes[first-1].Wire()
		ev.Parent = &parent
	}
	return ev
}
