package simengine

import (
	"fmt"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/mpenc"
)

// EncodeSGLangBatch encodes b as SGLang's msgspec publisher does
// (python/sglang/srt/disaggregation/kv_events.py). The batch is always
// EventBatch's array [ts, events, attn_dp_rank] (array_like, no
// omit_defaults: a nil DPRank is written as nil). The events are, with
// kvevents.FormArray, the array_like layout without omit_defaults:
// BlockStored [tag, block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium], BlockStoredWithMetadata the same with the
// metadata map {"cache_salt": ...} appended, BlockRemoved [tag,
// block_hashes, medium]; with kvevents.FormMap the tagged maps of the
// revision that switched events to maps with omit_defaults (medium left
// out when None, the salt as a top-level "cache_salt" key). Hashes are
// written as signed 64-bit integers (SGLang's are Python ints made from
// an int64), token_ids as bigram pairs when Bigram is set.
//
// Events with fields SGLang's classes lack (lora_name, extra_keys,
// group_idx, spec kinds, locality, string tokens, raw-digest hashes) are
// refused with ErrNotSGLang, as is any other form.
func EncodeSGLangBatch(b kvevents.Batch, form kvevents.Form) ([]byte, error) {
	if form != kvevents.FormArray && form != kvevents.FormMap {
		return nil, fmt.Errorf("%w: form %v (want array or map)", ErrNotSGLang, form)
	}
	asMap := form == kvevents.FormMap
	dst := mpenc.AppendArrayLen(nil, 3)
	dst = mpenc.AppendFloat64(dst, b.TS)
	dst = mpenc.AppendArrayLen(dst, len(b.Events))
	for i, ev := range b.Events {
		var err error
		if dst, err = sglangEvent(dst, ev, asMap); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.DPRank == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = mpenc.AppendInt(dst, int64(*b.DPRank))
	}
	return dst, nil
}

func sglangEvent(dst []byte, ev kvevents.Event, asMap bool) ([]byte, error) {
	switch e := ev.(type) {
	case *kvevents.BlockStored:
		return sglangStored(dst, e, asMap)
	case *kvevents.BlockRemoved:
		if e.GroupIdx != nil || e.Locality != "" {
			return nil, fmt.Errorf("%w: BlockRemoved with group_idx or locality", ErrNotSGLang)
		}
		if asMap {
			n := 2
			if e.Medium != "" {
				n = 3
			}
			dst = mpenc.AppendStr(mpenc.AppendMapLen(dst, n), "type")
		} else {
			dst = mpenc.AppendArrayLen(dst, 3)
		}
		dst = mpenc.AppendStr(dst, kvevents.TypeBlockRemoved)
		dst = mpKey(dst, asMap, "block_hashes")
		var err error
		if dst, err = sglangHashes(dst, e.BlockHashes); err != nil {
			return nil, err
		}
		if !asMap || e.Medium != "" {
			dst = mpenc.AppendOptStr(mpKey(dst, asMap, "medium"), e.Medium)
		}
		return dst, nil
	case *kvevents.AllBlocksCleared:
		if asMap {
			return mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, 1), "type"), kvevents.TypeAllBlocksCleared), nil
		}
		return mpenc.AppendStr(mpenc.AppendArrayLen(dst, 1), kvevents.TypeAllBlocksCleared), nil
	}
	return nil, fmt.Errorf("%w: event %T", ErrNotSGLang, ev)
}

func sglangStored(dst []byte, e *kvevents.BlockStored, asMap bool) ([]byte, error) {
	switch {
	case e.LoRAName != "" || e.ExtraKeys != nil:
		return nil, fmt.Errorf("%w: BlockStored with lora_name or extra_keys", ErrNotSGLang)
	case e.GroupIdx != nil || e.SpecKind != "" || e.SlidingWindow != nil || e.Locality != "":
		return nil, fmt.Errorf("%w: BlockStored with group_idx, spec kind or locality", ErrNotSGLang)
	case len(e.StrTokens) > 0:
		return nil, fmt.Errorf("%w: BlockStored with string tokens", ErrNotSGLang)
	}
	if asMap {
		n := 6 // type, block_hashes, parent_block_hash, token_ids, block_size, lora_id
		if e.Medium != "" {
			n++
		}
		if e.CacheSalt != "" {
			n++
		}
		dst = mpenc.AppendStr(mpenc.AppendMapLen(dst, n), "type")
	} else {
		n := 7
		if e.CacheSalt != "" {
			n = 8
		}
		dst = mpenc.AppendArrayLen(dst, n)
	}
	dst = mpenc.AppendStr(dst, kvevents.TypeBlockStored)
	dst = mpKey(dst, asMap, "block_hashes")
	var err error
	if dst, err = sglangHashes(dst, e.BlockHashes); err != nil {
		return nil, err
	}
	dst = mpKey(dst, asMap, "parent_block_hash")
	if e.Parent == nil {
		dst = append(dst, 0xc0)
	} else {
		if e.Parent.IsBytes() {
			return nil, fmt.Errorf("%w: raw-digest parent hash", ErrNotSGLang)
		}
		dst = mpenc.AppendInt(dst, int64(e.Parent.Key()))
	}
	dst = mpKey(dst, asMap, "token_ids")
	dst = mpenc.AppendArrayLen(dst, len(e.TokenIDs))
	for i, t := range e.TokenIDs {
		if !e.Bigram {
			dst = mpenc.AppendUint(dst, uint64(t))
			continue
		}
		next := e.BigramNext
		if i+1 < len(e.TokenIDs) {
			next = e.TokenIDs[i+1]
		}
		dst = mpenc.AppendUint(mpenc.AppendUint(mpenc.AppendArrayLen(dst, 2), uint64(t)), uint64(next))
	}
	dst = mpenc.AppendInt(mpKey(dst, asMap, "block_size"), int64(e.BlockSize))
	dst = mpKey(dst, asMap, "lora_id")
	if e.LoRAID == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = mpenc.AppendInt(dst, *e.LoRAID)
	}
	if !asMap || e.Medium != "" {
		dst = mpenc.AppendOptStr(mpKey(dst, asMap, "medium"), e.Medium)
	}
	if e.CacheSalt != "" {
		if asMap {
			dst = mpenc.AppendStr(mpenc.AppendStr(dst, "cache_salt"), e.CacheSalt)
		} else {
			dst = mpenc.AppendStr(mpenc.AppendStr(mpenc.AppendMapLen(dst, 1), "cache_salt"), e.CacheSalt)
		}
	}
	return dst, nil
}

func sglangHashes(dst []byte, hs []kvevents.Hash) ([]byte, error) {
	dst = mpenc.AppendArrayLen(dst, len(hs))
	for _, h := range hs {
		if h.IsBytes() {
			return nil, fmt.Errorf("%w: raw-digest block hash", ErrNotSGLang)
		}
		dst = mpenc.AppendInt(dst, int64(h.Key()))
	}
	return dst, nil
}

// Minimal msgpack writers, each in the smallest form as msgspec and
// Python's msgpack write them.

func mpKey(dst []byte, asMap bool, k string) []byte {
	if asMap {
		return mpenc.AppendStr(dst, k)
	}
	return dst
}
