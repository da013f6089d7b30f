package blockhash

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestFullBlocks(t *testing.T) {
	for _, c := range []struct{ n, bs, want int }{
		{0, 16, 0}, {15, 16, 0}, {16, 16, 1}, {17, 16, 1}, {31, 16, 1}, {32, 16, 2},
		{32768, 16, 2048}, {5, 1, 5}, {63, 64, 0}, {64, 64, 1},
		{-1, 16, 0}, {16, 0, 0}, {16, -16, 0},
	} {
		if got := FullBlocks(c.n, c.bs); got != c.want {
			t.Errorf("FullBlocks(%d, %d) = %d, want %d", c.n, c.bs, got, c.want)
		}
	}
}

func mustNew(t testing.TB, ns Namespace) *Hasher {
	t.Helper()
	h, err := New(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func randTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = r.Uint32()
	}
	return out
}

func TestChainPartialTailIgnored(t *testing.T) {
	h := mustNew(t, Namespace{Model: "m", BlockSize: 16})
	r := rand.New(rand.NewPCG(1, 2))
	tokens := randTokens(r, 16*5+15)
	full := h.Chain(nil, tokens, nil)
	if len(full) != 5 {
		t.Fatalf("got %d hashes, want 5", len(full))
	}
	for tail := range 16 {
		if got := h.Chain(nil, tokens[:16*5+tail], nil); !slices.Equal(got, full) {
			t.Errorf("tail %d changed the chain", tail)
		}
	}
	if got := h.Chain(nil, tokens[:15], nil); len(got) != 0 {
		t.Errorf("15 tokens gave %d hashes", len(got))
	}
	// Appends to dst.
	dst := []uint64{7}
	if got := h.Chain(dst, tokens, nil); len(got) != 6 || got[0] != 7 || !slices.Equal(got[1:], full) {
		t.Errorf("Chain did not append to dst: %v", got)
	}
}

func TestChainMatchesBlock(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, bs := range []int{1, 2, 3, 16, 60, 64, 100} {
		h := mustNew(t, Namespace{Model: "m", LoRA: "l", BlockSize: bs})
		tokens := randTokens(r, 7*bs+bs/2)
		items := []MMItem{{"a", bs / 2, bs + 1}, {"b", 3 * bs, 2 * bs}, {"c", 3*bs + 1, 1}}
		for _, it := range [][]MMItem{nil, items} {
			got := h.Chain(nil, tokens, it)
			parent := h.Root()
			for i := range 7 {
				keys := AppendExtraKeys(nil, it, i, bs)
				parent = Block(parent, tokens[i*bs:(i+1)*bs], keys)
				if got[i] != parent {
					t.Fatalf("bs %d items %v block %d: Chain %016x, Block %016x", bs, it != nil, i, got[i], parent)
				}
			}
		}
	}
}

func TestAppendExtraKeys(t *testing.T) {
	items := []MMItem{
		{"img-1", 10, 20},  // tokens [10, 30): blocks 0 and 1
		{"img-2", 32, 16},  // [32, 48): block 2 exactly
		{"img-3", 47, 2},   // [47, 49): blocks 2 and 3
		{"empty", 20, 0},   // never overlaps
		{"img-0", -3, 5},   // [-3, 2): block 0
		{"img-4", 16, 100}, // [16, 116): blocks 1..
	}
	want := map[int][]ExtraKey{
		0: {{"img-1", 10}, {"img-0", -3}},
		1: {{"img-1", -6}, {"img-4", 0}},
		2: {{"img-2", 0}, {"img-3", 15}, {"img-4", -16}},
		3: {{"img-3", -1}, {"img-4", -32}},
		7: {{"img-4", -96}},
		8: nil,
	}
	for bi, w := range want {
		if got := AppendExtraKeys(nil, items, bi, 16); !slices.Equal(got, w) {
			t.Errorf("block %d: got %v, want %v", bi, got, w)
		}
	}
	if got := AppendExtraKeys(nil, items, 0, 0); got != nil {
		t.Errorf("block size 0: %v", got)
	}
	if got := AppendExtraKeys(nil, items, -1, 16); got != nil {
		t.Errorf("negative block index: %v", got)
	}
}

// TestChainExtendEquivalence hashes whole prompts and compares with hashing
// the first k blocks and extending with the rest, for every split k.
func TestChainExtendEquivalence(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, bs := range []int{1, 16, 64} {
		h := mustNew(t, Namespace{Model: "m", CacheSalt: "s", BlockSize: bs})
		nb := 9
		if bs == 1 {
			nb = 40
		}
		tokens := randTokens(r, nb*bs+bs/3)
		itemSets := [][]MMItem{
			nil,
			// Items spanning block boundaries and the split points.
			{{"img-a", bs - 1, 2*bs + 1}, {"img-b", 4*bs + bs/2, 3 * bs}, {"img-c", 8 * bs, bs}},
		}
		for _, items := range itemSets {
			want := h.Chain(nil, tokens, items)
			if len(want) != nb {
				t.Fatalf("bs %d: %d hashes, want %d", bs, len(want), nb)
			}
			for k := 0; k <= nb; k++ {
				head := h.Chain(nil, tokens[:k*bs], items)
				parent := h.Root()
				if k > 0 {
					parent = head[k-1]
				}
				got := h.Extend(head, parent, k, tokens[k*bs:], items)
				if !slices.Equal(got, want) {
					t.Fatalf("bs %d items %d split %d: Chain+Extend differs from Chain", bs, len(items), k)
				}
			}
		}
	}
	h := mustNew(t, Namespace{BlockSize: 16})
	if got := h.Extend(nil, h.Root(), -1, make([]uint32, 32), nil); len(got) != 0 {
		t.Errorf("negative firstBlock appended %d hashes", len(got))
	}
}

func TestMMItemsChangeOnlyOverlappedBlocks(t *testing.T) {
	h := mustNew(t, Namespace{Model: "m", BlockSize: 16})
	tokens := seqTokens(0, 64)
	plain := h.Chain(nil, tokens, nil)
	with := h.Chain(nil, tokens, []MMItem{{"img", 20, 8}}) // block 1 only
	if with[0] != plain[0] {
		t.Error("block 0 changed")
	}
	for i := 1; i < 4; i++ {
		if with[i] == plain[i] {
			t.Errorf("block %d unchanged", i)
		}
	}
	other := h.Chain(nil, tokens, []MMItem{{"img2", 20, 8}})
	if other[1] == with[1] {
		t.Error("different item ids gave the same hash")
	}
	moved := h.Chain(nil, tokens, []MMItem{{"img", 21, 8}})
	if moved[1] == with[1] {
		t.Error("different item offsets gave the same hash")
	}
}

func TestNamespacesDiffer(t *testing.T) {
	nss := []Namespace{
		{BlockSize: 16},
		{BlockSize: 32},
		{Model: "m", BlockSize: 16},
		{LoRA: "m", BlockSize: 16},
		{CacheSalt: "m", BlockSize: 16},
		{Model: "ab", BlockSize: 16},
		{Model: "a", LoRA: "b", BlockSize: 16},
		{Model: "a", CacheSalt: "b", BlockSize: 16},
		{LoRA: "a", CacheSalt: "b", BlockSize: 16},
		{Model: "m", LoRA: "l", CacheSalt: "s", BlockSize: 16},
		{Model: "m", LoRA: "l", CacheSalt: "t", BlockSize: 16},
		{Model: "m", LoRA: "l", CacheSalt: "s", BlockSize: 1},
	}
	seen := map[uint64]Namespace{}
	for _, ns := range nss {
		root, err := ns.Root()
		if err != nil {
			t.Fatalf("%+v: %v", ns, err)
		}
		if prev, ok := seen[root]; ok {
			t.Errorf("%+v and %+v share root %016x", prev, ns, root)
		}
		seen[root] = ns
		h := mustNew(t, ns)
		if h.Root() != root || h.Namespace() != ns || h.BlockSize() != ns.BlockSize {
			t.Errorf("%+v: Hasher disagrees with Namespace", ns)
		}
	}
}

func TestNamespaceErrors(t *testing.T) {
	long := strings.Repeat("x", MaxStringLen+1)
	for _, c := range []struct {
		ns   Namespace
		want error
	}{
		{Namespace{BlockSize: 0}, ErrInvalidBlockSize},
		{Namespace{BlockSize: -16}, ErrInvalidBlockSize},
		{Namespace{BlockSize: MaxBlockSize + 1}, ErrInvalidBlockSize},
		{Namespace{Model: long, BlockSize: 16}, ErrStringTooLong},
		{Namespace{LoRA: long, BlockSize: 16}, ErrStringTooLong},
		{Namespace{CacheSalt: long, BlockSize: 16}, ErrStringTooLong},
	} {
		if _, err := c.ns.Root(); !errors.Is(err, c.want) {
			t.Errorf("Root(%.40v): err %v, want %v", c.ns, err, c.want)
		}
		if h, err := New(c.ns); !errors.Is(err, c.want) || h != nil {
			t.Errorf("New(%.40v): %v, %v; want nil, %v", c.ns, h, err, c.want)
		}
	}
	ok := strings.Repeat("x", MaxStringLen)
	for _, ns := range []Namespace{
		{BlockSize: 1}, {BlockSize: MaxBlockSize}, {Model: ok, LoRA: ok, CacheSalt: ok, BlockSize: 16},
	} {
		if _, err := ns.Root(); err != nil {
			t.Errorf("Root(%.40v): %v", ns, err)
		}
	}
}

// TestNeverZero is a property check: no root or block hash is ever 0.
func TestNeverZero(t *testing.T) {
	if nonZero(0) != ZeroReplacement || nonZero(5) != 5 {
		t.Fatal("nonZero")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 20000 {
		parent := r.Uint64()
		if i%10 == 0 {
			parent = 0
		}
		tokens := randTokens(r, r.IntN(80))
		var extra []ExtraKey
		for range r.IntN(3) {
			extra = append(extra, ExtraKey{ID: string(rune('a' + r.IntN(26))), Offset: r.Int64() - r.Int64()})
		}
		if Block(parent, tokens, extra) == 0 {
			t.Fatalf("Block(%x, %v, %v) = 0", parent, tokens, extra)
		}
		ns := Namespace{Model: string(rune('a' + r.IntN(26))), BlockSize: 1 + r.IntN(MaxBlockSize)}
		if root, err := ns.Root(); err != nil || root == 0 {
			t.Fatalf("Root(%+v) = %x, %v", ns, root, err)
		}
	}
}

// TestPortablePath checks that the big-endian-safe encoding produces the same
// bytes, and so the same hashes, as the zero-copy view used on this host.
func TestPortablePath(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 2000 {
		n := r.IntN(300)
		tokens := randTokens(r, n)
		if hostLittleEndian {
			want := make([]byte, 0, 4*n)
			for _, tok := range tokens {
				want = binary.LittleEndian.AppendUint32(want, tok)
			}
			if got := tokenBytes(tokens); string(got) != string(want) {
				t.Fatalf("tokenBytes differs from little-endian encoding for %d tokens", n)
			}
		}
		var extra []ExtraKey
		if r.IntN(2) == 0 {
			extra = []ExtraKey{{"img", int64(r.IntN(100) - 50)}}
		}
		parent := r.Uint64()
		want := blockBuffered(parent, tokens, extra, false)
		if got := Block(parent, tokens, extra); got != want {
			t.Fatalf("Block %016x, portable %016x (n=%d, extra=%v)", got, want, n, extra)
		}
		if hostLittleEndian {
			if got := blockBuffered(parent, tokens, extra, true); got != want {
				t.Fatalf("buffered zero-copy %016x, portable %016x", got, want)
			}
		}
	}
}

func TestChainAllocs(t *testing.T) {
	if !hostLittleEndian {
		t.Skip("the zero-allocation path needs a little-endian host")
	}
	h := mustNew(t, Namespace{Model: "m", BlockSize: 16})
	tokens := randTokens(rand.New(rand.NewPCG(11, 12)), 32768)
	dst := make([]uint64, 0, 2048)
	if a := testing.AllocsPerRun(20, func() { dst = h.Chain(dst[:0], tokens, nil) }); a != 0 {
		t.Errorf("Chain without items: %v allocs per run, want 0", a)
	}
	items := []MMItem{{"img-1", 100, 600}, {"img-2", 20000, 1200}}
	if a := testing.AllocsPerRun(20, func() { dst = h.Chain(dst[:0], tokens, items) }); a != 0 {
		t.Errorf("Chain with items: %v allocs per run, want 0", a)
	}
	if a := testing.AllocsPerRun(20, func() { dst = h.Extend(dst[:0], dst[0], 1, tokens[16:], items) }); a != 0 {
		t.Errorf("Extend: %v allocs per run, want 0", a)
	}
}

func TestZeroHasherNoPanic(t *testing.T) {
	var h Hasher
	if got := h.Chain(nil, make([]uint32, 64), []MMItem{{"x", 0, 4}}); len(got) != 0 {
		t.Errorf("zero Hasher produced %d hashes", len(got))
	}
	if got := Block(0, nil, nil); got == 0 {
		t.Error("Block of nothing is 0")
	}
}
