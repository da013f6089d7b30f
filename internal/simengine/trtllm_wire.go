package simengine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/mpenc"
)

// TensorRT-LLM's ZMQ dialect follows its publisher,
// tensorrt_llm/_torch/pyexecutor/kv_cache_events.py: the batch is
// EventBatch [ts, events, data_parallel_rank] (array_like, omit_defaults:
// a None rank is left out); the events are msgspec structs tagged by
// "type" and encoded as maps with omit_defaults. BlockStored declares
// block_hashes, parent_block_hash, token_ids (int | str), block_size,
// lora_id, medium and lora_name without defaults (always written, medium
// "GPU", lora_name None), then extra_keys, group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window, locality and mm_keys (written only when
// set); mm_keys is aligned with block_hashes, one list per block of
// MultimodalKey structs tagged "mm_key" with hash (hex), start_offset and
// an optional uuid. BlockRemoved is block_hashes, medium, then group_idx
// and locality when set. Block hashes are 64-bit integers.
//
// What the simulator chooses where the source leaves it open: a
// multimodal position is announced as the string "<mm:HASH>" in
// token_ids (the source types token ids as int | str), HASH being the hex
// digest its mm_keys entry names; local blocks leave locality None.

// ErrNotTRTLLM is returned by EncodeTRTLLMBatch for events TensorRT-LLM's
// classes cannot carry.
var ErrNotTRTLLM = errors.New("simengine: not expressible in TensorRT-LLM's events")

// mmPrefix and mmSuffix frame a multimodal placeholder token.
const mmPrefix, mmSuffix = "<mm:", ">"

// validateTRTLLM checks the TensorRT-LLM switches against the dialect.
func (sh Shape) validateTRTLLM() error {
	if sh.RemoteEvery < 0 || sh.MMEvery < 0 {
		return fmt.Errorf("%w: RemoteEvery %d, MMEvery %d: want >= 0", ErrInvalidConfig, sh.RemoteEvery, sh.MMEvery)
	}
	if (sh.RemoteEvery > 0 || sh.MMEvery > 0) && sh.Dialect != DialectTRTLLM {
		return fmt.Errorf("%w: remote locality and multimodal string tokens are TensorRT-LLM's; set the trtllm dialect", ErrInvalidConfig)
	}
	if sh.Dialect == DialectTRTLLM && len(sh.Groups) > 0 {
		return fmt.Errorf("%w: KV-cache groups are not emulated in the trtllm dialect", ErrInvalidConfig)
	}
	return nil
}

// requestMeta returns what the blocks of r, the engine's e.subs-th
// request, carry into later events; nil when the engine keeps no media.
func (e *Engine) requestMeta(r Request) *reqMeta {
	if e.media == nil {
		return nil
	}
	sh := &e.cfg.Shape
	return &reqMeta{
		lora: r.LoRAName, loraID: r.LoRAID, salt: r.CacheSalt,
		remote: sh.RemoteEvery > 0 && e.subs%int64(sh.RemoteEvery) == 0,
		mm:     sh.MMEvery > 0 && e.subs%int64(sh.MMEvery) == 0,
	}
}

// mmPosition returns the prompt position of a multimodal request's
// placeholder: the first token of its second block, or of its first.
func (e *Engine) mmPosition(s *seq) int {
	if bs := e.cfg.BlockSize; s.promptLen >= 2*bs {
		return bs
	}
	return 0
}

// appendStoredTRTLLM appends the BlockStored announcing blocks [first,
// full) of s in TensorRT-LLM's shape: no lora_name or extra keys (its
// events carry neither, nor a cache salt), locality REMOTE for a remote
// request, a placeholder string for a multimodal request's token.
func (e *Engine) appendStoredTRTLLM(dst []kvevents.Event, s *seq, first, full int) []kvevents.Event {
	bs := e.cfg.BlockSize
	ev := e.storedRun(s, first, full)
	if m := s.meta; m != nil {
		if m.remote {
			ev.Locality = kvevents.LocalityRemote
		}
		if p := e.mmPosition(s); m.mm && p >= first*bs && p < full*bs {
			i := p - first*bs
			ev.TokenIDs[i] = 0
			ev.StrTokens = []kvevents.StrToken{{Index: i, Value: fmt.Sprintf("%s%016x%s", mmPrefix, uint64(s.hashes[p/bs]), mmSuffix)}}
		}
	}
	return append(dst, ev)
}

// EncodeTRTLLMBatch encodes b as TensorRT-LLM's ZMQ publisher does (see
// the layout above). Events with fields its classes lack (a cache salt,
// bigram token_ids) or that the simulator does not write (extra_keys,
// raw-digest hashes) are refused with ErrNotTRTLLM; mm_keys are derived
// from the string tokens ("<mm:HASH>" names HASH, other strings
// themselves).
func EncodeTRTLLMBatch(b kvevents.Batch) ([]byte, error) {
	n := 2
	if b.DPRank != nil {
		n = 3
	}
	dst := mpenc.AppendArrayLen(nil, n)
	dst = mpenc.AppendFloat64(dst, b.TS)
	dst = mpenc.AppendArrayLen(dst, len(b.Events))
	for i, ev := range b.Events {
		var err error
		if dst, err = trtllmEvent(dst, ev); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.DPRank != nil {
		dst = mpenc.AppendInt(dst, int64(*b.DPRank))
	}
	return dst, nil
}

func trtllmEvent(dst []byte, ev kvevents.Event) ([]byte, error) {
	switch e := ev.(type) {
	case *kvevents.BlockStored:
		return trtllmStored(dst, e)
	case *kvevents.BlockRemoved:
		n := 3
		if e.GroupIdx != nil {
			n++
		}
		if e.Locality != "" {
			n++
		}
		dst = mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, n), "type"), kvevents.TypeBlockRemoved)
		var err error
		if dst, err = trtllmHashes(mpenc.AppendStr(dst, "block_hashes"), e.BlockHashes); err != nil {
			return nil, err
		}
		dst = mpenc.AppendOptStr(mpenc.AppendStr(dst, "medium"), e.Medium)
		if e.GroupIdx != nil {
			dst = mpenc.AppendInt(mpenc.AppendStr(dst, "group_idx"), int64(*e.GroupIdx))
		}
		if e.Locality != "" {
			dst = mpenc.AppendStr(mpenc.AppendStr(dst, "locality"), e.Locality)
		}
		return dst, nil
	case *kvevents.AllBlocksCleared:
		return mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, 1), "type"), kvevents.TypeAllBlocksCleared), nil
	}
	return nil, fmt.Errorf("%w: event %T", ErrNotTRTLLM, ev)
}

func trtllmStored(dst []byte, e *kvevents.BlockStored) ([]byte, error) {
	switch {
	case e.CacheSalt != "" || e.Bigram:
		return nil, fmt.Errorf("%w: BlockStored with a cache salt or bigram token_ids", ErrNotTRTLLM)
	case e.ExtraKeys != nil:
		return nil, fmt.Errorf("%w: BlockStored with extra_keys (not emulated)", ErrNotTRTLLM)
	case e.BlockSize < 1 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize && len(e.StrTokens) > 0:
		return nil, fmt.Errorf("%w: string tokens need token_ids of len(block_hashes) × block_size", ErrNotTRTLLM)
	}
	n := 8 // type and the seven fields without defaults
	opt := []bool{e.GroupIdx != nil, e.SpecKind != "", e.SlidingWindow != nil, e.Locality != "", len(e.StrTokens) > 0}
	for _, set := range opt {
		if set {
			n++
		}
	}
	dst = mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, n), "type"), kvevents.TypeBlockStored)
	var err error
	if dst, err = trtllmHashes(mpenc.AppendStr(dst, "block_hashes"), e.BlockHashes); err != nil {
		return nil, err
	}
	dst = mpenc.AppendStr(dst, "parent_block_hash")
	if e.Parent == nil {
		dst = mpenc.AppendNil(dst)
	} else {
		if e.Parent.IsBytes() {
			return nil, fmt.Errorf("%w: raw-digest parent hash", ErrNotTRTLLM)
		}
		dst = mpenc.AppendUint(dst, e.Parent.Key())
	}
	for i, st := range e.StrTokens {
		if st.Index < 0 || st.Index >= len(e.TokenIDs) || (i > 0 && st.Index <= e.StrTokens[i-1].Index) {
			return nil, fmt.Errorf("%w: string token at %d, beyond or out of order in token_ids", ErrNotTRTLLM, st.Index)
		}
	}
	dst = kvevents.AppendTokenIDs(mpenc.AppendStr(dst, "token_ids"), e)
	dst = mpenc.AppendInt(mpenc.AppendStr(dst, "block_size"), int64(e.BlockSize))
	dst = mpenc.AppendStr(dst, "lora_id")
	if e.LoRAID == nil {
		dst = mpenc.AppendNil(dst)
	} else {
		dst = mpenc.AppendInt(dst, *e.LoRAID)
	}
	dst = mpenc.AppendOptStr(mpenc.AppendStr(dst, "medium"), e.Medium)
	dst = mpenc.AppendOptStr(mpenc.AppendStr(dst, "lora_name"), e.LoRAName)
	if e.GroupIdx != nil {
		dst = mpenc.AppendInt(mpenc.AppendStr(dst, "group_idx"), int64(*e.GroupIdx))
	}
	if e.SpecKind != "" {
		dst = mpenc.AppendStr(mpenc.AppendStr(dst, "kv_cache_spec_kind"), e.SpecKind)
	}
	if e.SlidingWindow != nil {
		dst = mpenc.AppendInt(mpenc.AppendStr(dst, "kv_cache_spec_sliding_window"), int64(*e.SlidingWindow))
	}
	if e.Locality != "" {
		dst = mpenc.AppendStr(mpenc.AppendStr(dst, "locality"), e.Locality)
	}
	if len(e.StrTokens) > 0 {
		dst = trtllmMMKeys(mpenc.AppendStr(dst, "mm_keys"), e)
	}
	return dst, nil
}

// trtllmMMKeys writes mm_keys: per block, a MultimodalKey for each string
// token in it.
func trtllmMMKeys(dst []byte, e *kvevents.BlockStored) []byte {
	dst = mpenc.AppendArrayLen(dst, len(e.BlockHashes))
	strs := e.StrTokens
	for j := range e.BlockHashes {
		k := 0
		for k < len(strs) && strs[k].Index < (j+1)*e.BlockSize {
			k++
		}
		dst = mpenc.AppendArrayLen(dst, k)
		for _, st := range strs[:k] {
			hash := strings.TrimSuffix(strings.TrimPrefix(st.Value, mmPrefix), mmSuffix)
			dst = mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, 3), "type"), "mm_key")
			dst = mpenc.AppendStr(mpenc.AppendStr(dst, "hash"), hash)
			dst = mpenc.AppendInt(mpenc.AppendStr(dst, "start_offset"), int64(st.Index-j*e.BlockSize))
		}
		strs = strs[k:]
	}
	return dst
}

func trtllmHashes(dst []byte, hs []kvevents.Hash) ([]byte, error) {
	dst = mpenc.AppendArrayLen(dst, len(hs))
	for _, h := range hs {
		if h.IsBytes() {
			return nil, fmt.Errorf("%w: raw-digest block hash", ErrNotTRTLLM)
		}
		dst = mpenc.AppendUint(dst, h.Key())
	}
	return dst, nil
}
