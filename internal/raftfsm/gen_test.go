package raftfsm_test

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// A random but valid command stream, generated against a small model of the
// worker registry that predicts each command's result.

// mworker is the model of one worker record.
type mworker struct {
	epoch, seq, regIdx uint64
	goneIdx            uint64 // index of the command that retired it; 0 while alive
	state              kvdirv1.WorkerState
}

func (w *mworker) alive() bool { return w.state == wsActive || w.state == wsDraining }

// expect is a command's predicted result.
type expect struct {
	epoch    uint64                  // register: the epoch, 0 if refused
	err      error                   // a refusal the result must wrap
	statuses []kvdirv1.PublishStatus // publish
}

type genCmd struct {
	idx  uint64
	typ  kvdirv1.CommandType
	data []byte
	want expect
}

type streamGen struct {
	t        testing.TB
	r        *rand.Rand
	ids      []string
	maxAlive int
	maxGone  int
	workers  map[string]*mworker
	chains   [][]uint64
	sessions []string
	now      int64
	idx      uint64
	floor    uint64 // highest epoch of a pruned record
}

func newStreamGen(t testing.TB, seed uint64, maxAlive, maxGone int) *streamGen {
	g := &streamGen{
		t: t, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		maxAlive: maxAlive, maxGone: maxGone,
		workers: map[string]*mworker{}, now: 1_700_000_000_000_000_000,
	}
	for i := range 7 {
		g.ids = append(g.ids, fmt.Sprintf("worker-%d", i))
	}
	for i := range 30 {
		g.sessions = append(g.sessions, fmt.Sprintf("sess-%02d", i))
	}
	return g
}

// hash draws a block hash, never 0.
func (g *streamGen) hash() uint64 {
	for {
		if h := g.r.Uint64(); h != 0 {
			return h
		}
	}
}

// chain returns a known chain, sometimes a new one that shares a prefix with
// an existing one. Hashes are unique, so every block has one parent.
func (g *streamGen) chain() []uint64 {
	if len(g.chains) == 0 || (len(g.chains) < 60 && g.r.IntN(4) == 0) {
		var c []uint64
		if len(g.chains) > 0 && g.r.IntN(3) > 0 {
			base := g.chains[g.r.IntN(len(g.chains))]
			c = slices.Clone(base[:g.r.IntN(len(base)+1)])
		}
		for range 1 + g.r.IntN(8) {
			c = append(c, g.hash())
		}
		g.chains = append(g.chains, c)
		return c
	}
	return g.chains[g.r.IntN(len(g.chains))]
}

func (g *streamGen) medium() kvdirv1.Medium { return kvdirv1.Medium(g.r.IntN(5)) }

func (g *streamGen) countAlive() int {
	n := 0
	for _, w := range g.workers {
		if w.alive() {
			n++
		}
	}
	return n
}

// prune mirrors the documented pruning: gone records beyond maxGone go,
// earliest gone first.
func (g *streamGen) prune() {
	type gone struct {
		id string
		at uint64
	}
	var gs []gone
	for id, w := range g.workers {
		if !w.alive() {
			gs = append(gs, gone{id, w.goneIdx})
		}
	}
	slices.SortFunc(gs, func(a, b gone) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.id, b.id))
	})
	for len(gs) > g.maxGone {
		g.floor = max(g.floor, g.workers[gs[0].id].epoch)
		delete(g.workers, gs[0].id)
		gs = gs[1:]
	}
}

// events draws a batch's events; valid unless bad.
func (g *streamGen) events(bad bool) []*kvdirv1.Event {
	n := 1 + g.r.IntN(4)
	evs := make([]*kvdirv1.Event, 0, n)
	for range n {
		switch x := g.r.IntN(100); {
		case x < 70:
			c := g.chain()
			i := g.r.IntN(len(c))
			j := i + 1 + g.r.IntN(len(c)-i)
			parent := uint64(0)
			if i > 0 {
				parent = c[i-1]
			}
			evs = append(evs, stored(parent, g.medium(), c[i:j]...))
		case x < 95:
			c := g.chain()
			i := g.r.IntN(len(c))
			j := i + 1 + g.r.IntN(len(c)-i)
			evs = append(evs, removed(g.medium(), g.r.IntN(3) == 0, c[i:j]...))
		default:
			evs = append(evs, cleared())
		}
	}
	if bad {
		switch g.r.IntN(3) {
		case 0:
			evs = append(evs, stored(0, gpu, g.hash(), 0))
		case 1:
			evs = append(evs, removed(kvdirv1.Medium(7), false, g.hash()))
		default:
			evs = append(evs, &kvdirv1.Event{})
		}
	}
	return evs
}

// publishStatus is the documented outcome of a batch for a worker record.
func publishStatus(w *mworker, b *kvdirv1.EventBatch, eventsOK bool) kvdirv1.PublishStatus {
	switch {
	case w == nil || !w.alive():
		return stUnknown
	case b.Epoch < w.epoch:
		return stStale
	case b.Epoch > w.epoch:
		return stRejected
	case b.FirstSeq < 1 || b.LastSeq < b.FirstSeq:
		return stRejected
	case b.LastSeq-b.FirstSeq >= uint64(max(len(b.Events), 1)):
		return stRejected // spans more numbers than it has events
	case b.LastSeq <= w.seq:
		return stDuplicate
	case b.FirstSeq != w.seq+1:
		return stGap
	case !eventsOK:
		return stRejected
	}
	return stApplied
}

// aliveIDs lists the model's live workers, in id order.
func (g *streamGen) aliveIDs() []string {
	var out []string
	for _, id := range g.ids {
		if w := g.workers[id]; w != nil && w.alive() {
			out = append(out, id)
		}
	}
	return out
}

func (g *streamGen) batch() (*kvdirv1.EventBatch, kvdirv1.PublishStatus) {
	id := g.ids[g.r.IntN(len(g.ids))]
	if alive := g.aliveIDs(); len(alive) > 0 && g.r.IntN(10) > 0 {
		id = alive[g.r.IntN(len(alive))]
	}
	w := g.workers[id]
	var epoch, seq uint64
	if w != nil {
		epoch, seq = w.epoch, w.seq
	}
	b := &kvdirv1.EventBatch{WorkerId: id, Epoch: max(epoch, 1), FirstSeq: seq + 1}
	b.LastSeq = b.FirstSeq + uint64(g.r.IntN(3))
	bad := false
	switch x := g.r.IntN(100); {
	case x < 75: // the next batch
	case x < 80: // a re-sent one
		b.FirstSeq = max(1, seq-uint64(g.r.IntN(2)))
		b.LastSeq = max(b.FirstSeq, seq)
	case x < 84:
		b.FirstSeq += 1 + uint64(g.r.IntN(3))
		b.LastSeq = b.FirstSeq + uint64(g.r.IntN(3))
	case x < 88:
		b.Epoch = epoch - 1
	case x < 91:
		b.Epoch = epoch + 1
	case x < 94:
		b.FirstSeq = 0
	default:
		bad = true
	}
	b.Events = g.events(bad)
	if n := uint64(max(len(b.Events), 1)); b.LastSeq-b.FirstSeq >= n && b.LastSeq >= b.FirstSeq && g.r.IntN(10) > 0 {
		b.LastSeq = b.FirstSeq + n - 1 // mostly keep the range within the events
	}
	st := publishStatus(w, b, !bad)
	if st == stApplied {
		w.seq = b.LastSeq
	}
	return b, st
}

// next generates the next command and advances the model.
func (g *streamGen) next() genCmd {
	g.idx++
	g.now += int64(g.r.IntN(2_000_000_000)) - 200_000_000 // the leader's clock may step back
	c := genCmd{idx: g.idx}
	var payload proto.Message
	pick := func() (string, *mworker) {
		id := g.ids[g.r.IntN(len(g.ids))]
		return id, g.workers[id]
	}
	switch x := g.r.IntN(1000); {
	case x < 110:
		c.typ = tRegister
		id, w := pick()
		spec := &kvdirv1.WorkerSpec{Id: id, Model: fmt.Sprintf("model-%d", g.r.IntN(2)), BlockSize: 16, Address: "http://" + id}
		if g.r.IntN(40) == 0 {
			spec.BlockSize = 1<<16 + 1
			c.want.err = raftfsm.ErrInvalid
		} else if (w == nil || !w.alive()) && g.countAlive() >= g.maxAlive {
			c.want.err = raftfsm.ErrTooMany
		} else {
			if w == nil {
				w = &mworker{}
				g.workers[id] = w
			}
			w.epoch = max(w.epoch+1, g.floor+1) // epochs never restart
			w.seq, w.regIdx, w.goneIdx, w.state = 0, g.idx, 0, wsActive
			c.want.epoch = w.epoch
			g.prune()
		}
		payload = &kvdirv1.RegisterCommand{Worker: spec}
	case x < 560:
		c.typ = tPublish
		pc := &kvdirv1.PublishCommand{}
		for range 1 + g.r.IntN(3) {
			b, st := g.batch()
			pc.Batches = append(pc.Batches, b)
			c.want.statuses = append(c.want.statuses, st)
		}
		payload = pc
	case x < 640:
		c.typ = tLoads
		lc := &kvdirv1.LoadsCommand{}
		for range 1 + g.r.IntN(3) {
			id, w := pick()
			e := uint64(1)
			if w != nil {
				e = w.epoch - uint64(g.r.IntN(2))
			}
			lc.Loads = append(lc.Loads, &kvdirv1.WorkerLoad{WorkerId: id, Epoch: e, Load: &kvdirv1.Load{
				Running: uint32(g.r.IntN(9)), KvUsage: g.r.Float64(), KvBlocks: uint64(g.r.IntN(1000)),
			}})
		}
		payload = lc
	case x < 670:
		c.typ = tDrain
		id, w := pick()
		if w == nil || !w.alive() {
			c.want.err = raftfsm.ErrUnknownWorker
		} else {
			w.state = wsDraining
		}
		payload = &kvdirv1.DrainCommand{WorkerId: id}
	case x < 740:
		id, w := pick()
		to := wsExpired
		c.typ = tExpireWorker
		if g.r.IntN(3) == 0 {
			to, c.typ = wsDeregistered, tDeregister
		}
		e := uint64(1)
		if w != nil {
			e = w.epoch - uint64(g.r.IntN(2))
		}
		switch {
		case w == nil || !w.alive():
			c.want.err = raftfsm.ErrUnknownWorker
		case w.epoch != e:
			c.want.err = raftfsm.ErrStaleEpoch
		default:
			w.state, w.goneIdx = to, g.idx
			g.prune()
		}
		if c.typ == tDeregister {
			payload = &kvdirv1.DeregisterCommand{WorkerId: id, Epoch: e}
		} else {
			payload = &kvdirv1.ExpireWorkerCommand{WorkerId: id, Epoch: e, Reason: "test"}
		}
	case x < 900:
		c.typ = tRecordSessions
		rc := &kvdirv1.RecordSessionsCommand{}
		for range 1 + g.r.IntN(3) {
			ch := g.chain()
			k := g.r.IntN(len(ch))
			rc.Sessions = append(rc.Sessions, &kvdirv1.SessionRecord{
				SessionId: g.sessions[g.r.IntN(len(g.sessions))], Tail: ch[k], Blocks: uint32(k + 1),
				PromptTokens: uint32(16*k + g.r.IntN(16)), WorkerId: g.ids[g.r.IntN(len(g.ids))], BlockSize: 16,
			})
		}
		if g.r.IntN(30) == 0 {
			rc.Sessions = append(rc.Sessions, &kvdirv1.SessionRecord{})
			c.want.err = raftfsm.ErrInvalid
		}
		payload = rc
	case x < 950:
		c.typ = tExpireSessions
		payload = &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: g.now - int64(g.r.IntN(60))*1_000_000_000}
	case x < 980:
		c.typ = tMemberAPI
		payload = &kvdirv1.MemberAPICommand{Id: fmt.Sprintf("node-%d", g.r.IntN(3)), ApiAddress: fmt.Sprintf("10.0.0.%d:7000", g.r.IntN(255))}
	default:
		c.typ = 1000 + kvdirv1.CommandType(g.r.IntN(5))
		b, err := proto.Marshal(&kvdirv1.Command{Version: 1, Type: c.typ, Ignorable: true, Payload: []byte{1, 2, 3}, TimeUnixNano: g.now})
		if err != nil {
			g.t.Fatal(err)
		}
		c.data = b
		return c
	}
	c.data = encode(g.t, c.typ, payload, g.now)
	return c
}

func (g *streamGen) stream(n int) []genCmd {
	out := make([]genCmd, n)
	for i := range out {
		out[i] = g.next()
	}
	return out
}

// checkResult compares a command's result with the model's prediction.
func checkResult(t testing.TB, c genCmd, res any) {
	t.Helper()
	switch {
	case c.want.err != nil:
		if err, ok := res.(error); !ok || !errors.Is(err, c.want.err) {
			t.Fatalf("index %d (%v): result %v, want %v", c.idx, c.typ, res, c.want.err)
		}
	case c.typ == tRegister:
		if rr, ok := res.(*raftfsm.RegisterResult); !ok || rr.Epoch != c.want.epoch {
			t.Fatalf("index %d register: result %v, want epoch %d", c.idx, res, c.want.epoch)
		}
	case c.typ == tPublish:
		pr, ok := res.(*raftfsm.PublishResult)
		if !ok || len(pr.Responses) != len(c.want.statuses) {
			t.Fatalf("index %d publish: result %v, want %d responses", c.idx, res, len(c.want.statuses))
		}
		for i, r := range pr.Responses {
			if r.Status != c.want.statuses[i] || r.RaftIndex != c.idx {
				t.Fatalf("index %d publish batch %d: %v, want %v", c.idx, i, r, c.want.statuses[i])
			}
		}
	default:
		if res != nil {
			t.Fatalf("index %d (%v): result %v, want nil", c.idx, c.typ, res)
		}
	}
}

// sameResult says whether two FSMs' results for one entry are equal.
func sameResult(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case error:
		y, ok := b.(error)
		return ok && x.Error() == y.Error()
	case *raftfsm.RegisterResult:
		y, ok := b.(*raftfsm.RegisterResult)
		return ok && *x == *y
	case *raftfsm.PublishResult:
		y, ok := b.(*raftfsm.PublishResult)
		return ok && slices.EqualFunc(x.Responses, y.Responses, func(p, q *kvdirv1.PublishResponse) bool { return proto.Equal(p, q) })
	}
	return false
}

// checkModel compares the FSM's registry with the model's.
func (g *streamGen) checkModel(t testing.TB, f *raftfsm.FSM) {
	t.Helper()
	for _, id := range g.ids {
		mw := g.workers[id]
		w, ok := f.Worker(id)
		if ok != (mw != nil) {
			t.Fatalf("worker %s known %v, model says %v", id, ok, mw != nil)
		}
		if !ok {
			continue
		}
		if w.Epoch != mw.epoch || w.AppliedSeq != mw.seq || w.State != mw.state || w.RegisteredIndex != mw.regIdx || w.GoneIndex != mw.goneIdx {
			t.Fatalf("worker %s: epoch %d seq %d state %v reg %d gone %d; model %+v",
				id, w.Epoch, w.AppliedSeq, w.State, w.RegisteredIndex, w.GoneIndex, *mw)
		}
		if !mw.alive() && (w.Blocks != 0 || w.Load != nil) {
			t.Fatalf("gone worker %s holds %d blocks, load %v", id, w.Blocks, w.Load)
		}
	}
	if c := f.Counters(); c.Workers > g.countAlive() {
		t.Fatalf("index has %d workers, only %d alive", c.Workers, g.countAlive())
	}
}

// newQuietFSM is an FSM whose Fatal fails the test.
func newQuietFSM(t testing.TB, opts raftfsm.Options) *raftfsm.FSM {
	opts.Logger = discardLogger
	opts.Fatal = func(err error) { t.Errorf("Fatal: %v", err) }
	return raftfsm.New(opts)
}

// equalFSMs compares everything the read API exposes.
func equalFSMs(t testing.TB, a, b *raftfsm.FSM, chains [][]uint64, ids []string) {
	t.Helper()
	if a.Digest() != b.Digest() || a.IndexDigest() != b.IndexDigest() {
		t.Fatalf("digests differ: %x/%x vs %x/%x", a.Digest(), a.IndexDigest(), b.Digest(), b.IndexDigest())
	}
	if a.AppliedIndex() != b.AppliedIndex() {
		t.Fatalf("applied index %d vs %d", a.AppliedIndex(), b.AppliedIndex())
	}
	wa, wb := a.Workers("", true), b.Workers("", true)
	if !slices.EqualFunc(wa, wb, func(x, y *kvdirv1.Worker) bool { return proto.Equal(x, y) }) {
		t.Fatalf("workers differ:\n%v\n%v", wa, wb)
	}
	sa, na := a.Sessions("", "", 1<<30)
	sb, nb := b.Sessions("", "", 1<<30)
	if na != nb || !slices.EqualFunc(sa, sb, func(x, y *kvdirv1.SessionRecord) bool { return proto.Equal(x, y) }) {
		t.Fatalf("sessions differ (%d vs %d)", na, nb)
	}
	for _, s := range sa {
		ca, oka := a.SessionChain(s)
		cb, okb := b.SessionChain(s)
		if oka != okb || !slices.Equal(ca, cb) {
			t.Fatalf("SessionChain(%s) differs", s.SessionId)
		}
	}
	ma, mb := a.Members(), b.Members()
	if len(ma) != len(mb) {
		t.Fatalf("members %v vs %v", ma, mb)
	}
	for k, v := range ma {
		if mb[k] != v {
			t.Fatalf("members %v vs %v", ma, mb)
		}
	}
	for _, c := range chains {
		xa, _, erra := a.Match(nil, c)
		xb, _, errb := b.Match(nil, c)
		if erra != nil || errb != nil || !slices.Equal(xa, xb) {
			t.Fatalf("Match(%x) = %v (%v) vs %v (%v)", c, xa, erra, xb, errb)
		}
	}
	for _, id := range ids {
		if !slices.Equal(a.WorkerChains(id, 0), b.WorkerChains(id, 0)) {
			t.Fatalf("WorkerChains(%s) differ", id)
		}
	}
	ca, cb := a.Counters(), b.Counters()
	if ca.Blocks != cb.Blocks || ca.Entries != cb.Entries || ca.Workers != cb.Workers || ca.Sessions != cb.Sessions {
		t.Fatalf("counters %+v vs %+v", ca, cb)
	}
}

func logsOf(cmds []genCmd) []*raft.Log {
	out := make([]*raft.Log, len(cmds))
	for i, c := range cmds {
		out[i] = cmdLog(c.idx, c.data)
	}
	return out
}
