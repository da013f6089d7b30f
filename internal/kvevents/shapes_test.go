package kvevents

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Wire fixtures of engine setups beyond vLLM's plain full-attention model,
// each built from the upstream class definitions (field order as declared):
//
//   - vLLM: vllm-project/vllm vllm/distributed/kv_events.py at 0181ea31
//     (BlockStored: block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//     kv_cache_spec_sliding_window; events as maps), kinds from
//     vllm/v1/kv_cache_interface.py (KVCacheSpecKind, newer than the
//     stored bc8282e6).
//   - SGLang: sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py
//     in the revision that defines StorageMedium and BlockStoredWithMetadata
//     (the search tool gave no commit for it; 612d5790 and 006d053f predate it)
//     (array_like, no omit_defaults: BlockStored is block_hashes,
//     parent_block_hash, token_ids, block_size, lora_id, medium, then the
//     kw_only metadata {"cache_salt": ...}); bigram token_ids as built by
//     KVCacheEventMixin._record_store_event (python/sglang/srt/mem_cache),
//     one pair (raw[j], raw[j+1]) per token of the page.
//   - TensorRT-LLM: NVIDIA/TensorRT-LLM
//     tensorrt_llm/_torch/pyexecutor/kv_cache_events.py at 13599e98 (events
//     as maps, token_ids list[int | str], then locality and mm_keys after
//     the vLLM fields).

// vllmHybridMLA is a vLLM map-form batch of a hybrid model whose group 0 is
// sliding-window attention and group 1 MLA (full attention).
func vllmHybridMLA() []byte {
	sw := cat(mMap(12), mStr("type"), mStr("BlockStored"),
		mStr("block_hashes"), cat(mArr(1), mU(0xa2)),
		mStr("parent_block_hash"), mNil(),
		mStr("token_ids"), mTokens(seqTokens(8, 10)...),
		mStr("block_size"), mU(4),
		mStr("lora_id"), mNil(),
		mStr("medium"), mStr("GPU"),
		mStr("lora_name"), mNil(),
		mStr("extra_keys"), mNil(),
		mStr("group_idx"), mU(0),
		mStr("kv_cache_spec_kind"), mStr(SpecKindSlidingWindow),
		mStr("kv_cache_spec_sliding_window"), mU(128))
	mla := cat(mMap(10), mStr("type"), mStr("BlockStored"),
		mStr("block_hashes"), cat(mArr(2), mU(0xa1), mU(0xa2)),
		mStr("parent_block_hash"), mNil(),
		mStr("token_ids"), mTokens(seqTokens(8, 10)...),
		mStr("block_size"), mU(4),
		mStr("lora_id"), mNil(),
		mStr("medium"), mStr("GPU"),
		mStr("lora_name"), mNil(),
		mStr("group_idx"), mU(1),
		mStr("kv_cache_spec_kind"), mStr(SpecKindMLAAttention))
	rm := cat(mMap(4), mStr("type"), mStr("BlockRemoved"),
		mStr("block_hashes"), cat(mArr(1), mU(0xa2)),
		mStr("medium"), mStr("GPU"), mStr("group_idx"), mU(1))
	return cat(mMap(3), mStr("ts"), mF64(1), mStr("events"), cat(mArr(3), sw, mla, rm),
		mStr("data_parallel_rank"), mU(0))
}

func TestDecodeVLLMHybridMLA(t *testing.T) {
	b, st := mustDecode(t, vllmHybridMLA())
	if st.Events != 3 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
	sw, mla := storedAt(t, b, 0), storedAt(t, b, 1)
	if sw.SpecKind != SpecKindSlidingWindow || *sw.GroupIdx != 0 || *sw.SlidingWindow != 128 || len(sw.BlockHashes) != 1 {
		t.Fatalf("sliding-window event %+v", sw)
	}
	if mla.SpecKind != SpecKindMLAAttention || *mla.GroupIdx != 1 || len(mla.TokenIDs) != 8 {
		t.Fatalf("MLA event %+v", mla)
	}
	if rm := b.Events[2].(*BlockRemoved); *rm.GroupIdx != 1 {
		t.Fatalf("removal %+v", rm)
	}
	for kind, want := range map[string]bool{
		SpecKindFullAttention: true, SpecKindMLAAttention: true, SpecKindSinkFullAttention: true,
		SpecKindSlidingWindow: false, SpecKindSlidingWindowMLA: false, SpecKindMamba: false,
		SpecKindChunkedLocal: false, SpecKindCrossAttention: false, SpecKindEncoderOnlyAttention: false,
		SpecKindUnknown: false, "": false,
	} {
		if IsFullAttentionKind(kind) != want {
			t.Errorf("IsFullAttentionKind(%q) = %v", kind, !want)
		}
	}
}

// sglangStored is an SGLang array-form BlockStored; meta, if not nil, is
// appended as BlockStoredWithMetadata's metadata.
func sglangStored(hash uint64, parent []byte, tokens []byte, bs uint64, medium string, meta []byte) []byte {
	n := 7
	if meta != nil {
		n = 8
	}
	ev := cat(mArr(n), mStr("BlockStored"), cat(mArr(1), mU(hash)), parent, tokens, mU(bs), mNil(), mStr(medium))
	if meta != nil {
		ev = cat(ev, meta)
	}
	return ev
}

// sglangBatch wraps events in SGLang's EventBatch [ts, events, attn_dp_rank].
func sglangBatch(evs ...[]byte) []byte {
	return cat(mArr(3), mF64(2), cat(mArr(len(evs)), cat(evs...)), mU(0))
}

// bigrams encodes tokens t as SGLang's pairs (t[j], t[j+1]) for all but the
// last token of t, which only closes the last pair.
func bigrams(t ...uint64) []byte {
	out := mArr(len(t) - 1)
	for j := 0; j+1 < len(t); j++ {
		out = cat(out, mArr(2), mU(t[j]), mU(t[j+1]))
	}
	return out
}

func TestDecodeSGLangBigrams(t *testing.T) {
	data := sglangBatch(
		sglangStored(7, mNil(), bigrams(1, 2, 3, 4, 5), 4, "GPU", nil),
		sglangStored(8, mU(7), bigrams(5, 6, 70000, 8, 9), 4, "GPU", nil),
	)
	b, st := mustDecode(t, data)
	if st.Events != 2 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
	s0, s1 := storedAt(t, b, 0), storedAt(t, b, 1)
	if !s0.Bigram || !reflect.DeepEqual(s0.TokenIDs, []uint32{1, 2, 3, 4}) || s0.BigramNext != 5 {
		t.Fatalf("first bigram event: %+v", s0)
	}
	if !s1.Bigram || !reflect.DeepEqual(s1.TokenIDs, []uint32{5, 6, 70000, 8}) || s1.BigramNext != 9 || s1.Parent.Key() != 7 {
		t.Fatalf("second bigram event: %+v", s1)
	}
	// The encoder writes the same pairs back (in vLLM's array layout,
	// with lora_name, which SGLang lacks).
	for _, form := range []Form{FormArray, FormMap} {
		if got, _ := mustDecode(t, EncodeBatch(b, form)); !reflect.DeepEqual(got, b) {
			t.Fatalf("%v round trip differs: %+v", form, got.Events[0])
		}
	}
}

func TestDecodeSGLangBadBigrams(t *testing.T) {
	good := sglangStored(1, mNil(), bigrams(1, 2, 3, 4, 5), 4, "GPU", nil)
	for _, tc := range []struct {
		name, want string
		tokens     []byte
	}{
		{"broken overlap", "item 2 starts with 9", cat(mArr(4), mArr(2), mU(1), mU(2), mArr(2), mU(2), mU(3), mArr(2), mU(9), mU(4), mArr(2), mU(4), mU(5))},
		{"triple", "exceeds limit 2", cat(mArr(4), mArr(3), mU(1), mU(2), mU(3), mArr(2), mU(2), mU(3), mArr(2), mU(3), mU(4), mArr(2), mU(4), mU(5))},
		{"int after pairs", "bigram item 1", cat(mArr(4), mArr(2), mU(1), mU(2), mU(2), mArr(2), mU(3), mU(4), mArr(2), mU(4), mU(5))},
		{"string in a pair", "bigram item 0", cat(mArr(4), mArr(2), mStr("x"), mU(2), mArr(2), mU(2), mU(3), mArr(2), mU(3), mU(4), mArr(2), mU(4), mU(5))},
		{"negative token", "out of uint32", cat(mArr(4), mArr(2), mU(1), mI(-2), mArr(2), mI(-2), mU(3), mArr(2), mU(3), mU(4), mArr(2), mU(4), mU(5))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, st := mustDecode(t, sglangBatch(good, sglangStored(2, mNil(), tc.tokens, 4, "GPU", nil)))
			if st.Events != 1 || len(b.Events) != 1 || st.Malformed != 1 || len(st.Problems) != 1 {
				t.Fatalf("stats %+v", st)
			}
			p := st.Problems[0]
			if !p.Skipped || p.Index != 1 || !errors.Is(p.Err, ErrMalformed) || !strings.Contains(p.String(), tc.want) {
				t.Fatalf("problem %s, want %q", p, tc.want)
			}
		})
	}
}

func TestDecodeSGLangCacheSalt(t *testing.T) {
	arr := sglangBatch(sglangStored(3, mNil(), mTokens(1, 2, 3, 4), 4, "CPU_PINNED", cat(mMap(1), mStr("cache_salt"), mStr("tenant-a"))))
	b, st := mustDecode(t, arr)
	s := storedAt(t, b, 0)
	if st.Malformed != 0 || s.CacheSalt != "tenant-a" || s.LoRAName != "" || s.Medium != "CPU_PINNED" {
		t.Fatalf("array layout: %+v, stats %+v", s, st)
	}
	if got := EncodeBatch(b, FormArray); !reflect.DeepEqual(got, arr) {
		t.Fatalf("re-encoded\n%x\nwant\n%x", got, arr)
	}
	// The map layout: a top-level cache_salt, or the metadata map.
	for _, salt := range [][]byte{
		cat(mStr("cache_salt"), mStr("tenant-b")),
		cat(mStr("metadata"), mMap(1), mStr("cache_salt"), mStr("tenant-b")),
	} {
		ev := cat(mMap(8), mStr("type"), mStr("BlockStored"),
			mStr("block_hashes"), cat(mArr(1), mU(3)), mStr("parent_block_hash"), mNil(),
			mStr("token_ids"), mTokens(1, 2, 3, 4), mStr("block_size"), mU(4),
			mStr("lora_id"), mNil(), mStr("medium"), mStr("GPU"), salt)
		b, st := mustDecode(t, cat(mArr(2), mF64(1), mArr(1), ev))
		if s := storedAt(t, b, 0); st.Malformed != 0 || s.CacheSalt != "tenant-b" {
			t.Fatalf("map layout: %+v, stats %+v", s, st)
		}
	}
	// The metadata map after a lora_name, in extra_keys' position.
	late := cat(mArr(2), mF64(1), mArr(1), cat(mArr(9), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1),
		mNil(), mNil(), mStr("ad"), cat(mMap(1), mStr("cache_salt"), mStr("tenant-c"))))
	b, st = mustDecode(t, late)
	if s := storedAt(t, b, 0); st.Malformed != 0 || s.CacheSalt != "tenant-c" || s.LoRAName != "ad" || s.ExtraKeys != nil {
		t.Fatalf("metadata in extra_keys: %+v, stats %+v", s, st)
	}
	// A salt and a LoRA name in the array form survive a round trip.
	both := Batch{TS: 1, Events: []Event{&BlockStored{BlockHashes: []Hash{HashFromUint64(1)}, TokenIDs: []uint32{1},
		BlockSize: 1, LoRAName: "ad", CacheSalt: "s"}}}
	for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
		got, _ := mustDecode(t, EncodeBatch(both, form))
		if !reflect.DeepEqual(got, both) {
			t.Fatalf("%v round trip: %+v", form, got.Events[0])
		}
	}
}

// trtllmStored is a TensorRT-LLM map-form BlockStored; omit_defaults leaves
// out fields that are None.
func trtllmStored(hashes []uint64, tokens []byte, locality string, mmKeys []byte) []byte {
	n := 8
	tail := []byte{}
	if locality != "" {
		n++
		tail = cat(tail, mStr("locality"), mStr(locality))
	}
	if mmKeys != nil {
		n++
		tail = cat(tail, mStr("mm_keys"), mmKeys)
	}
	hs := mArr(len(hashes))
	for _, h := range hashes {
		hs = cat(hs, mU(h))
	}
	return cat(mMap(n), mStr("type"), mStr("BlockStored"),
		mStr("block_hashes"), hs, mStr("parent_block_hash"), mNil(),
		mStr("token_ids"), tokens, mStr("block_size"), mU(4),
		mStr("lora_id"), mNil(), mStr("medium"), mStr("GPU"), mStr("lora_name"), mNil(), tail)
}

func TestDecodeTRTLLMStringTokensAndLocality(t *testing.T) {
	toks := cat(mArr(8), mU(1), mU(2), mU(3), mU(4), mU(5), mStr("<mm:9f2c>"), mU(7), mU(8))
	mm := cat(mArr(2), mArr(0), cat(mArr(1), mMap(3), mStr("type"), mStr("mm_key"), mStr("hash"), mStr("9f2c"), mStr("start_offset"), mU(1)))
	rm := cat(mMap(4), mStr("type"), mStr("BlockRemoved"), mStr("block_hashes"), cat(mArr(1), mU(31)),
		mStr("medium"), mStr("GPU"), mStr("locality"), mStr(LocalityRemote))
	data := cat(mArr(3), mF64(3), cat(mArr(3),
		trtllmStored([]uint64{21, 22}, toks, "LOCAL", mm),
		trtllmStored([]uint64{31}, mTokens(1, 2, 3, 4), LocalityRemote, nil), rm), mU(0))
	b, st := mustDecode(t, data)
	if st.Events != 3 || st.Malformed != 0 {
		t.Fatalf("stats %+v", st)
	}
	s := storedAt(t, b, 0)
	if !reflect.DeepEqual(s.StrTokens, []StrToken{{Index: 5, Value: "<mm:9f2c>"}}) || s.TokenIDs[5] != 0 || s.TokenIDs[6] != 7 || s.Locality != "LOCAL" {
		t.Fatalf("string tokens: %+v", s)
	}
	if s := storedAt(t, b, 1); s.Locality != LocalityRemote {
		t.Fatalf("remote store: %+v", s)
	}
	if rm := b.Events[2].(*BlockRemoved); rm.Locality != LocalityRemote {
		t.Fatalf("remote removal: %+v", rm)
	}
	for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
		got, _ := mustDecode(t, EncodeBatch(b, form))
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("%v round trip differs", form)
		}
	}
	// A string token beyond the bound is a clear error.
	long := trtllmStored([]uint64{1}, cat(mArr(4), mStr(strings.Repeat("x", MaxTokenStringLen+1)), mU(2), mU(3), mU(4)), "", nil)
	_, st = mustDecode(t, cat(mArr(2), mF64(1), mArr(1), long))
	if st.Malformed != 1 || !strings.Contains(st.Problems[0].String(), "string token") {
		t.Fatalf("long string token: %+v", st)
	}
}

func TestDecodeLocalityArrayPosition(t *testing.T) {
	// In the array layout locality is read only when it is a string or
	// nil: other items at that position (future fields) are skipped.
	base := cat(mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1), mNil(), mNil(), mNil(), mNil(), mNil(), mNil(), mNil())
	for _, tc := range []struct {
		item []byte
		want string
	}{{mStr("REMOTE"), "REMOTE"}, {mNil(), ""}, {mArr(0), ""}} {
		b, st := mustDecode(t, cat(mArr(2), mF64(1), mArr(1), mArr(13), base, tc.item))
		if s := storedAt(t, b, 0); st.Malformed != 0 || s.Locality != tc.want {
			t.Fatalf("locality item %x: %+v %+v", tc.item, s, st)
		}
	}
}

// shapeSeeds are fuzz seeds covering the decoder paths of this file.
func shapeSeeds() [][]byte {
	return [][]byte{
		vllmHybridMLA(),
		sglangBatch(sglangStored(7, mNil(), bigrams(1, 2, 3, 4, 5), 4, "GPU", nil)),
		sglangBatch(sglangStored(7, mNil(), cat(mArr(2), mArr(2), mU(1), mU(2), mArr(2), mU(3), mU(4)), 2, "GPU", nil)),
		sglangBatch(sglangStored(3, mNil(), mTokens(1, 2, 3, 4), 4, "CPU_PINNED", cat(mMap(1), mStr("cache_salt"), mStr("t")))),
		cat(mArr(2), mF64(3), mArr(1), trtllmStored([]uint64{21}, cat(mArr(4), mU(1), mStr("<mm>"), mU(3), mU(4)), "REMOTE", cat(mArr(1), mArr(0)))),
	}
}
