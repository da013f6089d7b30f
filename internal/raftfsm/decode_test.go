package raftfsm_test

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func envelope(t testing.TB, env *kvdirv1.Command) []byte {
	t.Helper()
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	payloads := map[kvdirv1.CommandType]proto.Message{
		tRegister:       &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16, Labels: map[string]string{"a": "b"}}},
		tPublish:        &kvdirv1.PublishCommand{Batches: []*kvdirv1.EventBatch{batch("w", 1, 1, 2, stored(0, cpu, 1, 2), removed(gpu, true, 3), cleared())}},
		tLoads:          &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "w", Epoch: 2, Load: &kvdirv1.Load{KvUsage: 0.25}}}},
		tExpireWorker:   &kvdirv1.ExpireWorkerCommand{WorkerId: "w", Epoch: 3, Reason: "r"},
		tDeregister:     &kvdirv1.DeregisterCommand{WorkerId: "w", Epoch: 3},
		tDrain:          &kvdirv1.DrainCommand{WorkerId: "w"},
		tRecordSessions: &kvdirv1.RecordSessionsCommand{Sessions: []*kvdirv1.SessionRecord{sess("s", "w", 5)}},
		tExpireSessions: &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: -7},
		tMemberAPI:      &kvdirv1.MemberAPICommand{Id: "n", ApiAddress: "a"},
	}
	for typ, p := range payloads {
		b := encode(t, typ, p, -123456789)
		d, err := raftfsm.Decode(b)
		if err != nil {
			t.Fatalf("Decode(%v): %v", typ, err)
		}
		if d.Type != typ || d.TimeUnixNano != -123456789 || !proto.Equal(d.Payload, p) {
			t.Fatalf("Decode(%v) = %v %d %v", typ, d.Type, d.TimeUnixNano, d.Payload)
		}
	}
}

// undecodable returns log data that this build cannot apply, by name.
func undecodable(t testing.TB) map[string][]byte {
	reg := encode(t, tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "x", BlockSize: 1}}, 1)
	okPayload, _ := proto.Marshal(&kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "x", BlockSize: 1}})
	return map[string][]byte{
		"garbage":           {0xff, 0xff, 0xff, 0xff},
		"truncated":         reg[:len(reg)-3],
		"empty (version 0)": {},
		"version 2":         envelope(t, &kvdirv1.Command{Version: 2, Type: tRegister, Payload: okPayload}),
		"version 2 ignorable": envelope(t, &kvdirv1.Command{
			Version: 2, Type: tRegister, Payload: okPayload, Ignorable: true,
		}),
		"unknown type":       envelope(t, &kvdirv1.Command{Version: 1, Type: 99, Payload: []byte{1, 2}}),
		"unspecified type":   envelope(t, &kvdirv1.Command{Version: 1}),
		"bad payload":        envelope(t, &kvdirv1.Command{Version: 1, Type: tRegister, Payload: []byte{0x0a, 0x10, 0x01}}),
		"bad payload utf-8":  envelope(t, &kvdirv1.Command{Version: 1, Type: tDrain, Payload: []byte{0x0a, 0x02, 0xc3, 0x28}}),
		"ignorable bad body": envelope(t, &kvdirv1.Command{Version: 1, Type: tDrain, Ignorable: true, Payload: []byte{0x0a, 0x05}}),
	}
}

func TestUndecodableCallsFatal(t *testing.T) {
	for name, data := range undecodable(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := raftfsm.Decode(data); !errors.Is(err, raftfsm.ErrUndecodable) {
				t.Fatalf("Decode: %v, want ErrUndecodable", err)
			}
			var fatals []error
			var changed int
			f := raftfsm.New(raftfsm.Options{
				Logger:           discardLogger,
				Fatal:            func(err error) { fatals = append(fatals, err) },
				OnWorkersChanged: func([]string, uint64) { changed++ },
			})
			f.Apply(cmdLog(1, encode(t, tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "w", BlockSize: 1}}, 1)))
			before, changedBefore := f.Digest(), changed
			res := f.Apply(cmdLog(2, data))
			if len(fatals) != 1 || !errors.Is(fatals[0], raftfsm.ErrUndecodable) {
				t.Fatalf("Fatal calls %v, want one wrapping ErrUndecodable", fatals)
			}
			var ue *raftfsm.UndecodableError
			if !errors.As(fatals[0], &ue) || ue.Index != 2 || ue.Term != 1 {
				t.Fatalf("Fatal got %#v, want an *UndecodableError at index 2, term 1", fatals[0])
			}
			if res != nil {
				t.Fatalf("result %v, want nil", res)
			}
			if f.AppliedIndex() != 1 {
				t.Fatalf("AppliedIndex %d after an undecodable entry, want 1", f.AppliedIndex())
			}
			if f.Digest() != before || changed != changedBefore {
				t.Fatalf("undecodable entry changed the state")
			}
		})
	}
}

func TestUndecodableInBatch(t *testing.T) {
	var fatals []error
	f := raftfsm.New(raftfsm.Options{Logger: discardLogger, Fatal: func(err error) { fatals = append(fatals, err) }})
	reg := func(id string) []byte {
		return encode(t, tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: id, BlockSize: 1}}, 1)
	}
	out := f.ApplyBatch([]*raft.Log{cmdLog(1, reg("a")), cmdLog(2, []byte{0xff}), cmdLog(3, reg("b"))})
	if len(out) != 3 {
		t.Fatalf("%d results", len(out))
	}
	if len(fatals) != 1 || !errors.Is(fatals[0], raftfsm.ErrUndecodable) {
		t.Fatalf("Fatal calls %v", fatals)
	}
	if _, ok := out[0].(*raftfsm.RegisterResult); !ok {
		t.Fatalf("entry before the bad one: result %v", out[0])
	}
	if _, ok := f.Worker("b"); ok || out[2] != nil {
		t.Fatalf("entry after the undecodable one was applied")
	}
	if f.AppliedIndex() != 1 {
		t.Fatalf("AppliedIndex %d, want 1", f.AppliedIndex())
	}
}

// TestUndecodableSkippedWhenTold: an entry the hook names is applied as a
// no-op (the applied index moves past it, the result wraps ErrSkipped, what
// follows is applied), the followers' feed gets a stand-in that decodes as
// an ignorable command, and the state is the one without the entry.
func TestUndecodableSkippedWhenTold(t *testing.T) {
	reg := func(id string) []byte {
		return encode(t, tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: id, BlockSize: 1}}, 1)
	}
	var fatals []error
	var asked []uint64
	var fed []*raft.Log
	f := raftfsm.New(raftfsm.Options{
		Logger: discardLogger,
		Fatal:  func(err error) { fatals = append(fatals, err) },
		SkipUndecodable: func(index uint64, err error) bool {
			asked = append(asked, index)
			return index == 2 && errors.Is(err, raftfsm.ErrUndecodable)
		},
		OnApplied: func(logs []*raft.Log) { fed = append(fed, logs...) },
	})
	out := f.ApplyBatch([]*raft.Log{cmdLog(1, reg("a")), cmdLog(2, []byte{0xff, 0xff}), cmdLog(3, reg("b"))})
	if len(fatals) != 0 {
		t.Fatalf("Fatal called for a skipped entry: %v", fatals)
	}
	if err, ok := out[1].(error); !ok || !errors.Is(err, raftfsm.ErrSkipped) {
		t.Fatalf("result of the skipped entry %v, want an error wrapping ErrSkipped", out[1])
	}
	if _, ok := f.Worker("b"); !ok || f.AppliedIndex() != 3 {
		t.Fatalf("after the skipped entry: worker b registered %v, applied %d; want true, 3", ok, f.AppliedIndex())
	}
	if len(asked) != 1 || asked[0] != 2 {
		t.Fatalf("SkipUndecodable asked about %v, want [2]", asked)
	}
	if len(fed) != 3 || fed[1].Index != 2 {
		t.Fatalf("OnApplied got %d entries, want 3 with the stand-in at index 2", len(fed))
	}
	if d, err := raftfsm.Decode(fed[1].Data); err != nil || d.Payload != nil {
		t.Fatalf("stand-in decodes to %+v, %v; want an ignorable command", d, err)
	}
	// The same log without the entry gives the same state.
	g := raftfsm.New(raftfsm.Options{Logger: discardLogger})
	g.ApplyBatch([]*raft.Log{cmdLog(1, reg("a")), cmdLog(3, reg("b"))})
	if f.Digest() != g.Digest() {
		t.Fatalf("digest %016x after skipping, %016x without the entry", f.Digest(), g.Digest())
	}
	// An entry the hook does not name still stops the state machine.
	f.ApplyBatch([]*raft.Log{cmdLog(4, []byte{0xff})})
	if len(fatals) != 1 || f.AppliedIndex() != 3 {
		t.Fatalf("entry 4: Fatal calls %v, applied %d; want one call, 3", fatals, f.AppliedIndex())
	}
}

func TestDefaultFatalPanics(t *testing.T) {
	f := raftfsm.New(raftfsm.Options{Logger: discardLogger})
	defer func() {
		r := recover()
		err, ok := r.(error)
		if !ok || !errors.Is(err, raftfsm.ErrUndecodable) {
			t.Fatalf("recovered %v, want a panic with an error wrapping ErrUndecodable", r)
		}
		// The lock was released before the panic: the FSM is still readable.
		if f.AppliedIndex() != 0 || len(f.Workers("", true)) != 0 {
			t.Fatalf("state after the panic")
		}
	}()
	f.Apply(cmdLog(1, []byte("not a command")))
	t.Fatalf("Apply of garbage returned")
}

func TestIgnorableUnknownTypeSkipped(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	before := h.f.Digest()
	data := envelope(t, &kvdirv1.Command{Version: 1, Type: 4242, Ignorable: true, Payload: []byte("anything at all"), TimeUnixNano: 5})
	d, err := raftfsm.Decode(data)
	if err != nil || d.Payload != nil || d.Type != 4242 || d.TimeUnixNano != 5 {
		t.Fatalf("Decode = %+v, %v; want type 4242 with no payload", d, err)
	}
	if res := h.applyData(data); res != nil {
		t.Fatalf("result %v, want nil", res)
	}
	if h.f.AppliedIndex() != h.idx {
		t.Fatalf("AppliedIndex %d, want %d", h.f.AppliedIndex(), h.idx)
	}
	if h.f.Digest() != before {
		t.Fatalf("ignorable command changed the state")
	}
	// A known type marked ignorable is applied as usual.
	data = envelope(t, &kvdirv1.Command{Version: 1, Type: tDrain, Ignorable: true, Payload: mustMarshal(t, &kvdirv1.DrainCommand{WorkerId: "w"})})
	if res := h.applyData(data); res != nil {
		t.Fatalf("drain: %v", res)
	}
	if w := mustWorker(t, h.f, "w"); w.State != wsDraining {
		t.Fatalf("ignorable-flagged known command not applied: %v", w.State)
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNonCommandLogsSkipped(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	before, applied := h.f.Digest(), h.f.AppliedIndex()
	for i, typ := range []raft.LogType{raft.LogNoop, raft.LogConfiguration, raft.LogBarrier} {
		res := h.f.Apply(&raft.Log{Index: applied + 1 + uint64(i), Term: 1, Type: typ, Data: []byte{0xff, 0x00}})
		if res != nil {
			t.Fatalf("%v: result %v", typ, res)
		}
	}
	if h.f.Digest() != before || h.f.AppliedIndex() != applied {
		t.Fatalf("non-command entries changed the state or the applied index")
	}
	out := h.f.ApplyBatch([]*raft.Log{
		{Index: 10, Type: raft.LogConfiguration, Data: []byte{1}},
		cmdLog(11, encode(t, tDrain, &kvdirv1.DrainCommand{WorkerId: "w"}, 1)),
		{Index: 12, Type: raft.LogNoop},
	})
	if len(h.fatals) != 0 {
		t.Fatalf("Fatal called for non-command entries: %v", h.fatals)
	}
	if out[0] != nil || out[1] != nil || out[2] != nil {
		t.Fatalf("results %v", out)
	}
	if mustWorker(t, h.f, "w").State != wsDraining {
		t.Fatalf("command between non-command entries not applied")
	}
	// AppliedIndex is the last command's index.
	if h.f.AppliedIndex() != 11 {
		t.Fatalf("AppliedIndex %d, want 11", h.f.AppliedIndex())
	}
}
