package raftfsm_test

import (
	"bytes"
	"errors"
	"runtime/debug"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func FuzzDecode(f *testing.F) {
	for _, p := range []struct {
		typ kvdirv1.CommandType
		msg proto.Message
	}{
		{tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, Labels: map[string]string{"k": "v"}}}},
		{tPublish, &kvdirv1.PublishCommand{Batches: []*kvdirv1.EventBatch{batch("w", 1, 1, 2, stored(0, cpu, 1, 2), removed(gpu, true, 3), cleared())}}},
		{tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "w", Epoch: 1, Load: &kvdirv1.Load{KvUsage: 0.5}}}}},
		{tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "w", Epoch: 1}},
		{tRecordSessions, &kvdirv1.RecordSessionsCommand{Sessions: []*kvdirv1.SessionRecord{sess("s", "w", 1)}}},
		{tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n", ApiAddress: "a"}},
	} {
		f.Add(encode(f, p.typ, p.msg, 12345))
	}
	for _, b := range undecodable(f) {
		f.Add(b)
	}
	f.Add(envelope(f, &kvdirv1.Command{Version: 1, Type: 77, Ignorable: true, Payload: []byte{9}}))

	known := map[kvdirv1.CommandType]bool{}
	for _, typ := range []kvdirv1.CommandType{tRegister, tPublish, tLoads, tExpireWorker, tDeregister, tDrain, tRecordSessions, tExpireSessions, tMemberAPI} {
		known[typ] = true
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer failOnPanic(t)
		d, err := raftfsm.Decode(data)
		if err != nil {
			if !errors.Is(err, raftfsm.ErrUndecodable) {
				t.Fatalf("Decode error %v does not wrap ErrUndecodable", err)
			}
			return
		}
		if d.Payload == nil {
			if known[d.Type] {
				t.Fatalf("known type %v decoded without a payload", d.Type)
			}
			return // an ignorable command of an unknown type
		}
		if !known[d.Type] {
			t.Fatalf("unknown type %v decoded with a payload", d.Type)
		}
		b, err := raftfsm.Encode(d.Type, d.Payload, d.TimeUnixNano)
		if err != nil {
			t.Fatalf("re-encoding a decoded %v: %v", d.Type, err)
		}
		d2, err := raftfsm.Decode(b)
		if err != nil {
			t.Fatalf("decoding a re-encoded %v: %v", d.Type, err)
		}
		if d2.Type != d.Type || d2.TimeUnixNano != d.TimeUnixNano || !proto.Equal(d2.Payload, d.Payload) {
			t.Fatalf("round trip changed the command: %v %d %v -> %v %d %v",
				d.Type, d.TimeUnixNano, d.Payload, d2.Type, d2.TimeUnixNano, d2.Payload)
		}
	})
}

// fuzzBytes hands out the fuzz input a byte at a time, then zeros.
type fuzzBytes struct{ b []byte }

func (z *fuzzBytes) next() int {
	if len(z.b) == 0 {
		return 0
	}
	c := z.b[0]
	z.b = z.b[1:]
	return int(c)
}

func (z *fuzzBytes) done() bool { return len(z.b) == 0 }

func fuzzOptions() raftfsm.Options {
	return raftfsm.Options{
		Index:          radix.Options{MaxWorkers: 2, MaxChain: 4, MaxOrphanBlocks: 4},
		MaxGoneWorkers: 1,
		MaxSessions:    3,
		MaxBatchEvents: 3,
		MaxBatchBlocks: 6,
	}
}

// fuzzCommands turns fuzz input into validly encoded commands over a small
// universe of workers and hashes, grouped for ApplyBatch. It also returns
// every piece stored, to match on.
func fuzzCommands(t testing.TB, data []byte) (groups [][]*raft.Log, pieces [][]uint64) {
	z := &fuzzBytes{b: data}
	workers := []string{"a", "b", "c"}
	worker := func() string { return workers[z.next()%len(workers)] }
	hashes := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(z.next() % 9) // 0 is refused; 1..8 collide and cycle
		}
		return out
	}
	var idx uint64
	now := int64(1_000_000_000_000)
	var group []*raft.Log
	for n := 0; !z.done() && n < 256; n++ {
		now += int64(z.next()%3-1) * 1_000_000_000
		var typ kvdirv1.CommandType
		var p proto.Message
		switch z.next() % 10 {
		case 0:
			typ = tRegister
			spec := &kvdirv1.WorkerSpec{Id: worker(), BlockSize: uint32(z.next() % 3), Model: []string{"m1", "m2"}[z.next()%2]}
			if r := z.next() % 3; r > 0 {
				rank := uint32(r-1) * 200 // 0, or 200: within the bound
				spec.DataParallelRank = &rank
			}
			p = &kvdirv1.RegisterCommand{Worker: spec}
		case 1, 2:
			typ = tPublish
			pc := &kvdirv1.PublishCommand{}
			for range 1 + z.next()%2 {
				first := uint64(z.next() % 4)
				b := &kvdirv1.EventBatch{WorkerId: worker(), Epoch: uint64(z.next() % 3), FirstSeq: first, LastSeq: first + uint64(z.next()%3) - 1}
				for range z.next() % 4 {
					switch z.next() % 4 {
					case 0:
						parent := uint64(z.next() % 9)
						hs := hashes(z.next() % 5)
						b.Events = append(b.Events, stored(parent, kvdirv1.Medium(z.next()%6), hs...))
						pieces = append(pieces, hs)
					case 1:
						m := kvdirv1.Medium(z.next() % 6)
						all := z.next()%2 == 0
						b.Events = append(b.Events, removed(m, all, hashes(z.next()%5)...))
					case 2:
						// A layout: sizes may be unordered, repeated or 0 (refused).
						l := &kvdirv1.WorkerLayout{}
						for range z.next() % 3 {
							l.BlockSizes = append(l.BlockSizes, uint32(z.next()%3)*16)
						}
						for i := range z.next() % 3 {
							l.Groups = append(l.Groups, &kvdirv1.KVGroup{Index: uint32(i), Kind: []string{"full_attention", "sliding_window", ""}[z.next()%3],
								BlockSize: uint32(z.next()%3) * 16, Indexed: z.next()%2 == 0})
						}
						b.Events = append(b.Events, &kvdirv1.Event{Kind: &kvdirv1.Event_Layout{Layout: l}})
					default:
						b.Events = append(b.Events, cleared())
					}
				}
				pc.Batches = append(pc.Batches, b)
			}
			p = pc
		case 3:
			typ = tLoads
			p = &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: worker(), Epoch: uint64(z.next() % 3), Load: &kvdirv1.Load{Running: uint32(z.next())}}}}
		case 4:
			typ = tExpireWorker
			p = &kvdirv1.ExpireWorkerCommand{WorkerId: worker(), Epoch: uint64(z.next() % 3)}
		case 5:
			typ = tDeregister
			p = &kvdirv1.DeregisterCommand{WorkerId: worker(), Epoch: uint64(z.next() % 3)}
		case 6:
			typ = tDrain
			p = &kvdirv1.DrainCommand{WorkerId: worker()}
		case 7:
			typ = tRecordSessions
			rc := &kvdirv1.RecordSessionsCommand{}
			for range 1 + z.next()%2 {
				id := []string{"", "s1", "s2", "s3", "s4", "t1"}[z.next()%6]
				rec := &kvdirv1.SessionRecord{SessionId: id, Tail: uint64(z.next() % 9), WorkerId: worker(),
					PromptTokens: uint32(z.next()%4) * 16, CachedTokens: uint32(z.next()%4) * 16, BlockSize: 16}
				if z.next()%2 == 0 {
					pred := uint32(z.next()%4) * 16
					rec.PredictedCachedTokens = &pred
				}
				rc.Sessions = append(rc.Sessions, rec)
			}
			p = rc
		case 8:
			typ = tExpireSessions
			p = &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: now - int64(z.next()%4)*1_000_000_000}
		default:
			if z.next()%2 == 0 {
				typ = tMemberAPI
				p = &kvdirv1.MemberAPICommand{Id: []string{"", "n1", "n2"}[z.next()%3], ApiAddress: "x"}
			} else {
				idx++
				group = append(group, cmdLog(idx, envelope(t, &kvdirv1.Command{Version: 1, Type: 500, Ignorable: true, TimeUnixNano: now})))
				continue
			}
		}
		idx++
		group = append(group, cmdLog(idx, encode(t, typ, p, now)))
		if z.next()%4 == 0 {
			groups = append(groups, group)
			group = nil
		}
	}
	if len(group) > 0 {
		groups = append(groups, group)
	}
	return groups, pieces
}

// checkInvariants checks what must hold after any command.
func checkInvariants(t testing.TB, f *raftfsm.FSM, maxWorkers int) {
	t.Helper()
	alive := 0
	for _, w := range f.Workers("", true) {
		switch w.State {
		case wsActive, wsDraining:
			alive++
		default:
			if w.Blocks != 0 || w.Load != nil {
				t.Fatalf("gone worker %s holds %d blocks, load %v", w.Spec.Id, w.Blocks, w.Load)
			}
		}
	}
	if alive > maxWorkers {
		t.Fatalf("%d live workers, MaxWorkers %d", alive, maxWorkers)
	}
	if c := f.Counters(); c.Workers > alive {
		t.Fatalf("index holds blocks of %d workers, only %d alive", c.Workers, alive)
	}
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 3, 1, 2, 3, 0, 1})
	f.Add([]byte("register a then publish a chain of blocks and record a session on it, then expire"))
	f.Add(bytes.Repeat([]byte{1, 0, 1, 1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 4}, 8))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer failOnPanic(t)
		fuzzApply(t, data)
	})
}

// fuzzApply is FuzzApply's body.
func fuzzApply(t *testing.T, data []byte) {
	groups, pieces := fuzzCommands(t, data)
	var fatals []error
	opts := fuzzOptions()
	opts.Logger = discardLogger
	opts.Fatal = func(err error) { fatals = append(fatals, err) }
	a, b := raftfsm.New(opts), raftfsm.New(opts)
	for _, g := range groups {
		ra := make([]any, len(g))
		for i, l := range g {
			ra[i] = a.Apply(l)
			checkInvariants(t, a, 2)
		}
		rb := b.ApplyBatch(g)
		if len(fatals) > 0 {
			t.Fatalf("Fatal called for validly encoded commands: %v", fatals)
		}
		for i := range g {
			if !sameResult(ra[i], rb[i]) {
				t.Fatalf("index %d: Apply gave %v, ApplyBatch %v", g[i].Index, ra[i], rb[i])
			}
		}
		if a.Digest() != b.Digest() || a.IndexDigest() != b.IndexDigest() {
			t.Fatalf("digests differ after index %d", g[len(g)-1].Index)
		}
	}
	// The end state survives a snapshot round trip.
	c := raftfsm.New(opts)
	if err := restore(c, snapshotBytes(t, a)); err != nil {
		t.Fatalf("restoring the end state: %v", err)
	}
	equalFSMs(t, a, c, pieces, []string{"a", "b", "c"})
}

func FuzzRestore(f *testing.F) {
	good := snapshotBytes(f, smallState(f).f)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Add([]byte("KVDIRFSM\x01\x00\x00\x00E"))
	big, _, _ := streamFSM(f, 3, 300)
	f.Add(snapshotBytes(f, big))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer failOnPanic(t)
		h := smallState(t)
		digest, applied := h.f.Digest(), h.f.AppliedIndex()
		if err := restore(h.f, data); err != nil {
			if !errors.Is(err, raftfsm.ErrCorruptState) {
				t.Fatalf("Restore error %v does not wrap ErrCorruptState", err)
			}
			if h.f.Digest() != digest || h.f.AppliedIndex() != applied {
				t.Fatalf("refused restore changed the state")
			}
			return
		}
		// Whatever was accepted can be read, written and read back.
		fsm := h.f
		ids := []string{}
		for _, w := range fsm.Workers("", true) {
			ids = append(ids, w.Spec.Id)
			fsm.WorkerChains(w.Spec.Id, 0)
		}
		rs, _ := fsm.Sessions("", "", 100)
		for _, r := range rs {
			fsm.SessionChain(r)
		}
		fsm.Sessions("s", "w1", 10)
		chains := [][]uint64{{1, 2, 3}, {1, 2}, {10}}
		for _, c := range chains {
			if _, _, err := fsm.Match(nil, c); err != nil {
				t.Fatalf("Match after restore: %v", err)
			}
		}
		fsm.Counters()
		var buf bytes.Buffer
		if err := fsm.WriteState(&buf); err != nil {
			t.Fatalf("WriteState of an accepted snapshot: %v", err)
		}
		g := newQuietFSM(t, raftfsm.Options{})
		if err := restore(g, buf.Bytes()); err != nil {
			t.Fatalf("a snapshot written from an accepted one is refused: %v", err)
		}
		equalFSMs(t, fsm, g, chains, ids)
		// And it goes on applying commands.
		h.idx = fsm.AppliedIndex()
		for _, id := range ids {
			res := h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: id, BlockSize: 1}})
			if rr, ok := res.(*raftfsm.RegisterResult); ok {
				h.publish(batch(id, rr.Epoch, 1, 1, stored(0, gpu, 1, 2, 3), removed(gpu, true, 1)))
			}
		}
	})
}

// failOnPanic reports a panic as the input's failure, so that a corpus entry
// that panics does not stop the rest of the package's tests.
func failOnPanic(t *testing.T) {
	if r := recover(); r != nil {
		t.Fatalf("panic: %v\n%s", r, debug.Stack())
	}
}
