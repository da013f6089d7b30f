package kvevents

import (
	"encoding/binary"
	"math"
	"slices"
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
		dst = appendMapLen(dst, fields)
		dst = appendStr(dst, "ts")
	} else {
		dst = appendArrayLen(dst, fields)
	}
	dst = appendFloat64(dst, b.TS)
	if form == FormMapBatch {
		dst = appendStr(dst, "events")
	}
	dst = appendArrayLen(dst, events)
	for _, ev := range b.Events {
		if isNilEvent(ev) {
			continue
		}
		dst = appendEvent(dst, ev, form != FormArray)
	}
	if b.DPRank != nil {
		if form == FormMapBatch {
			dst = appendStr(dst, "data_parallel_rank")
		}
		dst = appendInt(dst, int64(*b.DPRank))
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
			dst = appendMapLen(dst, 1)
			dst = appendStr(dst, "type")
		} else {
			dst = appendArrayLen(dst, 1)
		}
		return appendStr(dst, TypeAllBlocksCleared)
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
		dst = appendMapLen(dst, n+1)
		dst = appendStr(dst, "type")
	} else {
		for i, set := range opt {
			if set {
				n = 8 + i
			}
		}
		dst = appendArrayLen(dst, n+1)
	}
	dst = appendStr(dst, TypeBlockStored)
	key := func(k string) {
		if asMap {
			dst = appendStr(dst, k)
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
	dst = appendTokens(dst, e)
	key("block_size")
	dst = appendInt(dst, int64(e.BlockSize))
	key("lora_id")
	if e.LoRAID == nil {
		dst = append(dst, 0xc0)
	} else {
		dst = appendInt(dst, *e.LoRAID)
	}
	key("medium")
	dst = appendOptStr(dst, e.Medium)
	switch {
	case asMap:
		key("lora_name")
		dst = appendOptStr(dst, e.LoRAName)
		if e.CacheSalt != "" {
			key("cache_salt")
			dst = appendStr(dst, e.CacheSalt)
		}
	case e.CacheSalt != "":
		// SGLang's BlockStoredWithMetadata; lora_name joins the map, a
		// kvdir extension, when both are set.
		if e.LoRAName == "" {
			dst = appendMapLen(dst, 1)
		} else {
			dst = appendMapLen(dst, 2)
			dst = appendStr(dst, "lora_name")
			dst = appendStr(dst, e.LoRAName)
		}
		dst = appendStr(dst, "cache_salt")
		dst = appendStr(dst, e.CacheSalt)
	default:
		dst = appendOptStr(dst, e.LoRAName)
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
			dst = appendArrayLen(dst, len(e.ExtraKeys))
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
			dst = appendOptStr(dst, e.SpecKind)
		case 3:
			key("kv_cache_spec_sliding_window")
			dst = appendOptInt(dst, e.SlidingWindow)
		case 4:
			key("locality")
			dst = appendOptStr(dst, e.Locality)
		}
	}
	return dst
}

// appendTokens writes token_ids: bigram pairs when e.Bigram, otherwise the
// integer ids with e.StrTokens written as strings at their index.
func appendTokens(dst []byte, e *BlockStored) []byte {
	dst = appendArrayLen(dst, len(e.TokenIDs))
	if e.Bigram {
		for i, t := range e.TokenIDs {
			next := e.BigramNext
			if i+1 < len(e.TokenIDs) {
				next = e.TokenIDs[i+1]
			}
			dst = appendArrayLen(dst, 2)
			dst = appendUint(dst, uint64(t))
			dst = appendUint(dst, uint64(next))
		}
		return dst
	}
	strs := e.StrTokens
	for i, t := range e.TokenIDs {
		if len(strs) > 0 && strs[0].Index == i {
			dst = appendStr(dst, strs[0].Value)
			strs = strs[1:]
			continue
		}
		dst = appendUint(dst, uint64(t))
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
		dst = appendMapLen(dst, n+1)
		dst = appendStr(dst, "type")
	} else {
		dst = appendArrayLen(dst, n+1)
	}
	dst = appendStr(dst, TypeBlockRemoved)
	if asMap {
		dst = appendStr(dst, "block_hashes")
	}
	dst = appendHashes(dst, e.BlockHashes)
	if asMap {
		dst = appendStr(dst, "medium")
	}
	dst = appendOptStr(dst, e.Medium)
	if e.GroupIdx != nil || e.Locality != "" && !asMap {
		if asMap {
			dst = appendStr(dst, "group_idx")
		}
		dst = appendOptInt(dst, e.GroupIdx)
	}
	if e.Locality != "" {
		if asMap {
			dst = appendStr(dst, "locality")
		}
		dst = appendStr(dst, e.Locality)
	}
	return dst
}

func appendHashes(dst []byte, hs []Hash) []byte {
	dst = appendArrayLen(dst, len(hs))
	for _, h := range hs {
		dst = appendHash(dst, h)
	}
	return dst
}

func appendHash(dst []byte, h Hash) []byte {
	if h.raw != "" {
		return appendBin(dst, []byte(h.raw))
	}
	return appendUint(dst, h.u)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0xc0)
	}
	return appendStr(dst, s)
}

func appendOptInt(dst []byte, p *int) []byte {
	if p == nil {
		return append(dst, 0xc0)
	}
	return appendInt(dst, int64(*p))
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
	}
}

func appendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
	}
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, b []byte) []byte {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		dst = append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

// appendUint writes u in its smallest unsigned form, as msgspec does for a
// non-negative Python int.
func appendUint(dst []byte, u uint64) []byte {
	switch {
	case u <= 0x7f:
		return append(dst, byte(u))
	case u <= math.MaxUint8:
		return append(dst, 0xcc, byte(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(u))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), u)
	}
}

// appendInt writes v in its smallest form: unsigned for v >= 0, signed
// otherwise (msgspec's rule).
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(int8(v)))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(int32(v)))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
	}
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
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
		return appendInt(dst, int64(x))
	case int8:
		return appendInt(dst, int64(x))
	case int16:
		return appendInt(dst, int64(x))
	case int32:
		return appendInt(dst, int64(x))
	case int64:
		return appendInt(dst, x)
	case uint:
		return appendUint(dst, uint64(x))
	case uint8:
		return appendUint(dst, uint64(x))
	case uint16:
		return appendUint(dst, uint64(x))
	case uint32:
		return appendUint(dst, uint64(x))
	case uint64:
		return appendUint(dst, x)
	case float32:
		return appendFloat64(dst, float64(x))
	case float64:
		return appendFloat64(dst, x)
	case string:
		return appendStr(dst, x)
	case []byte:
		return appendBin(dst, x)
	case []any:
		dst = appendArrayLen(dst, len(x))
		for _, it := range x {
			dst = appendAny(dst, it, depth+1)
		}
		return dst
	case []string:
		dst = appendArrayLen(dst, len(x))
		for _, it := range x {
			dst = appendStr(dst, it)
		}
		return dst
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = appendMapLen(dst, len(keys))
		for _, k := range keys {
			dst = appendStr(dst, k)
			dst = appendAny(dst, x[k], depth+1)
		}
		return dst
	}
	return append(dst, 0xc0)
}
