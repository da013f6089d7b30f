package radix

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// v1SnapshotFile is a snapshot in format version 1 (one bitmask of W 64-bit
// words per block and medium), written by the build that still wrote that
// format from the contents legacyContent builds. Set
// KVDIR_WRITE_V1_SNAPSHOT=1 to rewrite it, which only a build writing
// version 1 can do.
var v1SnapshotFile = filepath.Join("testdata", "snapshot-v1.bin")

// legacyContent builds, deterministically, an index of 70 workers (two mask
// words in version 1) with every medium in use, a freed worker slot, unheld
// blocks inside runs and a detached piece, and the reference model of it.
func legacyContent(t testing.TB) (*Index, *reference) {
	src := randSource{rand.New(rand.NewPCG(17, 71))}
	f := newForest(src, 120, 3)
	x := New(Options{MaxOrphanBlocks: 1 << 30})
	ref := newReference(f)
	name := func(i int) string { return fmt.Sprintf("legacy-%02d", i) }
	for i := range 70 {
		for range 1 + src.intn(3) {
			p := f.path(f.nodes[src.intn(len(f.nodes))])
			n := 1 + src.intn(len(p))
			m := Medium(src.intn(NumMedia))
			must(t, x.Insert(name(i), Root, p[:n], m))
			ref.insert(name(i), p[:n], m)
		}
	}
	for i := 0; i < 70; i += 3 {
		p := f.path(f.nodes[src.intn(len(f.nodes))])
		hs := p[src.intn(len(p)):]
		must(t, x.Remove(name(i), hs, AnyMedium))
		ref.remove(name(i), hs, AnyMedium)
	}
	x.ClearWorker(name(5))
	delete(ref.held, name(5))
	// A piece whose parent is unknown stays detached.
	must(t, x.Insert(name(7), 0xfeedface, []uint64{0xabc1, 0xabc2}, Disk))
	f.parent[0xabc1], f.parent[0xabc2] = 0xfeedface, 0xabc1
	ref.insert(name(7), []uint64{0xabc1, 0xabc2}, Disk)
	return x, ref
}

func TestWriteV1Testdata(t *testing.T) {
	if os.Getenv("KVDIR_WRITE_V1_SNAPSHOT") != "1" {
		t.Skip("set KVDIR_WRITE_V1_SNAPSHOT=1 to rewrite " + v1SnapshotFile)
	}
	x, _ := legacyContent(t)
	var buf bytes.Buffer
	_, err := x.WriteSnapshot(&buf)
	must(t, err)
	if v := buf.Bytes()[8]; v != 1 {
		t.Fatalf("this build writes version %d, not 1", v)
	}
	must(t, os.WriteFile(v1SnapshotFile, buf.Bytes(), 0o644))
}

// TestReadV1Snapshot restores the committed version 1 snapshot and checks it
// against the contents it was written from: same digest (the digest is
// defined over logical entries, not the format), same counters, same matches.
func TestReadV1Snapshot(t *testing.T) {
	b, err := os.ReadFile(v1SnapshotFile)
	must(t, err)
	if v := b[8]; v != 1 {
		t.Fatalf("%s holds version %d", v1SnapshotFile, v)
	}
	y, err := ReadSnapshot(bytes.NewReader(b), Options{MaxOrphanBlocks: 1 << 30})
	must(t, err)
	x, ref := legacyContent(t)
	if x.Digest() != y.Digest() {
		t.Fatalf("digest %016x restored, %016x built", y.Digest(), x.Digest())
	}
	sx, sy := x.Stats(), y.Stats()
	if sx.Blocks != sy.Blocks || sx.Entries != sy.Entries || sx.StoredBlocks != sy.StoredBlocks ||
		sx.OrphanBlocks != sy.OrphanBlocks || sx.Workers != sy.Workers {
		t.Fatalf("stats %+v restored, %+v built", sy, sx)
	}
	checkAgainst(t, y, ref)
	// The restored index goes on like the built one.
	c := ref.f.path(ref.f.nodes[len(ref.f.nodes)-1])
	for _, z := range []*Index{x, y} {
		must(t, z.Insert("legacy-new", Root, c, CPU))
		must(t, z.Insert("legacy-00", Root, c[:1], Remote))
	}
	if x.Digest() != y.Digest() {
		t.Fatal("restored index diverged from the built one")
	}
}

// TestSnapshotRejectsBadHolderSets corrupts a version 2 snapshot's holder
// set records, with the checksum recomputed, so that only the structural
// checks can refuse it.
func TestSnapshotRejectsBadHolderSets(t *testing.T) {
	x := New(Options{})
	c := chainOf(70, 6)
	must(t, x.Insert("a", Root, c, GPU))
	must(t, x.Insert("b", Root, c[:3], GPU))
	var buf bytes.Buffer
	_, err := x.WriteSnapshot(&buf)
	must(t, err)
	good := buf.Bytes()
	// Header (24 bytes), then the workers' records: 'W', u32 slot, name
	// length, name.
	h := 24 + 2*(1+4+1+1)
	if good[h] != 'H' || good[h+1] == 0 {
		t.Fatalf("no holder set record at %d: %q", h, good[h:h+4])
	}
	for name, corrupt := range map[string]func(b []byte){
		"unknown slot":         func(b []byte) { b[h+2] = 9 },
		"more sets announced":  func(b []byte) { b[12]++ },
		"fewer sets announced": func(b []byte) { b[12]-- },
		"empty set":            func(b []byte) { b[h+1] = 0 },
	} {
		b := bytes.Clone(good)
		corrupt(b)
		if _, err := ReadSnapshot(bytes.NewReader(withChecksum(b)), Options{}); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ReadSnapshot(bytes.NewReader(withChecksum(good)), Options{}); err != nil {
		t.Fatalf("the uncorrupted snapshot: %v", err)
	}
}
