package kvevents

import (
	"slices"

	"github.com/kvdir/kvdir/internal/mpenc"
)

// Form selects the msgpack layout EncodeBatch produces.
type Form int

const (
	// FormArray encodes events as tagged arrays inside an outer array,
	// as vLLM did up to v0.25 (array_like=True, omit_defaults=True).
	FormArray Form = iota
	// FormMap encodes events as maps inside an outer array, as observed
	// from vLLM v0.26.
	FormMap
	// FormMapBatch encodes the batch itself as a map too, which is what
	// vLLM's source at 0181ea31 (EventBatch without array_like) implies.
	FormMapBatch
)

// String names the form.
func (f Form) String() string {
	switch f {
	case FormArray:
		return "array"
	case FormMap:
		return "map"
	case FormMapBatch:
		return "map-batch"
	}
	return "unknown"
}

// EncodeBatch encodes b the way msgspec encodes vLLM's KVEventBatch.
//
// Integers use their smallest msgpack form, floats are float64, None is nil,
// map keys follow declaration order with "type" first. Fields whose value is
// the declared default (None) are omitted as msgspec's omit_defaults does: in
// array form only trailing ones, in map form any optional one. Fields without
// a default (lora_id, medium, lora_name, parent_block_hash) are always
// written. Nil events are left out. ExtraKeys items of a type the decoder
// would not produce (see BlockStored) are encoded as nil.
//
// The fields of other engines are written where the decoder reads them:
// Locality after kv_cache_spec_sliding_window (TensorRT-LLM's order);
// Bigram token_ids as pairs and StrTokens as strings in token_ids; a
// CacheSalt as a top-level "cache_salt" key in map form and, in array form,
// as SGLang's metadata map {"cache_salt": ...} in lora_name's position (with
// a "lora_name" key added when the event has one too, which no engine
// sends: it keeps every decoded event encodable).
func EncodeBatch(b Batch, form Form) []byte {
	return AppendBatch(nil, b, form)
}

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b Batch, form Form) []byte {
	events := 0
	for _, ev := range b.Events {
		if !isNilEvent(ev) {
			events++
		}
	}
	fields := 2
	if b.DPRank != nil {
		fields = 3
	}
	if form == FormMapBatch {
		dst = mpenc.AppendMapLen(dst, fields)
		dst = mpenc.AppendStr(dst, "ts")
	} else {
		dst = mpenc.AppendArrayLen(dst, fields)
	}
	dst = mpenc.AppendFloat64(dst, b.TS)
	if form == FormMapBatch {
		dst = mpenc.AppendStr(dst, "events")
	}
	dst = mpenc.AppendArrayLen(dst, events)
	for _, ev := range b.Events {
		if isNilEvent(ev) {
			continue
		}
		dst = appendEvent(dst, ev, form != FormArray)
	}
	if b.DPRank != nil {
		if form == FormMapBatch {
			dst = mpenc.AppendStr(dst, "data_parallel_rank")
		}
		dst = mpenc.AppendInt(dst, int64(*b.DPRank))
	}
	return dst
}

func isNilEvent(ev Event) bool {
	switch e := ev.(type) {
	case *BlockStored:
		return e == nil
	case *BlockRemoved:
		return e == nil
	case *AllBlocksCleared:
		return e == nil
	}
	return true
}

func appendEvent(dst []byte, ev Event, asMap bool) []byte {
	switch e := ev.(type) {
	case *BlockStored:
		return appendStored(dst, e, asMap)
	case *BlockRemoved:
		return appendRemoved(dst, e, asMap)
	default:
		if asMap {
			dst = mpenc.AppendMapLen(dst, 1)
			dst = mpenc.AppendStr(dst, "type")
		} else {
			dst = mpenc.AppendArrayLen(dst, 1)
		}
		return mpenc.AppendStr(dst, TypeAllBlocksCleared)
	}
}

func appendStored(dst []byte, e *BlockStored, asMap bool) []byte {
	// Optional fields 8..12 (extra_keys, group_idx, kind, window, locality).
	opt := [5]bool{e.ExtraKeys != nil, e.GroupIdx != nil, e.SpecKind != "", e.SlidingWindow != nil, e.Locality != ""}
	n := 7
	if asMap {
		if e.CacheSalt != "" {
			n++
		}
		for _, set := range opt {
			if set {
				n++
			}
		}
		dst = mpenc.AppendMapLen(dst, n+1)
		dst = mpenc.AppendStr(dst, "type")
	} else {
		for i, set := range opt {
			if set {
				n = 8 + i
			}
		}
		dst = mpenc.AppendArrayLen(dst, n+1)
	}
	dst = mpenc.AppendStr(dst, TypeBlockStored)
	key := func(k string) {
		if asMap {
			dst = mpenc.AppendStr(dst, k)
		}
	}
	key("block_hashes")
	dst = appendHashes(dst, e.BlockHashes)
	key("parent_block_hash")
	if e.Parent == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = appendHash(dst, *e.Parent)
	}
	key("token_ids")
	dst = AppendTokenIDs(dst, e)
	key("block_size")
	dst = mpenc.AppendInt(dst, int64(e.BlockSize))
	key("lora_id")
	if e.LoRAID == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = mpenc.AppendInt(dst, *e.LoRAID)
	}
	key("medium")
	dst = mpenc.AppendOptStr(dst, e.Medium)
	switch {
	case asMap:
		key("lora_name")
		dst = mpenc.AppendOptStr(dst, e.LoRAName)
		if e.CacheSalt != "" {
			key("cache_salt")
			dst = mpenc.AppendStr(dst, e.CacheSalt)
		}
	case e.CacheSalt != "":
		// SGLang's BlockStoredWithMetadata; lora_name joins the map, a
		// kvdir extension, when both are set.
		if e.LoRAName == "" {
			dst = mpenc.AppendMapLen(dst, 1)
		} else {
			dst = mpenc.AppendMapLen(dst, 2)
			dst = mpenc.AppendStr(dst, "lora_name")
			dst = mpenc.AppendStr(dst, e.LoRAName)
		}
		dst = mpenc.AppendStr(dst, "cache_salt")
		dst = mpenc.AppendStr(dst, e.CacheSalt)
	default:
		dst = mpenc.AppendOptStr(dst, e.LoRAName)
	}
	for i := range opt {
		if asMap && !opt[i] || !asMap && 8+i > n {
			continue
		}
		switch i {
		case 0:
			key("extra_keys")
			if e.ExtraKeys == nil {
				dst = append(dst, 0xc0)
				continue
			}
			dst = mpenc.AppendArrayLen(dst, len(e.ExtraKeys))
			for _, k := range e.ExtraKeys {
				if k == nil {
					dst = append(dst, 0xc0)
				} else {
					dst = appendAny(dst, k, 0)
				}
			}
		case 1:
			key("group_idx")
			dst = appendOptInt(dst, e.GroupIdx)
		case 2:
			key("kv_cache_spec_kind")
			dst = mpenc.AppendOptStr(dst, e.SpecKind)
		case 3:
			key("kv_cache_spec_sliding_window")
			dst = appendOptInt(dst, e.SlidingWindow)
		case 4:
			key("locality")
			dst = mpenc.AppendOptStr(dst, e.Locality)
		}
	}
	return dst
}

// AppendTokenIDs writes e's token_ids as engines put them on the wire:
// bigram pairs when e.Bigram, otherwise the integer ids with e.StrTokens
// (in index order) written as strings at their index.
func AppendTokenIDs(dst []byte, e *BlockStored) []byte {
	dst = mpenc.AppendArrayLen(dst, len(e.TokenIDs))
	if e.Bigram {
		for i, t := range e.TokenIDs {
			next := e.BigramNext
			if i+1 < len(e.TokenIDs) {
				next = e.TokenIDs[i+1]
			}
			dst = mpenc.AppendArrayLen(dst, 2)
			dst = mpenc.AppendUint(dst, uint64(t))
			dst = mpenc.AppendUint(dst, uint64(next))
		}
		return dst
	}
	strs := e.StrTokens
	for i, t := range e.TokenIDs {
		if len(strs) > 0 && strs[0].Index == i {
			dst = mpenc.AppendStr(dst, strs[0].Value)
			strs = strs[1:]
			continue
		}
		dst = mpenc.AppendUint(dst, uint64(t))
	}
	return dst
}

func appendRemoved(dst []byte, e *BlockRemoved, asMap bool) []byte {
	n := 2
	if e.GroupIdx != nil {
		n = 3
	}
	if e.Locality != "" {
		n = 4
		if asMap && e.GroupIdx == nil {
			n = 3
		}
	}
	if asMap {
		dst = mpenc.AppendMapLen(dst, n+1)
		dst = mpenc.AppendStr(dst, "type")
	} else {
		dst = mpenc.AppendArrayLen(dst, n+1)
	}
	dst = mpenc.AppendStr(dst, TypeBlockRemoved)
	if asMap {
		dst = mpenc.AppendStr(dst, "block_hashes")
	}
	dst = appendHashes(dst, e.BlockHashes)
	if asMap {
		dst = mpenc.AppendStr(dst, "medium")
	}
	dst = mpenc.AppendOptStr(dst, e.Medium)
	if e.GroupIdx != nil || e.Locality != "" && !asMap {
		if asMap {
			dst = mpenc.AppendStr(dst, "group_idx")
		}
		dst = appendOptInt(dst, e.GroupIdx)
	}
	if e.Locality != "" {
		if asMap {
			dst = mpenc.AppendStr(dst, "locality")
		}
		dst = mpenc.AppendStr(dst, e.Locality)
	}
	return dst
}

func appendHashes(dst []byte, hs []Hash) []byte {
	dst = mpenc.AppendArrayLen(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h)
	}
	return dst
}

func appendHash(dst []byte, h Hash) []byte {
	if h.raw != "" {
		return mpenc.AppendBin(dst, []byte(h.raw))
	}
	return mpenc.AppendUint(dst, h.u)
}

func appendOptInt(dst []byte, p *int) []byte {
	if p == nil {
		return append(dst, 0xc0)
	}
	return mpenc.AppendInt(dst, int64(*p))
}

// appendAny writes a generic extra_keys value at nesting depth (0 for the
// per-block list). Unsupported types, and containers nested so deep that the
// decoder would refuse them (see MaxAnyDepth), are written as nil.
func appendAny(dst []byte, v any, depth int) []byte {
	switch v.(type) {
	case []any, []string, map[string]any:
		// The decoder counts the per-block list as depth 1 and refuses
		// items deeper than MaxAnyDepth.
		if depth+2 > MaxAnyDepth {
			return append(dst, 0xc0)
		}
	}
	switch x := v.(type) {
	case nil:
		return append(dst, 0xc0)
	case bool:
		if x {
			return append(dst, 0xc3)
		}
		return append(dst, 0xc2)
	case int:
		return mpenc.AppendInt(dst, int64(x))
	case int8:
		return mpenc.AppendInt(dst, int64(x))
	case int16:
		return mpenc.AppendInt(dst, int64(x))
	case int32:
		return mpenc.AppendInt(dst, int64(x))
	case int64:
		return mpenc.AppendInt(dst, x)
	case uint:
		return mpenc.AppendUint(dst, uint64(x))
	case uint8:
		return mpenc.AppendUint(dst, uint64(x))
	case uint16:
		return mpenc.AppendUint(dst, uint64(x))
	case uint32:
		return mpenc.AppendUint(dst, uint64(x))
	case uint64:
		return mpenc.AppendUint(dst, x)
	case float32:
		return mpenc.AppendFloat64(dst, float64(x))
	case float64:
		return mpenc.AppendFloat64(dst, x)
	case string:
		return mpenc.AppendStr(dst, x)
	case []byte:
		return mpenc.AppendBin(dst, x)
	case []any:
		dst = mpenc.AppendArrayLen(dst, len(x))
		for _, it := range x {
			dst = appendAny(dst, it, depth+1)
		}
		return dst
	case []string:
		dst = mpenc.AppendArrayLen(dst, len(x))
		for _, it := range x {
			dst = mpenc.AppendStr(dst, it)
		}
		return dst
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = mpenc.AppendMapLen(dst, len(keys))
		for _, k := range keys {
			dst = mpenc.AppendStr(dst, k)
			dst = appendAny(dst, x[k], depth+1)
		}
		return dst
	}
	return append(dst, 0xc0)
}
