package blockhash

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

type vllmVectorFile struct {
	BlockSize int                       `json:"block_size"`
	Cases     map[string]vllmVectorCase `json:"cases"`
}

type vllmVectorCase struct {
	Seed     string            `json:"seed"`
	NoneHash string            `json:"none_hash_hex"`
	Blocks   []vllmVectorBlock `json:"blocks"`
}

type vllmVectorBlock struct {
	Tokens    []uint32 `json:"tokens"`
	ExtraKeys any      `json:"extra_keys"`
	CBOR      string   `json:"cbor_hex"`
	Digest    string   `json:"digest_hex"`
	Event     string   `json:"event_uint64"`
}

func loadVLLMVectors(t *testing.T) vllmVectorFile {
	t.Helper()
	data, err := os.ReadFile("testdata/vllm-sha256-cbor-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vf vllmVectorFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&vf); err != nil {
		t.Fatalf("decode vLLM vectors: %v", err)
	}
	if len(vf.Cases) == 0 {
		t.Fatal("no cases in vLLM vectors")
	}
	return vf
}

// jsonExtraKeys converts decoded JSON extra keys (nil, or arrays of strings,
// numbers and arrays) to the []any the encoder takes, numbers as int64.
func jsonExtraKeys(v any) ([]any, error) {
	if v == nil {
		return nil, nil
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("extra_keys is %T, want array or null", v)
	}
	out := make([]any, 0, len(arr))
	for _, e := range arr {
		switch e := e.(type) {
		case string:
			out = append(out, e)
		case json.Number:
			n, err := e.Int64()
			if err != nil {
				return nil, fmt.Errorf("number %s: %w", e, err)
			}
			out = append(out, n)
		case []any:
			sub, err := jsonExtraKeys(e)
			if err != nil {
				return nil, err
			}
			out = append(out, sub)
		default:
			return nil, fmt.Errorf("unexpected JSON item %T", e)
		}
	}
	return out, nil
}

func sortedCaseNames(vf vllmVectorFile) []string {
	names := make([]string, 0, len(vf.Cases))
	for name := range vf.Cases {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// TestVLLMVectors reproduces every block of every case: NONE_HASH, the CBOR
// bytes, the digest and the published event value.
func TestVLLMVectors(t *testing.T) {
	vf := loadVLLMVectors(t)
	nBlocks := 0
	for _, name := range sortedCaseNames(vf) {
		c := vf.Cases[name]
		t.Run(name, func(t *testing.T) {
			none := VLLMNoneHash(c.Seed)
			if got := none.String(); got != c.NoneHash {
				t.Fatalf("NONE_HASH(%q) = %s, want %s", c.Seed, got, c.NoneHash)
			}
			parent := none
			for i, b := range c.Blocks {
				nBlocks++
				extra, err := jsonExtraKeys(b.ExtraKeys)
				if err != nil {
					t.Fatalf("block %d: %v", i, err)
				}
				cb, err := VLLMBlockCBOR(nil, parent, b.Tokens, extra)
				if err != nil {
					t.Fatalf("block %d: %v", i, err)
				}
				if got := hex.EncodeToString(cb); got != b.CBOR {
					t.Errorf("block %d CBOR:\n got %s\nwant %s", i, got, b.CBOR)
				}
				d, err := VLLMBlock(parent, b.Tokens, extra)
				if err != nil {
					t.Fatalf("block %d: %v", i, err)
				}
				if got := d.String(); got != b.Digest {
					t.Errorf("block %d digest %s, want %s", i, got, b.Digest)
				}
				want, err := strconv.ParseUint(b.Event, 10, 64)
				if err != nil {
					t.Fatalf("block %d event_uint64 %q: %v", i, b.Event, err)
				}
				if got := d.Published(); got != want {
					t.Errorf("block %d published %d, want %d", i, got, want)
				}
				parent = d
			}
		})
	}
	if nBlocks < 10 {
		t.Errorf("only %d blocks checked", nBlocks)
	}
}

// TestVLLMHasherChain checks that VLLMHasher.Chain, given the request-level
// LoRA name, cache salt and multimodal items, reproduces each case, and that
// VLLMExtraKeys gives exactly each block's recorded extra keys.
func TestVLLMHasherChain(t *testing.T) {
	vf := loadVLLMVectors(t)
	type request struct {
		lora, salt string
		items      []MMItem
	}
	requests := map[string]request{
		"seed0_step101":                {},
		"default_seed_range":           {},
		"default_seed_large_token_ids": {},
		"default_seed_cache_salt":      {salt: "tenant-a"},
		"default_seed_lora":            {lora: "my-lora"},
		// An image whose span starts 3 tokens before block 0 and ends inside it.
		"default_seed_multimodal_negative_offset": {items: []MMItem{{ID: "img-abc", Offset: -3, Length: 8}}},
	}
	for _, name := range sortedCaseNames(vf) {
		c := vf.Cases[name]
		req, ok := requests[name]
		if !ok {
			t.Errorf("case %s has no request description in this test", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			h, err := NewVLLM(c.Seed, vf.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.NoneHash().String(); got != c.NoneHash {
				t.Fatalf("NoneHash %s, want %s", got, c.NoneHash)
			}
			var tokens []uint32
			for i, b := range c.Blocks {
				want, err := jsonExtraKeys(b.ExtraKeys)
				if err != nil {
					t.Fatal(err)
				}
				if got := VLLMExtraKeys(req.lora, req.items, req.salt, i, vf.BlockSize); !reflect.DeepEqual(got, want) {
					t.Errorf("block %d extra keys %#v, want %#v", i, got, want)
				}
				tokens = append(tokens, b.Tokens...)
			}
			// A partial tail must not change anything.
			tokens = append(tokens, 1, 2, 3)
			got, err := h.Chain(tokens, req.lora, req.salt, req.items)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.Blocks) {
				t.Fatalf("%d digests, want %d", len(got), len(c.Blocks))
			}
			for i, b := range c.Blocks {
				if got[i].String() != b.Digest {
					t.Errorf("block %d digest %s, want %s", i, got[i], b.Digest)
				}
			}
		})
	}
}

func TestVLLMExtraKeysOrder(t *testing.T) {
	items := []MMItem{{"img-1", 10, 10}, {"img-2", 18, 2}, {"img-3", 40, 5}}
	got := VLLMExtraKeys("lora", items, "salt", 0, 16)
	want := []any{"lora", []any{"img-1", int64(10)}, "salt"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("block 0: %#v, want %#v", got, want)
	}
	got = VLLMExtraKeys("lora", items, "salt", 1, 16)
	want = []any{"lora", []any{"img-1", int64(-6)}, []any{"img-2", int64(2)}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("block 1: %#v, want %#v", got, want)
	}
	if got := VLLMExtraKeys("", items, "salt", 3, 16); got != nil {
		t.Errorf("block 3: %#v, want nil", got)
	}
	if got := VLLMExtraKeys("", nil, "", 0, 16); got != nil {
		t.Errorf("nothing: %#v, want nil", got)
	}
}

func TestVLLMCBOREncoding(t *testing.T) {
	var zero Digest
	prefix := "835820" + hex.EncodeToString(zero[:])
	for _, c := range []struct {
		name   string
		tokens []uint32
		extra  []any
		want   string // after the parent
	}{
		{"empty", nil, nil, "80f6"},
		{"empty extra slice is null", []uint32{0}, []any{}, "8100f6"},
		{"uint heads", []uint32{23, 24, 255, 256, 65535, 65536, 0xFFFFFFFF}, nil,
			"87" + "17" + "1818" + "18ff" + "190100" + "19ffff" + "1a00010000" + "1affffffff" + "f6"},
		{"ints", nil, []any{0, -1, -24, -25, int64(-256), int64(-257), int64(1) << 40, int64(-1) << 63},
			"80" + "88" + "00" + "20" + "37" + "3818" + "38ff" + "390100" + "1b0000010000000000" + "3b7fffffffffffffff"},
		{"bytes and text", nil, []any{[]byte{1, 2}, "é", ""}, "80" + "83" + "420102" + "62c3a9" + "60"},
		{"nested", nil, []any{[]any{"a", []any{int64(1)}}}, "80" + "81" + "82" + "6161" + "8101"},
	} {
		got, err := VLLMBlockCBOR(nil, zero, c.tokens, c.extra)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if g := hex.EncodeToString(got); g != prefix+c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, g, prefix+c.want)
		}
	}
	// 24 tokens need a 1-byte length.
	got, _ := VLLMBlockCBOR(nil, zero, make([]uint32, 24), nil)
	if g := hex.EncodeToString(got[35:37]); g != "9818" {
		t.Errorf("24-token array head %s, want 9818", g)
	}
	// Seeds of 24 bytes or more need a longer text head.
	long := "abcdefghijklmnopqrstuvwxyz"
	if VLLMNoneHash(long) == VLLMNoneHash(long[:23]) {
		t.Error("NONE_HASH collision")
	}
}

func TestVLLMErrors(t *testing.T) {
	var parent Digest
	selfRef := []any{nil}
	selfRef[0] = selfRef
	for _, c := range []struct {
		name  string
		extra []any
	}{
		{"float", []any{1.5}},
		{"nil item", []any{nil}},
		{"uint32", []any{uint32(1)}},
		{"nested unsupported", []any{[]any{"a", struct{}{}}}},
		{"invalid utf8", []any{"\xff"}},
		{"self reference", selfRef},
	} {
		dst := []byte{9}
		out, err := VLLMBlockCBOR(dst, parent, []uint32{1}, c.extra)
		if !errors.Is(err, ErrUnsupportedExtraKey) {
			t.Errorf("%s: err %v, want ErrUnsupportedExtraKey", c.name, err)
		}
		if !bytes.Equal(out, dst) {
			t.Errorf("%s: dst changed on error", c.name)
		}
		if _, err := VLLMBlock(parent, []uint32{1}, c.extra); !errors.Is(err, ErrUnsupportedExtraKey) {
			t.Errorf("%s: VLLMBlock err %v", c.name, err)
		}
	}
	for _, bs := range []int{0, -1, MaxBlockSize + 1} {
		if h, err := NewVLLM(DefaultVLLMSeed, bs); !errors.Is(err, ErrInvalidBlockSize) || h != nil {
			t.Errorf("NewVLLM(block size %d): %v, %v", bs, h, err)
		}
	}
	if _, err := NewVLLM("\xff", 16); err == nil {
		t.Error("NewVLLM accepted an invalid UTF-8 seed")
	}
	h, err := NewVLLM(DefaultVLLMSeed, 16)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Chain(make([]uint32, 32), "\xff", "", nil); !errors.Is(err, ErrUnsupportedExtraKey) {
		t.Errorf("Chain with invalid LoRA name: %v", err)
	}
	if d, err := h.Chain(make([]uint32, 15), "", "", nil); err != nil || len(d) != 0 {
		t.Errorf("Chain of a partial block: %v, %v", d, err)
	}
}

func TestVLLMPublished(t *testing.T) {
	var d Digest
	for i := range d {
		d[i] = byte(i)
	}
	if got, want := d.Published(), uint64(0x18191a1b1c1d1e1f); got != want {
		t.Errorf("Published %x, want %x", got, want)
	}
}
