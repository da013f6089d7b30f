package raftfsm_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Command type shorthands.
const (
	tRegister       = kvdirv1.CommandType_COMMAND_TYPE_REGISTER
	tPublish        = kvdirv1.CommandType_COMMAND_TYPE_PUBLISH
	tLoads          = kvdirv1.CommandType_COMMAND_TYPE_LOADS
	tExpireWorker   = kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_WORKER
	tDeregister     = kvdirv1.CommandType_COMMAND_TYPE_DEREGISTER
	tDrain          = kvdirv1.CommandType_COMMAND_TYPE_DRAIN
	tRecordSessions = kvdirv1.CommandType_COMMAND_TYPE_RECORD_SESSIONS
	tExpireSessions = kvdirv1.CommandType_COMMAND_TYPE_EXPIRE_SESSIONS
	tMemberAPI      = kvdirv1.CommandType_COMMAND_TYPE_MEMBER_API
)

// Publish statuses.
const (
	stApplied   = kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED
	stDuplicate = kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE
	stGap       = kvdirv1.PublishStatus_PUBLISH_STATUS_GAP
	stStale     = kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH
	stUnknown   = kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER
	stRejected  = kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED
)

// Worker states.
const (
	wsActive       = kvdirv1.WorkerState_WORKER_STATE_ACTIVE
	wsDraining     = kvdirv1.WorkerState_WORKER_STATE_DRAINING
	wsExpired      = kvdirv1.WorkerState_WORKER_STATE_EXPIRED
	wsDeregistered = kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED
)

var discardLogger = slog.New(slog.DiscardHandler)

// encode builds a log entry's data, failing the test on an encoding error.
func encode(t testing.TB, typ kvdirv1.CommandType, payload proto.Message, now int64) []byte {
	t.Helper()
	b, err := raftfsm.Encode(typ, payload, now)
	if err != nil {
		t.Fatalf("Encode(%v): %v", typ, err)
	}
	return b
}

func cmdLog(index uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
}

// changeCall is one OnWorkersChanged call.
type changeCall struct {
	ids   []string
	index uint64
}

// harness drives one FSM with consecutive log indexes and a clock that
// advances one second per command.
type harness struct {
	t       testing.TB
	f       *raftfsm.FSM
	idx     uint64
	now     int64
	fatals  []error
	changes []changeCall
}

// newHarness builds an FSM from opts, with a Fatal that records instead of
// panicking and an OnWorkersChanged that records its calls.
func newHarness(t testing.TB, opts raftfsm.Options) *harness {
	h := &harness{t: t, now: 1_000_000_000}
	opts.Logger = discardLogger
	opts.Fatal = func(err error) { h.fatals = append(h.fatals, err) }
	opts.OnWorkersChanged = func(ids []string, index uint64) {
		h.changes = append(h.changes, changeCall{ids: slices.Clone(ids), index: index})
	}
	h.f = raftfsm.New(opts)
	return h
}

// data encodes a command at the harness's next time.
func (h *harness) data(typ kvdirv1.CommandType, payload proto.Message) []byte {
	h.t.Helper()
	h.now += 1_000_000_000
	return encode(h.t, typ, payload, h.now)
}

// apply applies one command at the next index and time.
func (h *harness) apply(typ kvdirv1.CommandType, payload proto.Message) any {
	h.t.Helper()
	return h.applyData(h.data(typ, payload))
}

// applyAt applies one command proposed at the given time.
func (h *harness) applyAt(typ kvdirv1.CommandType, payload proto.Message, now int64) any {
	h.t.Helper()
	return h.applyData(encode(h.t, typ, payload, now))
}

func (h *harness) applyData(data []byte) any {
	h.t.Helper()
	h.idx++
	res := h.f.Apply(cmdLog(h.idx, data))
	if len(h.fatals) > 0 {
		h.t.Fatalf("Fatal called: %v", h.fatals)
	}
	return res
}

func (h *harness) register(id string) uint64 {
	h.t.Helper()
	return h.registerSpec(&kvdirv1.WorkerSpec{Id: id, Model: "m", BlockSize: 16, Address: "http://" + id})
}

func (h *harness) registerSpec(spec *kvdirv1.WorkerSpec) uint64 {
	h.t.Helper()
	res := h.apply(tRegister, &kvdirv1.RegisterCommand{Worker: spec})
	rr, ok := res.(*raftfsm.RegisterResult)
	if !ok {
		h.t.Fatalf("register %q: result %T %v, want *RegisterResult", spec.GetId(), res, res)
	}
	return rr.Epoch
}

// publish applies one PublishCommand and returns its responses.
func (h *harness) publish(batches ...*kvdirv1.EventBatch) []*kvdirv1.PublishResponse {
	h.t.Helper()
	res := h.apply(tPublish, &kvdirv1.PublishCommand{Batches: batches})
	pr, ok := res.(*raftfsm.PublishResult)
	if !ok {
		h.t.Fatalf("publish: result %T %v, want *PublishResult", res, res)
	}
	if len(pr.Responses) != len(batches) {
		h.t.Fatalf("publish: %d responses for %d batches", len(pr.Responses), len(batches))
	}
	return pr.Responses
}

// publish1 publishes one batch and checks its status.
func (h *harness) publish1(b *kvdirv1.EventBatch, want kvdirv1.PublishStatus) *kvdirv1.PublishResponse {
	h.t.Helper()
	r := h.publish(b)[0]
	if r.Status != want {
		h.t.Fatalf("publish %s e%d %d..%d: status %v (%q), want %v", b.WorkerId, b.Epoch, b.FirstSeq, b.LastSeq, r.Status, r.Message, want)
	}
	return r
}

// errResult asserts that a result is an error wrapping want.
func errResult(t testing.TB, res any, want error) {
	t.Helper()
	err, ok := res.(error)
	if !ok {
		t.Fatalf("result %T %v, want an error wrapping %v", res, res, want)
	}
	if !errors.Is(err, want) {
		t.Fatalf("result %v, want an error wrapping %v", err, want)
	}
}

func batch(worker string, epoch, first, last uint64, events ...*kvdirv1.Event) *kvdirv1.EventBatch {
	return &kvdirv1.EventBatch{WorkerId: worker, Epoch: epoch, FirstSeq: first, LastSeq: last, Events: events}
}

func stored(parent uint64, m kvdirv1.Medium, hashes ...uint64) *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Parent: parent, Hashes: hashes, Medium: m}}}
}

func removed(m kvdirv1.Medium, all bool, hashes ...uint64) *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: hashes, Medium: m, AllMedia: all}}}
}

func cleared() *kvdirv1.Event {
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Cleared{Cleared: &kvdirv1.AllCleared{}}}
}

const (
	gpu  = kvdirv1.Medium_MEDIUM_GPU
	cpu  = kvdirv1.Medium_MEDIUM_CPU
	disk = kvdirv1.Medium_MEDIUM_DISK
	rmt  = kvdirv1.Medium_MEDIUM_REMOTE
	unsp = kvdirv1.Medium_MEDIUM_UNSPECIFIED
)

// match returns the FSM's match of chain, by worker.
func match(t testing.TB, f *raftfsm.FSM, chain ...uint64) map[string]radix.WorkerMatch {
	t.Helper()
	ms, _, err := f.Match(nil, chain)
	if err != nil {
		t.Fatalf("Match(%v): %v", chain, err)
	}
	out := make(map[string]radix.WorkerMatch, len(ms))
	for _, m := range ms {
		out[m.Worker] = m
	}
	return out
}

// depth is how many blocks of chain worker holds, per Match.
func depth(t testing.TB, f *raftfsm.FSM, worker string, chain ...uint64) int {
	t.Helper()
	return match(t, f, chain...)[worker].Blocks
}

// mustWorker returns a worker's record, failing if unknown.
func mustWorker(t testing.TB, f *raftfsm.FSM, id string) *kvdirv1.Worker {
	t.Helper()
	w, ok := f.Worker(id)
	if !ok {
		t.Fatalf("worker %q unknown", id)
	}
	return w
}

// memSink is an in-memory raft.SnapshotSink.
type memSink struct {
	buf       bytes.Buffer
	closed    bool
	cancelled bool
	failWrite error
}

func (s *memSink) Write(p []byte) (int, error) {
	if s.failWrite != nil {
		return 0, s.failWrite
	}
	if s.closed || s.cancelled {
		return 0, errors.New("memSink: write after close")
	}
	return s.buf.Write(p)
}

func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

var _ raft.SnapshotSink = (*memSink)(nil)

// snapshotBytes takes a snapshot of f and persists it into memory.
func snapshotBytes(t testing.TB, f *raftfsm.FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer snap.Release()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("Persist: sink closed=%v cancelled=%v, want closed and not cancelled", sink.closed, sink.cancelled)
	}
	return sink.buf.Bytes()
}

func restore(f *raftfsm.FSM, b []byte) error {
	return f.Restore(io.NopCloser(bytes.NewReader(b)))
}
