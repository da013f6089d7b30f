package kvevents

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"github.com/kvdir/kvdir/internal/mpenc"
	"github.com/vmihailenco/msgpack/v5"
)

// The encoder must reproduce msgspec's bytes for the v0.26 capture exactly.
func TestEncodeMatchesV026Capture(t *testing.T) {
	got := EncodeBatch(v026Batch(), FormMap)
	if want := v026Bytes(); !bytes.Equal(got, want) {
		t.Fatalf("FormMap encoding differs:\ngot  %x\nwant %x", got, want)
	}
}

func TestEncodeArrayFormHandwritten(t *testing.T) {
	b := Batch{
		TS: 1.5,
		Events: []Event{&BlockStored{
			BlockHashes: []Hash{HashFromUint64(math.MaxUint64), HashFromUint64(5)},
			Parent:      ptr(HashFromUint64(7)),
			TokenIDs:    []uint32{1, 200, 300, 70000},
			BlockSize:   2,
			Medium:      "GPU",
		}},
		DPRank: ptr(3),
	}
	want := hx(t, "93 cb3ff8000000000000 91 98 ab426c6f636b53746f726564 92cfffffffffffffffff05 07"+
		"9401ccc8cd012cce00011170 02 c0 a3475055 c0 03")
	if got := EncodeBatch(b, FormArray); !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
}

func TestEncodeOmitsDefaults(t *testing.T) {
	ev := &BlockStored{BlockHashes: []Hash{HashFromUint64(1)}, TokenIDs: []uint32{9}, BlockSize: 1, GroupIdx: ptr(2)}
	b := Batch{TS: 0, Events: []Event{ev}}
	// Array: the trailing group_idx forces extra_keys (nil) to be written;
	// kind and window are trailing defaults and left out.
	want := cat(mArr(2), mF64(0), mArr(1),
		cat(mArr(10), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(9), mU(1), mNil(), mNil(), mNil(), mNil(), mU(2)))
	if got := EncodeBatch(b, FormArray); !bytes.Equal(got, want) {
		t.Fatalf("array:\ngot  %x\nwant %x", got, want)
	}
	// Map: every default-valued optional field is left out; required ones stay.
	want = cat(mArr(2), mF64(0), mArr(1),
		mMap(9), mStr("type"), mStr("BlockStored"), mStr("block_hashes"), cat(mArr(1), mU(1)),
		mStr("parent_block_hash"), mNil(), mStr("token_ids"), mTokens(9), mStr("block_size"), mU(1),
		mStr("lora_id"), mNil(), mStr("medium"), mNil(), mStr("lora_name"), mNil(), mStr("group_idx"), mU(2))
	if got := EncodeBatch(b, FormMap); !bytes.Equal(got, want) {
		t.Fatalf("map:\ngot  %x\nwant %x", got, want)
	}
	// Removed / cleared, and the map-batch form.
	b = Batch{TS: 2, Events: []Event{
		&BlockRemoved{BlockHashes: []Hash{HashFromInt64(-1)}, Medium: "GPU"},
		&BlockRemoved{GroupIdx: ptr(0)},
		&AllBlocksCleared{},
		(*BlockStored)(nil), // nil events are left out
		nil,
	}, DPRank: ptr(1)}
	want = cat(mArr(3), mF64(2), mArr(3),
		cat(mArr(3), mStr("BlockRemoved"), cat(mArr(1), mU(math.MaxUint64)), mStr("GPU")),
		cat(mArr(4), mStr("BlockRemoved"), mArr(0), mNil(), mU(0)),
		cat(mArr(1), mStr("AllBlocksCleared")),
		mU(1))
	if got := EncodeBatch(b, FormArray); !bytes.Equal(got, want) {
		t.Fatalf("removed array:\ngot  %x\nwant %x", got, want)
	}
	want = cat(mMap(3), mStr("ts"), mF64(2), mStr("events"), mArr(3),
		cat(mMap(3), mStr("type"), mStr("BlockRemoved"), mStr("block_hashes"), cat(mArr(1), mU(math.MaxUint64)), mStr("medium"), mStr("GPU")),
		cat(mMap(4), mStr("type"), mStr("BlockRemoved"), mStr("block_hashes"), mArr(0), mStr("medium"), mNil(), mStr("group_idx"), mU(0)),
		cat(mMap(1), mStr("type"), mStr("AllBlocksCleared")),
		mStr("data_parallel_rank"), mU(1))
	if got := EncodeBatch(b, FormMapBatch); !bytes.Equal(got, want) {
		t.Fatalf("map batch:\ngot  %x\nwant %x", got, want)
	}
}

func TestEncodeSmallestInts(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64} {
		if got, want := mpenc.AppendInt(nil, v), mI(v); !bytes.Equal(got, want) {
			t.Errorf("appendInt(%d) = %x, want %x", v, got, want)
		}
	}
	if got := mpenc.AppendUint(nil, math.MaxUint64); !bytes.Equal(got, mU(math.MaxUint64)) {
		t.Errorf("appendUint(max) = %x", got)
	}
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		s := string(make([]byte, n))
		if got := mpenc.AppendStr(nil, s); !bytes.Equal(got, mStr(s)) {
			t.Errorf("appendStr(len %d) header %x", n, got[:3])
		}
	}
}

func sampleBatches() []Batch {
	sha := bytes.Repeat([]byte{0x5a}, 32)
	return []Batch{
		{TS: 0},
		v026Batch(),
		{TS: 1.25, DPRank: ptr(-1), Events: []Event{
			&BlockStored{
				BlockHashes:   []Hash{HashFromBytes(sha), HashFromInt64(-7), HashFromUint64(1 << 63)},
				Parent:        ptr(HashFromBytes(sha[:16])),
				TokenIDs:      u32s(seqTokens(6, math.MaxUint32-5)),
				BlockSize:     2,
				LoRAID:        ptr(int64(math.MinInt64)),
				Medium:        "CPU",
				LoRAName:      "adapter",
				ExtraKeys:     [][]any{{"lora", []any{"mm", int64(-3)}}, nil, {}},
				SpecKind:      "full_attention",
				SlidingWindow: ptr(512),
			},
			&BlockRemoved{BlockHashes: []Hash{HashFromBytes(sha)}, Medium: "GPU", GroupIdx: ptr(3)},
			&AllBlocksCleared{},
			&BlockStored{BlockSize: 16, GroupIdx: ptr(1), SpecKind: "mamba", BlockHashes: []Hash{HashFromUint64(2)}},
			&BlockStored{BlockSize: 4, ExtraKeys: [][]any{}, TokenIDs: nil, BlockHashes: nil,
				Parent: ptr(HashFromUint64(0))},
			&BlockStored{BlockSize: 1, BlockHashes: []Hash{HashFromUint64(3)}, TokenIDs: []uint32{0},
				ExtraKeys: [][]any{{true, false, nil, 1.5, uint64(math.MaxUint64), []byte{}, map[string]any{"a": int64(1), "b": "c"}}}},
		}},
	}
}

func TestRoundTripAllForms(t *testing.T) {
	for i, b := range sampleBatches() {
		for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
			data := EncodeBatch(b, form)
			got, st, err := DecodeBatch(data)
			if err != nil {
				t.Fatalf("batch %d %v: %v", i, form, err)
			}
			if len(st.Problems) != 0 || st.Unknown != 0 {
				t.Fatalf("batch %d %v: stats %+v", i, form, st)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("batch %d %v round trip:\ngot  %#v\nwant %#v", i, form, got, b)
			}
		}
	}
}

// Cross-check with an independent msgpack implementation: our output is
// valid msgpack with the expected structure, and a batch written by
// vmihailenco (which uses non-minimal int64 forms) decodes.
func TestCrossCheckVmihailenco(t *testing.T) {
	var v any
	if err := msgpack.Unmarshal(EncodeBatch(v026Batch(), FormMap), &v); err != nil {
		t.Fatalf("vmihailenco cannot read our map form: %v", err)
	}
	outer := v.([]any)
	ev := outer[1].([]any)[0].(map[string]any)
	if ev["type"] != "BlockStored" || ev["medium"] != "GPU" || ev["kv_cache_spec_kind"] != "full_attention" ||
		ev["block_hashes"].([]any)[0] != uint64(15760518052499183552) || len(ev["token_ids"].([]any)) != 16 {
		t.Fatalf("vmihailenco sees %#v", ev)
	}
	for _, b := range sampleBatches() {
		v = nil
		if err := msgpack.Unmarshal(EncodeBatch(b, FormArray), &v); err != nil {
			t.Fatalf("vmihailenco cannot read our array form: %v", err)
		}
	}

	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	err := enc.Encode([]any{
		float64(3),
		[]any{
			[]any{"BlockStored", []any{int64(-2), uint64(1 << 63)}, int64(5), []any{int64(1), int64(2), int64(3), int64(4)}, int64(2), nil, "GPU", nil},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(9)}, "medium": nil, "group_idx": int64(4)},
		},
		int64(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	got, st, err := DecodeBatch(buf.Bytes())
	if err != nil || st.Events != 2 {
		t.Fatalf("decode vmihailenco output: %v %+v", err, st)
	}
	want := Batch{TS: 3, DPRank: ptr(0), Events: []Event{
		&BlockStored{BlockHashes: []Hash{HashFromInt64(-2), HashFromUint64(1 << 63)}, Parent: ptr(HashFromUint64(5)),
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		&BlockRemoved{BlockHashes: []Hash{HashFromUint64(9)}, GroupIdx: ptr(4)},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v", got)
	}
}

// ExtraKeys items of other Go types are normalised; unsupported or cyclic
// values are written as nil rather than panicking.
func TestEncodeNormalisesExtraKeys(t *testing.T) {
	cyclic := make([]any, 2)
	cyclic[0], cyclic[1] = "x", cyclic // truly self-referential
	ev := &BlockStored{BlockHashes: []Hash{HashFromUint64(1)}, TokenIDs: []uint32{1}, BlockSize: 1,
		ExtraKeys: [][]any{{int(-1), int8(2), int16(-300), int32(4), uint(5), uint8(6), uint16(7), uint32(8),
			float32(0.5), []string{"a"}, struct{}{}, cyclic, map[string]any{"z": nil, "a": []byte{1}}}}}
	for _, form := range []Form{FormArray, FormMap, FormMapBatch} {
		got, st, err := DecodeBatch(EncodeBatch(Batch{Events: []Event{ev}}, form))
		if err != nil || st.Events != 1 {
			t.Fatalf("%v: %v %+v", form, err, st)
		}
		keys := got.Events[0].(*BlockStored).ExtraKeys[0]
		want := []any{int64(-1), int64(2), int64(-300), int64(4), int64(5), int64(6), int64(7), int64(8),
			0.5, []any{"a"}, nil}
		if !reflect.DeepEqual(keys[:11], want) {
			t.Fatalf("%v: %#v", form, keys)
		}
		if got.Events[0].EventType() != TypeBlockStored || form.String() == "unknown" {
			t.Fatal("names")
		}
	}
	if Form(9).String() != "unknown" || (&BlockRemoved{}).EventType() != TypeBlockRemoved ||
		(&AllBlocksCleared{}).EventType() != TypeAllBlocksCleared || ReplayLayoutNew.String() != "new" {
		t.Fatal("names")
	}
}
