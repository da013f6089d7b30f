package raftfsm_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestLoads(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("a")
	h.register("b")
	h.register("c")
	h.register("d")
	h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "c"})
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "d", Epoch: 1})
	h.changes = nil

	la := &kvdirv1.Load{Running: 3, Waiting: 1, KvUsage: 0.5, KvBlocks: 1000, PrefixQueries: 10, PrefixHits: 4}
	lc := &kvdirv1.Load{Running: 7}
	const at = 42_000_000_000
	res := h.applyAt(tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{
		{WorkerId: "c", Epoch: 1, Load: lc},               // draining: recorded
		{WorkerId: "a", Epoch: 1, Load: la},               // recorded
		{WorkerId: "b", Epoch: 2, Load: &kvdirv1.Load{}},  // wrong epoch: ignored
		{WorkerId: "d", Epoch: 1, Load: &kvdirv1.Load{}},  // expired: ignored
		{WorkerId: "zz", Epoch: 1, Load: &kvdirv1.Load{}}, // unknown: ignored
	}}, at)
	if res != nil {
		t.Fatalf("loads result %v, want nil", res)
	}
	a := mustWorker(t, h.f, "a")
	if !proto.Equal(a.Load, la) || a.LoadTimeUnixNano != at {
		t.Fatalf("a: load %v at %d, want %v at %d", a.Load, a.LoadTimeUnixNano, la, int64(at))
	}
	if c := mustWorker(t, h.f, "c"); !proto.Equal(c.Load, lc) || c.LoadTimeUnixNano != at {
		t.Fatalf("draining c: load %v at %d", c.Load, c.LoadTimeUnixNano)
	}
	for _, id := range []string{"b", "d"} {
		if w := mustWorker(t, h.f, id); w.Load != nil || w.LoadTimeUnixNano != 0 {
			t.Fatalf("%s: load %v at %d, want none", id, w.Load, w.LoadTimeUnixNano)
		}
	}
	if _, ok := h.f.Worker("zz"); ok {
		t.Fatalf("loads created unknown worker zz")
	}
	if len(h.changes) != 1 || !slices.Equal(h.changes[0].ids, []string{"a", "c"}) || h.changes[0].index != h.idx {
		t.Fatalf("OnWorkersChanged calls %v, want one with [a c] at %d", h.changes, h.idx)
	}

	// Loads that change nobody do not call back.
	h.apply(tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "b", Epoch: 9}}})
	if len(h.changes) != 1 {
		t.Fatalf("OnWorkersChanged called for loads that changed nothing: %v", h.changes)
	}
}

func TestDrain(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("a")
	h.publish1(batch("a", 1, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	if res := h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "a"}); res != nil {
		t.Fatalf("drain: %v", res)
	}
	a := mustWorker(t, h.f, "a")
	if a.State != wsDraining || a.Blocks != 2 || a.Epoch != 1 {
		t.Fatalf("after drain: %v, want DRAINING with its 2 blocks", a)
	}
	if ws := h.f.Workers("", false); len(ws) != 1 || ws[0].Spec.Id != "a" {
		t.Fatalf("draining worker not listed as alive: %v", ws)
	}
	// A draining worker still publishes.
	h.publish1(batch("a", 1, 2, 2, stored(2, gpu, 3)), stApplied)
	if d := depth(t, h.f, "a", 1, 2, 3); d != 3 {
		t.Fatalf("depth %d, want 3", d)
	}
	// Draining again is fine.
	if res := h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "a"}); res != nil {
		t.Fatalf("second drain: %v", res)
	}
	errResult(t, h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "zz"}), raftfsm.ErrUnknownWorker)
	// Re-registration makes it active again.
	if e := h.register("a"); e != 2 || mustWorker(t, h.f, "a").State != wsActive {
		t.Fatalf("re-registration of a draining worker: epoch %d state %v", e, mustWorker(t, h.f, "a").State)
	}
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "a", Epoch: 2})
	before := h.f.Digest()
	errResult(t, h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "a"}), raftfsm.ErrUnknownWorker)
	if h.f.Digest() != before || mustWorker(t, h.f, "a").State != wsExpired {
		t.Fatalf("drain of an expired worker changed it")
	}
}

func testRetire(t *testing.T, typ kvdirv1.CommandType, cmd func(id string, epoch uint64) proto.Message, to kvdirv1.WorkerState) {
	h := newHarness(t, raftfsm.Options{})
	h.register("a")
	h.register("b")
	h.publish1(batch("a", 1, 1, 1, stored(0, gpu, 1, 2), stored(0, cpu, 9)), stApplied)
	h.publish1(batch("b", 1, 1, 1, stored(0, gpu, 1)), stApplied)
	h.apply(tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "a", Epoch: 1, Load: &kvdirv1.Load{Running: 1}}}})

	// Stale epoch: refused, nothing changes.
	h.register("a")
	h.publish1(batch("a", 2, 1, 1, stored(0, gpu, 1, 2)), stApplied)
	before := h.f.Digest()
	h.changes = nil
	errResult(t, h.apply(typ, cmd("a", 1)), raftfsm.ErrStaleEpoch)
	errResult(t, h.apply(typ, cmd("a", 3)), raftfsm.ErrStaleEpoch)
	if h.f.Digest() != before {
		t.Fatalf("stale-epoch retirement changed the state")
	}
	if a := mustWorker(t, h.f, "a"); a.State != wsActive || a.Blocks != 2 {
		t.Fatalf("after stale retirement: %v", a)
	}
	errResult(t, h.apply(typ, cmd("zz", 1)), raftfsm.ErrUnknownWorker)
	if len(h.changes) != 0 {
		t.Fatalf("refused retirements called OnWorkersChanged: %v", h.changes)
	}

	// Matching epoch: blocks go, state changes, load is dropped.
	h.apply(tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "a", Epoch: 2, Load: &kvdirv1.Load{Running: 1}}}})
	h.changes = nil
	if res := h.apply(typ, cmd("a", 2)); res != nil {
		t.Fatalf("retire a at epoch 2: %v", res)
	}
	a := mustWorker(t, h.f, "a")
	if a.State != to || a.Blocks != 0 || a.Load != nil || a.Epoch != 2 {
		t.Fatalf("after retirement: %v, want %v with no blocks and no load", a, to)
	}
	if m := match(t, h.f, 1, 2); len(m) != 1 || m["b"].Blocks != 1 {
		t.Fatalf("match after retirement %v, want only b", m)
	}
	if len(h.changes) != 1 || !slices.Equal(h.changes[0].ids, []string{"a"}) || h.changes[0].index != h.idx {
		t.Fatalf("OnWorkersChanged calls %v, want [a] at %d", h.changes, h.idx)
	}
	if ws := h.f.Workers("", false); len(ws) != 1 || ws[0].Spec.Id != "b" {
		t.Fatalf("alive workers %v, want b only", ws)
	}
	// Retiring again: unknown.
	errResult(t, h.apply(typ, cmd("a", 2)), raftfsm.ErrUnknownWorker)
	// Coming back continues the epoch count.
	if e := h.register("a"); e != 3 {
		t.Fatalf("registration after retirement: epoch %d, want 3", e)
	}
}

func TestExpireWorker(t *testing.T) {
	testRetire(t, tExpireWorker, func(id string, e uint64) proto.Message {
		return &kvdirv1.ExpireWorkerCommand{WorkerId: id, Epoch: e, Reason: "lease"}
	}, wsExpired)
}

func TestDeregister(t *testing.T) {
	testRetire(t, tDeregister, func(id string, e uint64) proto.Message {
		return &kvdirv1.DeregisterCommand{WorkerId: id, Epoch: e}
	}, wsDeregistered)
}

func TestPruneGoneWorkers(t *testing.T) {
	h := newHarness(t, raftfsm.Options{MaxGoneWorkers: 2})
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		h.register(id) // a at index 1 ... e at index 5
	}
	expire := func(id string, epoch uint64) {
		t.Helper()
		if res := h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: id, Epoch: epoch}); res != nil {
			t.Fatalf("expire %s: %v", id, res)
		}
	}
	known := func(want ...string) {
		t.Helper()
		var got []string
		for _, w := range h.f.Workers("", true) {
			got = append(got, w.Spec.Id)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("known workers %v, want %v", got, want)
		}
	}
	// e, registered last, goes first; a, registered first, goes next.
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "e", Epoch: 1}) // index 6
	expire("a", 1)                                                            // index 7
	known("a", "b", "c", "d", "e")
	if w := mustWorker(t, h.f, "a"); w.GoneIndex != 7 || w.RegisteredIndex != 1 {
		t.Fatalf("a: gone index %d registered index %d, want 7 and 1", w.GoneIndex, w.RegisteredIndex)
	}
	if w := mustWorker(t, h.f, "b"); w.GoneIndex != 0 {
		t.Fatalf("live b has gone index %d", w.GoneIndex)
	}
	// Gone: e(6) a(7) b(8) -> e, gone earliest, goes, though a was
	// registered before it (ordering by registration would drop a).
	expire("b", 1)
	known("a", "b", "c", "d")
	// Gone: a(7) b(8) c(9) -> a goes.
	expire("c", 1)
	known("b", "c", "d")
	for _, id := range []string{"a", "e"} {
		if _, ok := h.f.Worker(id); ok {
			t.Fatalf("pruned worker %s still known", id)
		}
	}
	// A pruned worker does not start over: its epoch goes above every
	// pruned one (a and e were at 1), so batches and tokens of its old
	// incarnations stay fenced.
	if e := h.register("a"); e != 2 { // index 10
		t.Fatalf("pruned worker re-registered at epoch %d, want 2", e)
	}
	if w := mustWorker(t, h.f, "a"); w.GoneIndex != 0 {
		t.Fatalf("re-registered a keeps gone index %d", w.GoneIndex)
	}
	known("a", "b", "c", "d")
	// Going gone again records the new index: gone b(8) c(9) a(11) -> b goes.
	expire("a", 2)
	if w := mustWorker(t, h.f, "a"); w.GoneIndex != h.idx {
		t.Fatalf("a: gone index %d, want %d", w.GoneIndex, h.idx)
	}
	known("a", "c", "d")
	if len(h.f.Workers("", false)) != 1 {
		t.Fatalf("alive workers %v", h.f.Workers("", false))
	}
}

func TestWorkersFilterAndOrder(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	for _, w := range []struct{ id, model string }{
		{"w3", "m1"}, {"w1", "m2"}, {"w2", "m1"}, {"w0", "m1"}, {"w4", "m2"},
	} {
		h.registerSpec(&kvdirv1.WorkerSpec{Id: w.id, Model: w.model, BlockSize: 16})
	}
	h.publish1(batch("w2", 1, 1, 1, stored(0, gpu, 1, 2), stored(0, disk, 3)), stApplied)
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "w0", Epoch: 1})
	h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "w4"})

	ids := func(ws []*kvdirv1.Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.Spec.Id)
		}
		return out
	}
	for _, c := range []struct {
		model string
		gone  bool
		want  []string
	}{
		{"", false, []string{"w1", "w2", "w3", "w4"}},
		{"", true, []string{"w0", "w1", "w2", "w3", "w4"}},
		{"m1", false, []string{"w2", "w3"}},
		{"m1", true, []string{"w0", "w2", "w3"}},
		{"m2", false, []string{"w1", "w4"}},
		{"m3", true, nil},
	} {
		if got := ids(h.f.Workers(c.model, c.gone)); !slices.Equal(got, c.want) {
			t.Errorf("Workers(%q, %v) = %v, want %v", c.model, c.gone, got, c.want)
		}
	}
	// Counts are filled in, and the records are copies.
	ws := h.f.Workers("m1", false)
	if ws[0].Spec.Id != "w2" || ws[0].Blocks != 3 || ws[0].GpuBlocks != 2 || ws[0].DiskBlocks != 1 {
		t.Fatalf("w2 counts %v", ws[0])
	}
	ws[0].Spec.Model = "mutated"
	ws[0].Epoch = 99
	if w := mustWorker(t, h.f, "w2"); w.Spec.Model != "m1" || w.Epoch != 1 {
		t.Fatalf("Workers returned the FSM's own record: %v", w)
	}
	got := ids(h.f.WorkersByID([]string{"w3", "nope", "w0", "w2"}))
	if !slices.Equal(got, []string{"w3", "w0", "w2"}) {
		t.Fatalf("WorkersByID = %v", got)
	}
	if bw := h.f.WorkersByID([]string{"w2"}); bw[0].Blocks != 3 {
		t.Fatalf("WorkersByID counts %v", bw[0])
	}
}

func TestOnWorkersChanged(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	last := func() changeCall {
		t.Helper()
		if len(h.changes) == 0 {
			t.Fatalf("OnWorkersChanged not called")
		}
		return h.changes[len(h.changes)-1]
	}
	expect := func(what string, ids ...string) {
		t.Helper()
		c := last()
		if !slices.Equal(c.ids, ids) || c.index != h.idx {
			t.Fatalf("%s: OnWorkersChanged(%v, %d), want (%v, %d)", what, c.ids, c.index, ids, h.idx)
		}
	}
	noCall := func(what string, f func()) {
		t.Helper()
		n := len(h.changes)
		f()
		if len(h.changes) != n {
			t.Fatalf("%s called OnWorkersChanged: %v", what, h.changes[n:])
		}
	}
	h.register("b")
	expect("register", "b")
	h.register("a")
	expect("register", "a")
	h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "b"})
	expect("drain", "b")
	h.apply(tLoads, &kvdirv1.LoadsCommand{Loads: []*kvdirv1.WorkerLoad{{WorkerId: "b", Epoch: 1}, {WorkerId: "a", Epoch: 1}}})
	expect("loads", "a", "b")
	noCall("publish", func() { h.publish1(batch("a", 1, 1, 1, stored(0, gpu, 1)), stApplied) })
	noCall("sessions", func() {
		h.apply(tRecordSessions, &kvdirv1.RecordSessionsCommand{Sessions: []*kvdirv1.SessionRecord{{SessionId: "s", WorkerId: "a"}}})
		h.apply(tExpireSessions, &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: 1})
	})
	noCall("member", func() { h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n1", ApiAddress: "x"}) })
	noCall("refused commands", func() {
		h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "zz"})
		h.apply(tRegister, &kvdirv1.RegisterCommand{})
		h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "a", Epoch: 7})
	})
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "a", Epoch: 1})
	expect("expire", "a")
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "b", Epoch: 1})
	expect("deregister", "b")

	// A batch reports once, ids sorted and deduplicated, at the batch's last
	// index.
	n := len(h.changes)
	entries := []*rawEntry{
		{tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "z", BlockSize: 1}}},
		{tRegister, &kvdirv1.RegisterCommand{Worker: &kvdirv1.WorkerSpec{Id: "c", BlockSize: 1}}},
		{tDrain, &kvdirv1.DrainCommand{WorkerId: "z"}},
		{tPublish, &kvdirv1.PublishCommand{}},
	}
	h.applyBatch(entries)
	if len(h.changes) != n+1 {
		t.Fatalf("batch made %d OnWorkersChanged calls, want 1", len(h.changes)-n)
	}
	expect("batch", "c", "z")
}

type rawEntry struct {
	typ     kvdirv1.CommandType
	payload proto.Message
}

// applyBatch applies entries with one ApplyBatch call.
func (h *harness) applyBatch(entries []*rawEntry) []any {
	h.t.Helper()
	logs := make([]*raft.Log, 0, len(entries))
	for _, e := range entries {
		h.idx++
		logs = append(logs, cmdLog(h.idx, h.data(e.typ, e.payload)))
	}
	out := h.f.ApplyBatch(logs)
	if len(h.fatals) > 0 {
		h.t.Fatalf("Fatal called: %v", h.fatals)
	}
	if len(out) != len(logs) {
		h.t.Fatalf("ApplyBatch: %d results for %d entries", len(out), len(logs))
	}
	return out
}

// TestAliveEpochs checks that AliveEpochs lists every alive worker with its
// current epoch, and no retired one, appending to what it is given.
func TestAliveEpochs(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("a")
	eb := h.register("b")
	eb2 := h.register("b") // a new incarnation
	ec := h.register("c")
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "c", Epoch: ec, Reason: "lease"})
	if eb2 <= eb {
		t.Fatalf("re-registration epoch %d, want above %d", eb2, eb)
	}
	got := h.f.AliveEpochs([]raftfsm.WorkerEpoch{{ID: "kept"}})
	slices.SortFunc(got, func(x, y raftfsm.WorkerEpoch) int { return strings.Compare(x.ID, y.ID) })
	want := map[string]uint64{"kept": 0, "b": eb2}
	for _, w := range h.f.Workers("", false) {
		want[w.Spec.Id] = w.Epoch
	}
	if len(got) != len(want) || len(got) != 3 {
		t.Fatalf("AliveEpochs = %v, want %v", got, want)
	}
	for _, w := range got {
		if e, ok := want[w.ID]; !ok || e != w.Epoch {
			t.Fatalf("AliveEpochs = %v, want %v", got, want)
		}
	}
}
