package raftfsm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// streamFSM applies a random stream to a new FSM and returns both.
func streamFSM(t testing.TB, seed uint64, n int) (*raftfsm.FSM, *streamGen, []genCmd) {
	g := newStreamGen(t, seed, 5, 2)
	cmds := g.stream(n)
	f := newQuietFSM(t, streamOptions())
	for _, c := range cmds {
		checkResult(t, c, f.Apply(cmdLog(c.idx, c.data)))
	}
	return f, g, cmds
}

func TestSnapshotRoundTrip(t *testing.T) {
	for seed := range uint64(3) {
		g := newStreamGen(t, 100+seed, 5, 2)
		cmds := g.stream(1200)
		cut := 400 + int(seed)*300
		a := newQuietFSM(t, streamOptions())
		for _, c := range cmds[:cut] {
			a.Apply(cmdLog(c.idx, c.data))
		}
		data := snapshotBytes(t, a)

		var calls []changeCall
		opts := streamOptions()
		opts.OnWorkersChanged = func(ids []string, index uint64) { calls = append(calls, changeCall{ids, index}) }
		b := newQuietFSM(t, opts)
		if err := restore(b, data); err != nil {
			t.Fatalf("seed %d: Restore: %v", seed, err)
		}
		if len(calls) != 1 || calls[0].ids != nil || calls[0].index != cmds[cut-1].idx {
			t.Fatalf("OnWorkersChanged after restore: %v, want one call (nil, %d)", calls, cmds[cut-1].idx)
		}
		equalFSMs(t, a, b, g.chains, g.ids)

		// The restored FSM goes on exactly like the original.
		for _, c := range cmds[cut:] {
			ra := a.Apply(cmdLog(c.idx, c.data))
			rb := b.Apply(cmdLog(c.idx, c.data))
			checkResult(t, c, ra)
			if !sameResult(ra, rb) {
				t.Fatalf("index %d: original %v, restored %v", c.idx, ra, rb)
			}
		}
		g.checkModel(t, b)
		equalFSMs(t, a, b, g.chains, g.ids)

		// WriteState writes the bytes Persist does.
		var buf bytes.Buffer
		if err := a.WriteState(&buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), snapshotBytes(t, a)) {
			t.Fatalf("WriteState and Persist wrote different bytes")
		}
		// WriteStateAt names the applied index before the first byte, and
		// writes the same bytes.
		var at bytes.Buffer
		named := uint64(0)
		err := a.WriteStateAt(&at, func(i uint64) {
			if at.Len() != 0 {
				t.Errorf("index named after %d bytes were written", at.Len())
			}
			named = i
		})
		if err != nil || named != a.AppliedIndex() || !bytes.Equal(at.Bytes(), buf.Bytes()) {
			t.Fatalf("WriteStateAt: %v, index %d (applied %d), same bytes %v", err, named, a.AppliedIndex(), bytes.Equal(at.Bytes(), buf.Bytes()))
		}
	}
}

func TestSnapshotIsPointInTime(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	h.record(5, sess("s", "w", 2))
	digest, applied := h.f.Digest(), h.f.AppliedIndex()
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Commands applied between Snapshot and Persist are not in it.
	h.publish1(batch("w", 1, 2, 2, stored(2, gpu, 3)), stApplied)
	h.register("x")
	h.record(6, sess("t", "x", 3))
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	f := newQuietFSM(t, raftfsm.Options{})
	if err := restore(f, sink.buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	if f.Digest() != digest || f.AppliedIndex() != applied {
		t.Fatalf("restored digest %x applied %d, want %x %d", f.Digest(), f.AppliedIndex(), digest, applied)
	}
	if _, ok := f.Worker("x"); ok {
		t.Fatalf("worker registered after Snapshot is in the snapshot")
	}
}

func TestPersistWriteErrorCancels(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	sink := &memSink{failWrite: boom}
	if err := snap.Persist(sink); !errors.Is(err, boom) {
		t.Fatalf("Persist: %v, want %v", err, boom)
	}
	if !sink.cancelled || sink.closed {
		t.Fatalf("failed Persist: cancelled %v closed %v, want cancelled and not closed", sink.cancelled, sink.closed)
	}
}

func TestRestoreReplacesState(t *testing.T) {
	empty := snapshotBytes(t, newQuietFSM(t, raftfsm.Options{}))
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.record(5, sess("s", "w", 1))
	h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n", ApiAddress: "a"})
	if err := restore(h.f, empty); err != nil {
		t.Fatal(err)
	}
	if h.f.AppliedIndex() != 0 || len(h.f.Workers("", true)) != 0 || len(h.f.Members()) != 0 ||
		h.f.Counters().Sessions != 0 || len(match(t, h.f, 1)) != 0 {
		t.Fatalf("state left over after restoring an empty snapshot")
	}
	if h.f.Digest() != newQuietFSM(t, raftfsm.Options{}).Digest() {
		t.Fatalf("digest after restoring an empty snapshot differs from a new FSM's")
	}
}

type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

func TestRestoreClosesReader(t *testing.T) {
	f := newQuietFSM(t, raftfsm.Options{})
	for _, data := range [][]byte{snapshotBytes(t, f), []byte("junk")} {
		rc := &closeTracker{Reader: bytes.NewReader(data)}
		_ = f.Restore(rc)
		if !rc.closed {
			t.Fatalf("Restore did not close its reader")
		}
	}
}

// smallState is a state with at least one record of each kind.
func smallState(t testing.TB) *harness {
	h := newHarness(t, raftfsm.Options{})
	h.register("w1")
	h.register("w2")
	h.publish1(batch("w1", 1, 1, 1, layoutEv(testLayout()), stored(0, gpu, 1, 2, 3), stored(9, cpu, 10)), stApplied)
	h.publish1(batch("w2", 1, 1, 1, stored(0, disk, 1, 2)), stApplied)
	h.record(5, sess("s1", "w1", 3), sess("s2", "w2", 2))
	h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n1", ApiAddress: "10.0.0.1:7000"})
	return h
}

// checkRefused restores bad into a populated FSM and checks that it is
// refused and changes nothing.
func checkRefused(t *testing.T, what string, bad []byte) {
	t.Helper()
	h := smallState(t)
	digest, applied := h.f.Digest(), h.f.AppliedIndex()
	h.changes = nil
	err := restore(h.f, bad)
	if err == nil {
		t.Fatalf("%s: Restore accepted a corrupt snapshot", what)
	}
	if !errors.Is(err, raftfsm.ErrCorruptState) {
		t.Fatalf("%s: Restore error %v does not wrap ErrCorruptState", what, err)
	}
	if h.f.Digest() != digest || h.f.AppliedIndex() != applied || len(h.changes) != 0 {
		t.Fatalf("%s: refused restore changed the state", what)
	}
}

func TestRestoreCorrupt(t *testing.T) {
	good := snapshotBytes(t, smallState(t).f)
	// The good one restores.
	f := newQuietFSM(t, raftfsm.Options{})
	if err := restore(f, good); err != nil {
		t.Fatalf("good snapshot: %v", err)
	}
	if f.Digest() != smallState(t).f.Digest() {
		t.Fatalf("good snapshot restored to a different state")
	}

	t.Run("truncated", func(t *testing.T) {
		for n := range len(good) {
			checkRefused(t, "truncated at "+strconv.Itoa(n), good[:n])
		}
	})
	t.Run("flipped byte", func(t *testing.T) {
		for i := range good {
			for _, mask := range []byte{0x01, 0x80, 0xff} {
				bad := bytes.Clone(good)
				bad[i] ^= mask
				checkRefused(t, "byte "+strconv.Itoa(i)+" ^ "+strconv.Itoa(int(mask)), bad)
			}
		}
	})
	t.Run("other", func(t *testing.T) {
		checkRefused(t, "empty", nil)
		checkRefused(t, "text", []byte(strings.Repeat("KVDIRFSM", 10)))
		v3 := bytes.Clone(good)
		v3[8] = 3
		checkRefused(t, "version 3", v3)
		v0 := bytes.Clone(good)
		v0[8] = 0
		checkRefused(t, "version 0", v0)
	})
}

// Corruption of a large state's snapshot at spread-out points.
func TestRestoreCorruptLarge(t *testing.T) {
	a, _, _ := streamFSM(t, 7, 1500)
	good := snapshotBytes(t, a)
	n := len(good)
	for _, cut := range []int{0, 7, 12, 13, n / 5, n / 3, n / 2, 2 * n / 3, n - 14, n - 13, n - 12, n - 1} {
		checkRefused(t, "truncated at "+strconv.Itoa(cut), good[:cut])
	}
	for i := 0; i < n; i += 1 + n/97 {
		bad := bytes.Clone(good)
		bad[i] ^= 0x5a
		checkRefused(t, "byte "+strconv.Itoa(i), bad)
	}
}

// Each record's tag byte decides how the record is read; the checksum
// covers only the protobuf, so a tag changed from one known record kind to
// another must still be detected.
func TestRestoreSwappedRecordTag(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w1")
	good := snapshotBytes(t, h.f)
	if good[12] != 'W' {
		t.Fatalf("first record tag %q, want 'W'", good[12])
	}
	for _, tag := range []byte{'M', 'S'} {
		bad := bytes.Clone(good)
		bad[12] = tag
		checkRefused(t, "W record tagged "+string(tag), bad)
	}
}

// A worker spec has no bound on its labels, so registration accepts a
// worker record larger than the snapshot reader's record limit: the state
// then writes snapshots that cannot be restored.
func TestSnapshotLargeWorkerRecord(t *testing.T) {
	// A spec over the limits is refused at registration...
	h := newHarness(t, raftfsm.Options{})
	labels := map[string]string{}
	for i := range 20 {
		labels["label-"+strconv.Itoa(i)] = strings.Repeat("v", 60_000)
	}
	res := h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, Labels: labels}})
	if err, ok := res.(error); !ok || !errors.Is(err, raftfsm.ErrInvalid) {
		t.Fatalf("a 1.2 MB worker spec: %v, want ErrInvalid", res)
	}
	// ...and the largest accepted one snapshots and restores.
	labels = map[string]string{}
	for i := range 64 {
		labels[strings.Repeat("k", 250)+strconv.Itoa(i)] = strings.Repeat("v", 256)
	}
	res = h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{
		Id: strings.Repeat("w", 256), BlockSize: 16, Labels: labels,
		Address: strings.Repeat("a", 2048), Model: strings.Repeat("m", 1024),
	}})
	if _, ok := res.(*raftfsm.RegisterResult); !ok {
		t.Fatalf("largest valid spec refused: %v", res)
	}
	f := newQuietFSM(t, raftfsm.Options{})
	if err := restore(f, snapshotBytes(t, h.f)); err != nil {
		t.Fatalf("snapshot with the largest valid worker spec does not restore: %v", err)
	}
	if f.Digest() != h.f.Digest() {
		t.Fatalf("restored digest differs")
	}
}

// TestSnapshotKeepsGoneIndex checks that a snapshot carries when each gone
// worker went gone, so that a restored replica prunes the records the
// original does, and that recording it needs no new snapshot version.
func TestSnapshotKeepsGoneIndex(t *testing.T) {
	opts := raftfsm.Options{MaxGoneWorkers: 2}
	h := newHarness(t, opts)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.register(id) // indexes 1 to 4
	}
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "d", Epoch: 1}) // index 5
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "a", Epoch: 1})
	data := snapshotBytes(t, h.f)
	// Nothing pruned yet: still version 1, which older builds read (they
	// skip the gone index).
	if v := binary.LittleEndian.Uint32(data[8:12]); v != 1 {
		t.Fatalf("snapshot version %d before any prune, want 1", v)
	}
	g := newQuietFSM(t, opts)
	if err := restore(g, data); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]uint64{"a": 6, "d": 5, "b": 0} {
		if w := mustWorker(t, g, id); w.GoneIndex != want {
			t.Fatalf("restored %s: gone index %d, want %d", id, w.GoneIndex, want)
		}
	}
	if g.Digest() != h.f.Digest() {
		t.Fatalf("restored digest %x, original %x", g.Digest(), h.f.Digest())
	}
	// Both go on alike: gone d(5) a(6) b(7) -> d goes on both, not a (the
	// earliest registration).
	cmd := h.data(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "b", Epoch: 1})
	h.applyData(cmd)
	g.Apply(cmdLog(h.idx, cmd))
	for _, f := range []*raftfsm.FSM{h.f, g} {
		if _, ok := f.Worker("d"); ok {
			t.Fatalf("d, gone earliest, still known")
		}
		if _, ok := f.Worker("a"); !ok {
			t.Fatalf("a, gone after d, pruned")
		}
	}
	if g.Digest() != h.f.Digest() {
		t.Fatalf("after a prune: restored digest %x, original %x", g.Digest(), h.f.Digest())
	}
	// The prune raised the epoch floor: version 2 from now on, as before.
	if v := binary.LittleEndian.Uint32(snapshotBytes(t, g)[8:12]); v != 2 {
		t.Fatalf("snapshot version %d after a prune, want 2", v)
	}
}

// TestRestoreWithoutGoneIndex restores a snapshot whose gone records carry
// no gone index, as builds that did not record it wrote them: those
// records are pruned in registration order, before any worker retired
// after the restore.
func TestRestoreWithoutGoneIndex(t *testing.T) {
	opts := raftfsm.Options{MaxGoneWorkers: 3}
	h := newHarness(t, opts)
	for _, id := range []string{"b", "a", "c", "d", "e"} {
		h.register(id) // indexes 1 to 5: b registered before a
	}
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "a", Epoch: 1})     // index 6
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "b", Epoch: 1}) // index 7
	old := withoutGoneIndex(t, snapshotBytes(t, h.f))
	g := newQuietFSM(t, opts)
	if err := restore(g, old); err != nil {
		t.Fatal(err)
	}
	if w := mustWorker(t, g, "b"); w.GoneIndex != 0 || w.State != wsExpired {
		t.Fatalf("b from the old snapshot: gone index %d state %v", w.GoneIndex, w.State)
	}
	apply := func(typ kvdirv1.CommandType, payload proto.Message) {
		t.Helper()
		h.idx++
		if res := g.Apply(cmdLog(h.idx, h.data(typ, payload))); res != nil {
			t.Fatalf("index %d: %v", h.idx, res)
		}
	}
	known := func(want ...string) {
		t.Helper()
		var got []string
		for _, w := range g.Workers("", true) {
			got = append(got, w.Spec.Id)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("known workers %v, want %v", got, want)
		}
	}
	apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "c", Epoch: 1}) // index 8
	known("a", "b", "c", "d", "e")
	// Gone: b(registered 1) a(registered 2) c(8) d(9): b, the older
	// registration of the two unrecorded ones, goes, not a (first by id;
	// the lost indexes had a gone first, but among such records the
	// registration order is the best left).
	apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "d", Epoch: 1})
	known("a", "c", "d", "e")
	// Gone: a(registered 2) c(8) d(9) e(10): a goes before the workers
	// retired since the restore, though they were all registered after it.
	apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "e", Epoch: 1})
	known("c", "d", "e")
}

// withoutGoneIndex rewrites a state snapshot's worker records without
// their gone index, as a build that did not record it would have written
// them; the other records are copied as they are.
func withoutGoneIndex(t *testing.T, data []byte) []byte {
	t.Helper()
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	out := slices.Clone(data[:12])
	rest := data[12:]
	for len(rest) > 0 && (rest[0] == 'W' || rest[0] == 'M' || rest[0] == 'S') {
		tag := rest[0]
		n, k := binary.Uvarint(rest[1:])
		if k <= 0 {
			t.Fatalf("bad record length")
		}
		body := rest[1+k : 1+k+int(n)]
		next := rest[1+k+int(n)+4:]
		if tag == 'W' {
			w := new(kvdirv1.Worker)
			if err := proto.Unmarshal(body, w); err != nil {
				t.Fatal(err)
			}
			w.GoneIndex = 0
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(w)
			if err != nil {
				t.Fatal(err)
			}
			body = b
		}
		out = append(out, tag)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
		out = binary.LittleEndian.AppendUint32(out, crc32.Update(crc32.Checksum([]byte{tag}, castagnoli), castagnoli, body))
		rest = next
	}
	return append(out, rest...)
}
