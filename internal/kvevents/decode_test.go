package kvevents

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.total = ms.TotalAlloc
}

func mustDecode(t *testing.T, data []byte) (Batch, Stats) {
	t.Helper()
	b, st, err := DecodeBatch(data)
	if err != nil {
		t.Fatalf("DecodeBatch: %v", err)
	}
	return b, st
}

func storedAt(t *testing.T, b Batch, i int) *BlockStored {
	t.Helper()
	if i >= len(b.Events) {
		t.Fatalf("batch has %d events, want index %d", len(b.Events), i)
	}
	ev, ok := b.Events[i].(*BlockStored)
	if !ok {
		t.Fatalf("event %d is %T, want *BlockStored", i, b.Events[i])
	}
	return ev
}

// A fully handwritten array-form batch (vLLM <= v0.25 layout):
// [1.5, [["BlockStored", [2^64-1 as uint64, -5], 7, [1, 200, 300, 70000],
// 2, nil, "GPU", nil]], 3]
func TestDecodeArrayFormHandwritten(t *testing.T) {
	data := hx(t, ""+
		"93"+ // outer array of 3
		"cb 3ff8000000000000"+ // ts 1.5
		"91"+ // events: 1
		"98"+ // event array of 8
		"ab 426c6f636b53746f726564"+ // "BlockStored"
		"92 cf ffffffffffffffff fb"+ // hashes [uint64 max, fixneg -5]
		"07"+ // parent 7
		"94 01 cc c8 cd 012c ce 00011170"+ // tokens 1, 200, 300, 70000
		"02"+ // block_size
		"c0"+ // lora_id
		"a3 475055"+ // "GPU"
		"c0"+ // lora_name
		"03") // dp rank
	b, st := mustDecode(t, data)
	if b.TS != 1.5 || b.DPRank == nil || *b.DPRank != 3 || st.Events != 1 || len(st.Problems) != 0 {
		t.Fatalf("batch = %+v, stats = %+v", b, st)
	}
	ev := storedAt(t, b, 0)
	want := &BlockStored{
		BlockHashes: []Hash{HashFromUint64(math.MaxUint64), HashFromInt64(-5)},
		Parent:      ptr(HashFromUint64(7)),
		TokenIDs:    []uint32{1, 200, 300, 70000},
		BlockSize:   2,
		Medium:      "GPU",
	}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("event = %+v\nwant    %+v", ev, want)
	}
	if ev.BlockHashes[1].Key() != 0xfffffffffffffffb {
		t.Fatalf("negative hash key = %x", ev.BlockHashes[1].Key())
	}
}

// The v0.9-era BlockStored had only 5 fields and no medium; outer batch
// without data_parallel_rank.
func TestDecodeOldFiveFieldStored(t *testing.T) {
	data := cat(mArr(2), mF64(10), mArr(2),
		cat(mArr(6), mStr("BlockStored"), mArr(1), mI(-9223372036854775808), mNil(), mTokens(5, 6), mU(2), mU(12)),
		cat(mArr(2), mStr("BlockRemoved"), cat(mArr(1), mI(-300))),
	)
	b, st := mustDecode(t, data)
	if b.DPRank != nil || st.Events != 2 {
		t.Fatalf("batch = %+v stats %+v", b, st)
	}
	ev := storedAt(t, b, 0)
	if ev.BlockHashes[0].Key() != 1<<63 || ev.Parent != nil || ev.LoRAID == nil || *ev.LoRAID != 12 || ev.Medium != "" {
		t.Fatalf("event = %+v", ev)
	}
	rm := b.Events[1].(*BlockRemoved)
	if rm.BlockHashes[0] != HashFromInt64(-300) || rm.Medium != "" || rm.GroupIdx != nil {
		t.Fatalf("removed = %+v", rm)
	}
}

// v026Bytes is the batch captured from vLLM v0.26.0 (spec 1.5, kthena#1535),
// written in msgspec's byte layout by the independent test writer.
func v026Bytes() []byte {
	return cat(mArr(3), mF64(1789095808.84), mArr(1),
		mMap(11),
		mStr("type"), mStr("BlockStored"),
		mStr("block_hashes"), cat(mArr(1), mU(15760518052499183552)),
		mStr("parent_block_hash"), mNil(),
		mStr("token_ids"), mTokens(seqTokens(16, 1000)...),
		mStr("block_size"), mU(16),
		mStr("lora_id"), mNil(),
		mStr("medium"), mStr("GPU"),
		mStr("lora_name"), mNil(),
		mStr("extra_keys"), cat(mArr(1), mNil()),
		mStr("group_idx"), mU(0),
		mStr("kv_cache_spec_kind"), mStr("full_attention"),
		mU(0),
	)
}

func v026Batch() Batch {
	return Batch{
		TS: 1789095808.84,
		Events: []Event{&BlockStored{
			BlockHashes: []Hash{HashFromUint64(15760518052499183552)},
			TokenIDs:    u32s(seqTokens(16, 1000)),
			BlockSize:   16,
			Medium:      "GPU",
			ExtraKeys:   [][]any{nil},
			GroupIdx:    ptr(0),
			SpecKind:    "full_attention",
		}},
		DPRank: ptr(0),
	}
}

func TestDecodeV026MapExample(t *testing.T) {
	b, st := mustDecode(t, v026Bytes())
	if st.Events != 1 || st.Malformed != 0 || st.Unknown != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if !reflect.DeepEqual(b, v026Batch()) {
		t.Fatalf("batch = %#v", b)
	}
	if k := storedAt(t, b, 0).BlockHashes[0].Key(); k != 15760518052499183552 {
		t.Fatalf("key = %d", k)
	}
}

func TestDecodeOuterMapForm(t *testing.T) {
	data := cat(mMap(4),
		mStr("events"), cat(mArr(1), mMap(1), mStr("type"), mStr("AllBlocksCleared")),
		mStr("future_field"), cat(mArr(2), mU(1), mStr("x")),
		mStr("data_parallel_rank"), mU(2),
		mStr("ts"), mU(1700000000), // an int ts is accepted
	)
	b, _ := mustDecode(t, data)
	want := Batch{TS: 1700000000, Events: []Event{&AllBlocksCleared{}}, DPRank: ptr(2)}
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("batch = %#v", b)
	}
	// data_parallel_rank may be None.
	data = cat(mMap(3), mStr("ts"), mF64(1), mStr("events"), mArr(0), mStr("data_parallel_rank"), mNil())
	b, _ = mustDecode(t, data)
	if b.DPRank != nil || b.Events != nil {
		t.Fatalf("batch = %#v", b)
	}
}

func TestDecodeBinHashes(t *testing.T) {
	sha := bytes.Repeat([]byte{0xab}, 24)
	sha = append(sha, 1, 2, 3, 4, 5, 6, 7, 8)
	xx := make([]byte, 16)
	for i := range xx {
		xx[i] = byte(i)
	}
	data := cat(mArr(3), mF64(0), mArr(1),
		cat(mArr(11), mStr("BlockStored"), cat(mArr(2), mBin(sha), mBin(xx)), mBin(xx),
			mTokens(1, 2), mU(1), mNil(), mStr("CPU"), mStr("my-lora"), mNil(), mNil(), mStr("full_attention")),
		mU(0))
	b, _ := mustDecode(t, data)
	ev := storedAt(t, b, 0)
	if !ev.BlockHashes[0].IsBytes() || !bytes.Equal(ev.BlockHashes[0].Bytes(), sha) {
		t.Fatalf("hash 0 = %v", ev.BlockHashes[0])
	}
	if k := ev.BlockHashes[0].Key(); k != 0x0102030405060708 {
		t.Fatalf("sha key = %x", k)
	}
	if k := ev.BlockHashes[1].Key(); k != 0x08090a0b0c0d0e0f {
		t.Fatalf("xxh key = %x", k)
	}
	if *ev.Parent != ev.BlockHashes[1] || ev.Parent.String() != "000102030405060708090a0b0c0d0e0f" {
		t.Fatalf("parent = %v", ev.Parent)
	}
	if ev.LoRAName != "my-lora" || ev.Medium != "CPU" || ev.SpecKind != "full_attention" || ev.GroupIdx != nil {
		t.Fatalf("event = %+v", ev)
	}
	// The same digest as int and as bytes share the key but are distinct.
	if HashFromUint64(0x0102030405060708) == ev.BlockHashes[0] {
		t.Fatal("int and bin hashes compare equal")
	}
}

// Every msgpack integer form must be accepted for hashes, tokens and ints.
func TestDecodeIntegerForms(t *testing.T) {
	hashes := cat(mArr(9),
		hx(t, "05"), hx(t, "cc ff"), hx(t, "cd ffff"), hx(t, "ce ffffffff"),
		hx(t, "cf 8000000000000000"), hx(t, "d0 80"), hx(t, "d1 8000"), hx(t, "d2 80000000"),
		hx(t, "d3 8000000000000000"))
	toks := cat(mArr(9),
		hx(t, "7f"), hx(t, "cc 80"), hx(t, "cd 8000"), hx(t, "ce ffffffff"),
		hx(t, "cf 0000000000000009"), hx(t, "d0 05"), hx(t, "d1 0100"), hx(t, "d2 00010000"), hx(t, "d3 0000000000000003"))
	data := cat(mArr(2), mF64(0), mArr(1),
		cat(mArr(12), mStr("BlockStored"), hashes, mNil(), toks, mU(1), hx(t, "d3 ffffffffffffffff"),
			mNil(), mNil(), mNil(), hx(t, "d1 ff00"), mStr("sliding_window"), hx(t, "cd 1000")))
	b, st := mustDecode(t, data)
	if len(st.Problems) != 0 {
		t.Fatalf("problems: %v", st.Problems)
	}
	ev := storedAt(t, b, 0)
	wantH := []uint64{5, 0xff, 0xffff, 0xffffffff, 1 << 63, uint64(math.MaxUint64 - 127), uint64(math.MaxUint64 - 32767), uint64(math.MaxUint64 - (1<<31 - 1)), 1 << 63}
	for i, h := range ev.BlockHashes {
		if h.Key() != wantH[i] {
			t.Errorf("hash %d = %x, want %x", i, h.Key(), wantH[i])
		}
	}
	wantT := []uint32{127, 128, 32768, math.MaxUint32, 9, 5, 256, 65536, 3}
	if !reflect.DeepEqual(ev.TokenIDs, wantT) {
		t.Errorf("tokens = %v", ev.TokenIDs)
	}
	if *ev.LoRAID != -1 || *ev.GroupIdx != -256 || *ev.SlidingWindow != 4096 {
		t.Errorf("event = %+v", ev)
	}
}

func TestDecodeUnknownFieldsAndTypes(t *testing.T) {
	stored := cat(mMap(7),
		mStr("locality"), mStr("LOCAL"), // unknown key before "type"
		mStr("type"), mStr("BlockStored"),
		mStr("token_ids"), mTokens(1, 2),
		mStr("block_size"), mU(2),
		mStr("block_hashes"), cat(mArr(1), mU(99)),
		mStr("ownership"), cat(mMap(1), mStr("a"), mArr(0)),
		mStr("medium"), mStr("GPU"),
	)
	arrayExtra := cat(mArr(14), mStr("BlockStored"), cat(mArr(1), mU(1)), mU(0), mTokens(1), mU(1),
		mNil(), mNil(), mNil(), mNil(), mNil(), mNil(), mNil(), mStr("future"), cat(mArr(1), mU(1)))
	data := cat(mArr(4), mF64(2), mArr(6),
		cat(mArr(4), mStr("BlockTransferred"), cat(mArr(1), mU(1)), mStr("GPU"), mStr("CPU")),
		stored,
		cat(mMap(2), mStr("block_hashes"), mArr(0), mStr("type"), mStr("BlockSnapshot")),
		arrayExtra,
		cat(mArr(3), mStr("AllBlocksCleared"), mStr("GPU"), mNil()),
		cat(mMap(3), mStr("type"), mStr("BlockRemoved"), mStr("block_hashes"), cat(mArr(1), mU(99)), mStr("locality"), mNil()),
		mU(1), mStr("extra outer item"))
	b, st := mustDecode(t, data)
	if st.Events != 4 || st.Unknown != 2 || st.Malformed != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if !reflect.DeepEqual(st.UnknownTypes, []string{"BlockTransferred", "BlockSnapshot"}) {
		t.Fatalf("unknown types = %v", st.UnknownTypes)
	}
	ev := storedAt(t, b, 0)
	if ev.Medium != "GPU" || ev.BlockHashes[0].Key() != 99 || ev.Parent != nil {
		t.Fatalf("stored = %+v", ev)
	}
	if ev := storedAt(t, b, 1); ev.Parent == nil || ev.Parent.Key() != 0 || len(ev.TokenIDs) != 1 {
		t.Fatalf("array stored = %+v", ev)
	}
	if _, ok := b.Events[2].(*AllBlocksCleared); !ok {
		t.Fatalf("event 2 = %T", b.Events[2])
	}
	if rm := b.Events[3].(*BlockRemoved); rm.BlockHashes[0].Key() != 99 || rm.Medium != "" {
		t.Fatalf("removed = %+v", rm)
	}
}

func TestDecodeMalformedEventsAreSkipped(t *testing.T) {
	good := cat(mArr(2), mStr("BlockRemoved"), cat(mArr(1), mU(5)))
	cases := []struct {
		name string
		ev   []byte
		want string
	}{
		{"token count mismatch", cat(mArr(8), mStr("BlockStored"), cat(mArr(2), mU(1), mU(2)), mNil(), mTokens(1, 2, 3), mU(2), mNil(), mNil(), mNil()), "token_ids"},
		{"string hash", cat(mArr(3), mStr("BlockRemoved"), cat(mArr(1), mStr("abc")), mNil()), "block_hashes"},
		{"negative token", cat(mArr(5), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), cat(mArr(1), mI(-1)), mU(1)), "token"},
		{"token over uint32", cat(mArr(5), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), cat(mArr(1), mU(1<<32)), mU(1)), "token"},
		{"zero block size", cat(mArr(5), mStr("BlockStored"), mArr(0), mNil(), mArr(0), mU(0)), "block_size"},
		{"too few fields", cat(mArr(4), mStr("BlockStored"), mArr(0), mNil(), mArr(0)), "at least 4"},
		{"empty array", mArr(0), "empty"},
		{"int event", mU(3), "array"},
		{"map without type", cat(mMap(1), mStr("block_hashes"), mArr(0)), "type"},
		{"map missing tokens", cat(mMap(3), mStr("type"), mStr("BlockStored"), mStr("block_hashes"), mArr(0), mStr("block_size"), mU(4)), "lacks"},
		{"non-string tag", cat(mArr(1), mU(1)), "tag"},
		{"medium int", cat(mArr(3), mStr("BlockRemoved"), mArr(0), mU(1)), "medium"},
		{"empty bin hash", cat(mArr(3), mStr("BlockRemoved"), cat(mArr(1), mBin(nil)), mNil()), "empty bin"},
		{"long bin hash", cat(mArr(3), mStr("BlockRemoved"), cat(mArr(1), mBin(make([]byte, 65))), mNil()), "limit"},
		{"lora_id over int64", cat(mArr(6), mStr("BlockStored"), mArr(0), mNil(), mArr(0), mU(1), mU(1<<63)), "lora_id"},
		{"extra_keys item int", cat(mArr(9), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1), mNil(), mNil(), mNil(), cat(mArr(1), mU(4))), "extra_keys"},
		{"extra_keys ext value", cat(mArr(9), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1), mNil(), mNil(), mNil(), cat(mArr(1), mArr(1), hx(t, "d4 01 02"))), "ext"},
		{"long string", cat(mArr(3), mStr("BlockRemoved"), mArr(0), mStr(strings.Repeat("x", MaxStringLen+1))), "limit"},
		{"control: valid with a trailing item", cat(mArr(5), mStr("BlockRemoved"), mArr(0), mNil(), mNil(), mArr(0)), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := cat(mArr(3), mF64(1), mArr(3), good, tc.ev, good, mU(0))
			b, st, err := DecodeBatch(data)
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			if tc.want == "" { // control case: everything valid
				if st.Events != 3 {
					t.Fatalf("stats = %+v", st)
				}
				return
			}
			if st.Events != 2 || len(b.Events) != 2 || st.Malformed != 1 || len(st.Problems) != 1 {
				t.Fatalf("stats = %+v", st)
			}
			p := st.Problems[0]
			if p.Index != 1 || !p.Skipped || !errors.Is(p.Err, ErrMalformed) || !strings.Contains(p.String(), tc.want) {
				t.Fatalf("problem = %s", p)
			}
		})
	}
}

func TestDecodeSparseGroupsSkipTokenCheck(t *testing.T) {
	// Sliding-window group: 1 hash for 3 blocks of tokens.
	mk := func(kind []byte) []byte {
		return cat(mArr(2), mF64(1), mArr(1),
			cat(mArr(12), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(seqTokens(6, 0)...), mU(2),
				mNil(), mStr("GPU"), mNil(), mNil(), mU(1), kind, mU(128)))
	}
	b, st := mustDecode(t, mk(mStr("sliding_window")))
	if st.Events != 1 || *storedAt(t, b, 0).SlidingWindow != 128 {
		t.Fatalf("sparse store rejected: %+v", st)
	}
	for _, kind := range [][]byte{mStr("full_attention"), mNil()} {
		_, st = mustDecode(t, mk(kind))
		if st.Events != 0 || st.Malformed != 1 {
			t.Fatalf("full-attention mismatch accepted: %+v", st)
		}
	}
}

func TestDecodeExtraKeys(t *testing.T) {
	ek := cat(mArr(3),
		cat(mArr(4), mStr("lora-a"), cat(mArr(2), mStr("img-1"), mI(-16)), mBin([]byte{1, 2}), mU(math.MaxUint64)),
		mNil(),
		cat(mArr(3), mStr("salt"), mF64(0.5), cat(mMap(1), mStr("k"), hx(t, "c3"))),
	)
	data := cat(mArr(2), mF64(1), mArr(1),
		cat(mArr(9), mStr("BlockStored"), cat(mArr(3), mU(1), mU(2), mU(3)), mNil(), mTokens(1, 2, 3), mU(1),
			mNil(), mNil(), mNil(), ek))
	b, _ := mustDecode(t, data)
	want := [][]any{
		{"lora-a", []any{"img-1", int64(-16)}, []byte{1, 2}, uint64(math.MaxUint64)},
		nil,
		{"salt", 0.5, map[string]any{"k": true}},
	}
	if got := storedAt(t, b, 0).ExtraKeys; !reflect.DeepEqual(got, want) {
		t.Fatalf("extra keys = %#v", got)
	}
	// SGLang-style metadata map in the extra_keys slot: ignored, event kept.
	data = cat(mArr(2), mF64(1), mArr(1),
		cat(mArr(9), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1),
			mNil(), mNil(), mNil(), cat(mMap(1), mStr("cache_salt"), mStr("s"))))
	b, st := mustDecode(t, data)
	if st.Events != 1 || st.Malformed != 0 || len(st.Problems) != 1 || st.Problems[0].Skipped || storedAt(t, b, 0).ExtraKeys != nil {
		t.Fatalf("stats = %+v", st)
	}
}

func TestDecodeOuterErrors(t *testing.T) {
	huge := hx(t, "dd ffffffff")
	cases := map[string][]byte{
		"empty":            nil,
		"not a container":  mU(1),
		"array of one":     cat(mArr(1), mF64(1)),
		"ts string":        cat(mArr(2), mStr("x"), mArr(0)),
		"events not array": cat(mArr(2), mF64(1), mU(1)),
		"truncated":        cat(mArr(2), mF64(1), mArr(2), mArr(1), mStr("AllBlocksCleared")),
		"trailing bytes":   cat(mArr(2), mF64(1), mArr(0), mU(1)),
		"huge events":      cat(mArr(2), mF64(1), huge),
		"events over max":  cat(mArr(2), mF64(1), hx(t, "dd 00100001"), bytes.Repeat(mArr(0), MaxEvents+1)),
		"huge token array": cat(mArr(2), mF64(1), mArr(1), mArr(5), mStr("BlockStored"), mArr(0), mNil(), huge),
		"huge map":         hx(t, "df ffffffff"),
		"map without ts":   cat(mMap(1), mStr("events"), mArr(0)),
		"map int key":      cat(mMap(1), mU(1), mArr(0)),
		"dp rank string":   cat(mArr(3), mF64(1), mArr(0), mStr("0")),
		"truncated float":  hx(t, "92 cb 00"),
		"reserved byte":    cat(mArr(2), mF64(1), mArr(1), mArr(2), mStr("X"), hx(t, "c1")),
		"truncated ext":    cat(mArr(2), mF64(1), mArr(1), mArr(2), mStr("X"), hx(t, "c9 ffffffff 01")),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := DecodeBatch(data)
			if err == nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
		})
	}
}

// Length prefixes must not drive allocations beyond the input size.
func TestDecodeBoundedAllocations(t *testing.T) {
	data := cat(mArr(2), mF64(1), mArr(1), mArr(5), mStr("BlockStored"), mArr(0), mNil(), hx(t, "dd 00ffffff"), mU(1))
	allocs := testing.AllocsPerRun(10, func() { _, _, _ = DecodeBatch(data) })
	if allocs > 40 {
		t.Fatalf("%.0f allocations", allocs)
	}
	var ms1, ms2 runtimeMem
	ms1.read()
	for range 10 {
		_, _, _ = DecodeBatch(data)
	}
	ms2.read()
	if d := ms2.total - ms1.total; d > 1<<20 {
		t.Fatalf("allocated %d bytes for a %d-byte input", d, len(data))
	}
}

func TestDecodeDeepNestingInUnknownField(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 100000), 0x01)
	data := cat(mArr(2), mF64(1), mArr(2),
		cat(mArr(3), mStr("Deep"), deep, mNil()),
		cat(mArr(9), mStr("BlockStored"), cat(mArr(1), mU(1)), mNil(), mTokens(1), mU(1), mNil(), mNil(), mNil(),
			cat(mArr(1), deep)),
	)
	_, st := mustDecode(t, data)
	if st.Unknown != 1 || st.Malformed != 1 || !strings.Contains(st.Problems[0].Err.Error(), "nesting") {
		t.Fatalf("stats = %+v", st)
	}
}

func TestHashHelpers(t *testing.T) {
	if h := HashFromBytes([]byte{1, 2, 3}); h.Key() != 0x010203 || !h.IsBytes() || h.String() != "010203" {
		t.Fatalf("short hash = %v %x", h, h.Key())
	}
	if h := HashFromBytes(nil); h != (Hash{}) || h.IsBytes() || h.Bytes() != nil {
		t.Fatalf("empty hash = %v", h)
	}
	if h := HashFromInt64(-1); h.Key() != math.MaxUint64 || h.String() != "18446744073709551615" {
		t.Fatalf("int hash = %v", h)
	}
	b := make([]byte, 100)
	b[99] = 7
	if h := HashFromBytes(b); len(h.Bytes()) != MaxHashBytes || h.Key() != 7 {
		t.Fatalf("long hash = %v", h)
	}
}
