package radix

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
)

func TestPropertyAgainstReference(t *testing.T) {
	sequences, ops := 2000, 150
	if testing.Short() {
		sequences = 300
	}
	for seq := range sequences {
		src := randSource{rand.New(rand.NewPCG(uint64(seq), 42))}
		f := newForest(src, 20+src.intn(60), 1+src.intn(4))
		x := New(Options{MaxOrphanBlocks: 1 << 30})
		ref := newReference(f)
		var log []string
		for range ops {
			log = append(log, step(t, x, ref, src))
		}
		if t.Failed() {
			t.Fatalf("sequence %d: %v", seq, log)
		}
		checkAgainst(t, x, ref)
	}
}

// TestPropertyPoolSizes runs the property test with pools of many sizes,
// with holder sets from one worker to the whole pool: across the 64-slot
// word boundaries and the size from which a holder set carries a bitmap.
func TestPropertyPoolSizes(t *testing.T) {
	for _, size := range []int{1, 2, 63, 64, 65, bitmapMin - 1, bitmapMin, bitmapMin + 1, 127, 129, 4096, 20_000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			sequences := max(2, 60/(1+size/256))
			if testing.Short() {
				sequences = max(1, sequences/4)
			}
			pool := make([]string, size)
			for i := range pool {
				pool[i] = fmt.Sprintf("pool-%05d", i)
			}
			for seq := range sequences {
				src := randSource{rand.New(rand.NewPCG(uint64(seq), uint64(size)))}
				f := newForest(src, 20+src.intn(40), 1+src.intn(3))
				x := New(Options{MaxOrphanBlocks: 1 << 30, MaxWorkers: size})
				ref := newReference(f)
				ref.pool = pool
				// The whole pool holds one chain: the largest holder set.
				p := f.path(f.nodes[src.intn(len(f.nodes))])
				for _, w := range pool {
					must(t, x.Insert(w, Root, p, GPU))
					ref.insert(w, p, GPU)
				}
				var log []string
				for range 120 {
					log = append(log, step(t, x, ref, src))
					if t.Failed() {
						t.Fatalf("sequence %d: %v", seq, log)
					}
				}
				checkAgainst(t, x, ref)
			}
		})
	}
}

func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(bytes.Repeat([]byte{3, 200, 7, 1}, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &byteSource{b: data}
		fo := newForest(src, 12+src.intn(40), 1+src.intn(3))
		x := New(Options{MaxOrphanBlocks: 1 << 30})
		ref := newReference(fo)
		for i := 0; i < 500 && !src.empty(); i++ {
			step(t, x, ref, src)
		}
		checkAgainst(t, x, ref)
	})
}

// chainOf returns n fresh hashes.
func chainOf(seed uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = fmix(seed<<20+uint64(i)) | 1
	}
	return c
}

func TestMatchStopsAndCountsPerMedium(t *testing.T) {
	x := New(Options{})
	c := chainOf(1, 10)
	must(t, x.Insert("a", Root, c[:6], GPU))
	must(t, x.Insert("a", c[5], c[6:8], CPU))
	must(t, x.Insert("b", Root, c[:3], GPU))
	must(t, x.Insert("b", Root, c[:10], CPU))
	got, err := x.Match(c)
	must(t, err)
	want := []WorkerMatch{
		{Worker: "b", Blocks: 10, Media: [NumMedia]int{3, 10, 0, 0}, GPUOrCPU: 10},
		{Worker: "a", Blocks: 8, Media: [NumMedia]int{6, 0, 0, 0}, GPUOrCPU: 8},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// A chain that leaves the tree stops at the last known block.
	other := append(slices.Clone(c[:4]), chainOf(2, 3)...)
	got, _ = x.Match(other)
	if len(got) != 2 || got[0].Blocks != 4 || got[1].Blocks != 4 {
		t.Fatalf("diverging chain: %+v", got)
	}
	// A chain that does not start at the root matches nothing.
	if got, _ := x.Match(c[1:]); len(got) != 0 {
		t.Fatalf("non-root chain matched %+v", got)
	}
}

func TestOutOfOrderPiecesAttachLater(t *testing.T) {
	x := New(Options{})
	c := chainOf(3, 9)
	must(t, x.Insert("a", c[5], c[6:], GPU)) // the tail first
	must(t, x.Insert("a", c[2], c[3:6], GPU))
	if st := x.Stats(); st.OrphanBlocks != 6 {
		t.Fatalf("orphans %d, want 6", st.OrphanBlocks)
	}
	if got, _ := x.Match(c); len(got) != 0 {
		t.Fatalf("detached pieces matched: %+v", got)
	}
	must(t, x.Insert("a", Root, c[:3], GPU))
	st := x.Stats()
	if st.OrphanBlocks != 0 || st.Blocks != 9 {
		t.Fatalf("after attach: %+v", st)
	}
	got, _ := x.Match(c)
	if len(got) != 1 || got[0].Blocks != 9 {
		t.Fatalf("match after attach: %+v", got)
	}
	checkInvariants(t, x)
}

func TestOrphanLimitDropsOldestFirst(t *testing.T) {
	x := New(Options{MaxOrphanBlocks: 10})
	old, young := chainOf(4, 8), chainOf(5, 8)
	must(t, x.Insert("a", 0xdead, old, GPU))
	must(t, x.Insert("a", 0xbeef, young, GPU))
	st := x.Stats()
	if st.OrphanBlocks != 8 || st.DroppedOrphanBlocks != 8 {
		t.Fatalf("stats %+v", st)
	}
	ws, _ := x.Worker("a")
	if ws.Blocks != 8 {
		t.Fatalf("worker holds %d", ws.Blocks)
	}
	// The young piece is still there and attaches.
	must(t, x.Insert("a", Root, []uint64{0xbeef}, GPU))
	got, _ := x.Match(append([]uint64{0xbeef}, young...))
	if len(got) != 1 || got[0].Blocks != 9 {
		t.Fatalf("match %+v", got)
	}
	checkInvariants(t, x)
}

// TestOrphanLimitDropsSharedPieces drops detached pieces that several
// workers hold, with holder sets of their own that change in place.
func TestOrphanLimitDropsSharedPieces(t *testing.T) {
	x := New(Options{MaxOrphanBlocks: 40})
	for i := range 6 {
		piece := chainOf(uint64(40+i), 10)
		for w := range 3 + i {
			// Each worker holds a prefix of its own length: the tail
			// blocks have holder sets of their own.
			must(t, x.Insert(fmt.Sprintf("w%d-%d", i, w), uint64(0xd00+i), piece[:10-w], GPU))
		}
		checkInvariants(t, x)
	}
	st := x.Stats()
	if st.OrphanBlocks > 40 || st.DroppedOrphanBlocks == 0 || st.OrphanBlocks+st.DroppedOrphanBlocks != 60 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBadInput(t *testing.T) {
	x := New(Options{MaxChain: 8, MaxWorkers: 2})
	c := chainOf(6, 9)
	if err := x.Insert("a", Root, c, GPU); !errors.Is(err, ErrChainTooLong) {
		t.Fatalf("long insert: %v", err)
	}
	if _, err := x.Match(c); !errors.Is(err, ErrChainTooLong) {
		t.Fatalf("long match: %v", err)
	}
	if err := x.Remove("a", c, GPU); !errors.Is(err, ErrChainTooLong) {
		t.Fatalf("long remove: %v", err)
	}
	if err := x.Insert("a", Root, []uint64{1, 0}, GPU); !errors.Is(err, ErrZeroHash) {
		t.Fatalf("zero hash: %v", err)
	}
	if err := x.Insert("a", Root, c[:1], Medium(9)); !errors.Is(err, ErrBadMedium) {
		t.Fatalf("bad medium: %v", err)
	}
	if err := x.Insert("", Root, c[:1], GPU); !errors.Is(err, ErrBadWorker) {
		t.Fatalf("empty worker: %v", err)
	}
	must(t, x.Insert("a", Root, c[:2], GPU))
	must(t, x.Insert("b", Root, c[:2], GPU))
	if err := x.Insert("c", Root, c[:2], GPU); !errors.Is(err, ErrTooManyWorkers) {
		t.Fatalf("third worker: %v", err)
	}
	// Same block, different parent: refused, the prefix before it applied.
	if err := x.Insert("a", Root, []uint64{c[3], c[1]}, GPU); !errors.Is(err, ErrParentMismatch) {
		t.Fatalf("parent mismatch: %v", err)
	}
	if err := x.Insert("a", c[4], []uint64{c[4]}, GPU); !errors.Is(err, ErrParentMismatch) {
		t.Fatalf("self parent: %v", err)
	}
	// A detached piece waiting for a block that would hang under it.
	must(t, x.Insert("a", c[7], c[5:6], GPU))
	if err := x.Insert("a", c[5], c[7:8], GPU); !errors.Is(err, ErrParentMismatch) {
		t.Fatalf("cycle: %v", err)
	}
	// No-ops.
	must(t, x.Insert("a", Root, nil, GPU))
	must(t, x.Remove("zz", c[:2], GPU))
	must(t, x.Remove("a", chainOf(7, 3), AnyMedium))
	x.ClearWorker("zz")
	if m, err := x.Match(nil); err != nil || len(m) != 0 {
		t.Fatalf("empty match: %v %v", m, err)
	}
	d := x.Digest()
	must(t, x.Insert("a", Root, c[:2], GPU))
	if x.Digest() != d {
		t.Fatal("repeated insert changed the digest")
	}
	checkInvariants(t, x)
}

func TestClearWorkerFreesSlotAndBlocks(t *testing.T) {
	x := New(Options{})
	c := chainOf(8, 100)
	must(t, x.Insert("a", Root, c, GPU))
	must(t, x.Insert("b", Root, c[:50], GPU))
	x.ClearWorker("a")
	st := x.Stats()
	if st.Workers != 1 || st.Blocks != 50 || st.StoredBlocks != 50 || st.Entries != 50 {
		t.Fatalf("after clear: %+v", st)
	}
	x.ClearWorker("b")
	if st := x.Stats(); st.StoredBlocks != 0 || st.Segments != 0 || x.Digest() != 0 {
		t.Fatalf("after clearing all: %+v digest %x", st, x.Digest())
	}
	checkInvariants(t, x)
}

func TestManyWorkers(t *testing.T) {
	x := New(Options{})
	c := chainOf(9, 40)
	ref := newReference(&forest{parent: map[uint64]uint64{}})
	for i, h := range c {
		ref.f.parent[h] = Root
		if i > 0 {
			ref.f.parent[h] = c[i-1]
		}
		ref.f.nodes = append(ref.f.nodes, h)
	}
	for i := range 150 {
		w := "w" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		n := 1 + i%len(c)
		must(t, x.Insert(w, Root, c[:n], Medium(i%2)))
		ref.insert(w, c[:n], Medium(i%2))
	}
	// On each medium, the workers' prefixes end at every other block, so
	// the holders change every other block: 20 distinct sets per medium,
	// whatever the 150 workers.
	if st := x.Stats(); st.HolderSets != len(c) {
		t.Fatalf("%d holder sets, want %d", st.HolderSets, len(c))
	}
	checkAgainst(t, x, ref)
}

func TestWorkerChains(t *testing.T) {
	x := New(Options{})
	sys := chainOf(10, 5)
	s1, s2 := chainOf(11, 7), chainOf(12, 3)
	must(t, x.Insert("a", Root, sys, GPU))
	must(t, x.Insert("a", sys[4], s1, GPU))
	must(t, x.Insert("a", sys[2], s2, GPU))
	got := x.WorkerChains("a", 0)
	want := []Chain{{Tail: s1[6], Depth: 12}, {Tail: s2[2], Depth: 6}}
	if !slices.Equal(got, want) {
		t.Fatalf("chains %+v, want %+v", got, want)
	}
	must(t, x.Remove("a", s1[3:4], GPU))
	got = x.WorkerChains("a", 1)
	if !slices.Equal(got, []Chain{{Tail: s1[2], Depth: 8}}) {
		t.Fatalf("after a hole: %+v", got)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	for seq := range 50 {
		src := randSource{rand.New(rand.NewPCG(uint64(seq), 7))}
		f := newForest(src, 30+src.intn(60), 1+src.intn(4))
		x := New(Options{MaxOrphanBlocks: 1 << 30})
		ref := newReference(f)
		for range 200 {
			step(t, x, ref, src)
		}
		var buf bytes.Buffer
		n, err := x.WriteSnapshot(&buf)
		must(t, err)
		if n != int64(buf.Len()) {
			t.Fatalf("reported %d bytes, wrote %d", n, buf.Len())
		}
		// Followed by other data: a bufio.Reader is left just after it.
		buf.WriteString("next")
		br := bufio.NewReader(&buf)
		y, err := ReadSnapshot(br, Options{MaxOrphanBlocks: 1 << 30})
		must(t, err)
		if rest, _ := br.ReadString(0); rest != "next" {
			t.Fatalf("snapshot reader consumed %q too much", "next"[:4-len(rest)])
		}
		if x.Digest() != y.Digest() {
			t.Fatalf("digest %x after restore, %x before", y.Digest(), x.Digest())
		}
		sx, sy := x.Stats(), y.Stats()
		if sx.Blocks != sy.Blocks || sx.Entries != sy.Entries || sx.StoredBlocks != sy.StoredBlocks || sx.OrphanBlocks != sy.OrphanBlocks {
			t.Fatalf("stats %+v after restore, %+v before", sy, sx)
		}
		checkAgainst(t, y, ref)
		// Both go on identically.
		s1 := randSource{rand.New(rand.NewPCG(uint64(seq), 8))}
		s2 := randSource{rand.New(rand.NewPCG(uint64(seq), 8))}
		ref2 := newReference(f)
		for w, hm := range ref.held {
			for h, v := range hm {
				if ref2.held[w] == nil {
					ref2.held[w] = map[uint64]uint8{}
				}
				ref2.held[w][h] = v
			}
		}
		for range 100 {
			step(t, x, ref, s1)
			step(t, y, ref2, s2)
		}
		if x.Digest() != y.Digest() {
			t.Fatal("indexes diverged after restore")
		}
	}
}

func TestDigestIsOrderIndependent(t *testing.T) {
	c := chainOf(13, 30)
	a, b := New(Options{}), New(Options{})
	must(t, a.Insert("w1", Root, c[:20], GPU))
	must(t, a.Insert("w2", c[9], c[10:30], CPU))
	must(t, a.Insert("w2", Root, c[:10], CPU))
	// b gets the same content in another order and through other pieces.
	must(t, b.Insert("w2", Root, c, CPU))
	must(t, b.Insert("w1", c[4], c[5:20], GPU))
	must(t, b.Insert("w1", Root, c[:5], GPU))
	if a.Digest() != b.Digest() {
		t.Fatalf("same content, digests %x and %x", a.Digest(), b.Digest())
	}
	must(t, b.Remove("w1", c[19:20], GPU))
	if a.Digest() == b.Digest() {
		t.Fatal("different content, same digest")
	}
	must(t, b.Insert("w1", c[18], c[19:20], CPU))
	if a.Digest() == b.Digest() {
		t.Fatal("different medium, same digest")
	}
}

// smallSnapshot returns the snapshot of a small random index.
func smallSnapshot(t testing.TB) []byte {
	src := randSource{rand.New(rand.NewPCG(1, 2))}
	f := newForest(src, 40, 2)
	x := New(Options{})
	ref := newReference(f)
	for range 120 {
		step(t, x, ref, src)
	}
	var buf bytes.Buffer
	_, err := x.WriteSnapshot(&buf)
	must(t, err)
	return buf.Bytes()
}

func TestSnapshotRejectsCorruption(t *testing.T) {
	snap := smallSnapshot(t)
	if _, err := ReadSnapshot(bytes.NewReader(snap), Options{}); err != nil {
		t.Fatalf("intact snapshot: %v", err)
	}
	for n := range len(snap) {
		if _, err := ReadSnapshot(bytes.NewReader(snap[:n]), Options{}); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	for i := range snap {
		bad := slices.Clone(snap)
		bad[i] ^= 0x10
		if _, err := ReadSnapshot(bytes.NewReader(bad), Options{}); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
}

// withChecksum recomputes a damaged snapshot's trailer, so that fuzzing
// reaches the structural checks behind the checksum.
func withChecksum(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	out := slices.Clone(b)
	crc := crcOf(out[:len(out)-4])
	out[len(out)-4], out[len(out)-3], out[len(out)-2], out[len(out)-1] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	return out
}

func FuzzSnapshotReader(f *testing.F) {
	f.Add(smallSnapshot(f))
	f.Add([]byte(snapshotMagic))
	if b, err := os.ReadFile(v1SnapshotFile); err == nil {
		f.Add(b) // the version 1 reader too
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, in := range [][]byte{data, withChecksum(data)} {
			x, err := ReadSnapshot(bytes.NewReader(in), Options{MaxWorkers: 256})
			if err != nil {
				if !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("error not marked corrupt: %v", err)
				}
				continue
			}
			checkInvariants(t, x)
			var buf bytes.Buffer
			_, err = x.WriteSnapshot(&buf)
			must(t, err)
			y, err := ReadSnapshot(&buf, Options{MaxWorkers: 256})
			must(t, err)
			if x.Digest() != y.Digest() {
				t.Fatal("accepted snapshot does not round-trip")
			}
		}
	})
}

func TestConcurrentReadersDuringWrites(t *testing.T) {
	x := New(Options{})
	sys := chainOf(20, 64)
	must(t, x.Insert("base", Root, sys, GPU))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chain := append(slices.Clone(sys), chainOf(uint64(30+r), 500)...)
			var dst []WorkerMatch
			for {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				dst, err = x.MatchInto(dst, chain)
				if err != nil || len(dst) == 0 || dst[len(dst)-1].Blocks < len(sys) || dst[0].Blocks > len(chain) {
					t.Errorf("match during writes: %+v %v", dst, err)
					return
				}
				_ = x.Stats()
			}
		}()
	}
	for i := range 300 {
		w := testWorkers[i%len(testWorkers)]
		c := chainOf(uint64(30+i%2), 500)
		must(t, x.Insert(w, Root, sys, GPU))
		must(t, x.Insert(w, sys[63], c, GPU))
		if i%3 == 0 {
			must(t, x.Remove(w, c[100:], GPU))
		}
		if i%7 == 0 {
			x.ClearWorker(w)
		}
		if i%50 == 0 {
			_, err := x.WriteSnapshot(&bytes.Buffer{})
			must(t, err)
		}
	}
	close(stop)
	wg.Wait()
	checkInvariants(t, x)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func TestChainTo(t *testing.T) {
	x := New(Options{MaxChain: 20})
	sys, s1 := chainOf(40, 5), chainOf(41, 6)
	must(t, x.Insert("a", Root, sys, GPU))
	must(t, x.Insert("a", sys[2], s1, GPU))
	got, ok := x.ChainTo(s1[5])
	want := append(slices.Clone(sys[:3]), s1...)
	if !ok || !slices.Equal(got, want) {
		t.Fatalf("ChainTo = %x %v, want %x", got, ok, want)
	}
	if _, ok := x.ChainTo(0x1234); ok {
		t.Fatal("unknown tail found")
	}
	must(t, x.Insert("a", 0x99, chainOf(42, 2), GPU))
	if _, ok := x.ChainTo(chainOf(42, 2)[1]); ok {
		t.Fatal("detached tail found")
	}
	long := chainOf(43, 20)
	must(t, x.Insert("b", Root, long[:10], GPU))
	must(t, x.Insert("b", long[9], long[10:], GPU))
	if _, ok := x.ChainTo(long[19]); !ok {
		t.Fatal("20-block chain not found")
	}
	must(t, x.Insert("b", long[19], chainOf(44, 1), GPU))
	if _, ok := x.ChainTo(chainOf(44, 1)[0]); ok {
		t.Fatal("chain over MaxChain returned")
	}
}
