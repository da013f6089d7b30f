package raftfsm_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func regCmd(id, owner string, hash byte) *kvdirv1.RegisterCommand {
	return &kvdirv1.RegisterCommand{
		Worker: &kvdirv1.WorkerSpec{Id: id, Model: "m", BlockSize: 16}, Owner: owner,
		TokenHash: bytes.Repeat([]byte{hash}, 32),
	}
}

func TestRegisterOwnership(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	res := h.apply(tRegister, regCmd("w", "alice", 1))
	if rr, ok := res.(*raftfsm.RegisterResult); !ok || rr.Epoch != 1 {
		t.Fatalf("alice registers w: %v", res)
	}
	before := h.f.Digest()
	// Another credential may not take over the live worker, and the
	// refusal names both.
	res = h.apply(tRegister, regCmd("w", "bob", 2))
	errResult(t, res, raftfsm.ErrNotOwner)
	if msg := res.(error).Error(); !strings.Contains(msg, `"alice"`) || !strings.Contains(msg, `"bob"`) {
		t.Fatalf("refusal %q does not name both credentials", msg)
	}
	if h.f.Digest() != before {
		t.Fatalf("a refused registration changed the state")
	}
	if wa, _ := h.f.WorkerAuth("w"); wa.Owner != "alice" || wa.Epoch != 1 || !bytes.Equal(wa.TokenHash, bytes.Repeat([]byte{1}, 32)) {
		t.Fatalf("after bob's refusal: %+v", wa)
	}
	// The same credential re-registers (an agent restarted): new epoch,
	// new token hash.
	if rr, ok := h.apply(tRegister, regCmd("w", "alice", 3)).(*raftfsm.RegisterResult); !ok || rr.Epoch != 2 {
		t.Fatalf("alice re-registers w: %v", rr)
	}
	if wa, _ := h.f.WorkerAuth("w"); wa.Epoch != 2 || !bytes.Equal(wa.TokenHash, bytes.Repeat([]byte{3}, 32)) {
		t.Fatalf("after re-registration: %+v", wa)
	}
	// Reads leave the token hash out.
	if w := mustWorker(t, h.f, "w"); len(w.TokenHash) != 0 || w.Owner != "alice" {
		t.Fatalf("read record: owner %q token hash %x", w.Owner, w.TokenHash)
	}
	// An administrator's registration (override) keeps the owner.
	adm := regCmd("w", "", 4)
	adm.Override = true
	if _, ok := h.apply(tRegister, adm).(*raftfsm.RegisterResult); !ok {
		t.Fatalf("admin registration refused")
	}
	if wa, _ := h.f.WorkerAuth("w"); wa.Owner != "alice" || wa.Epoch != 3 {
		t.Fatalf("after the admin's registration: %+v", wa)
	}
	// Once gone, the id is free for another credential.
	if res := h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "w", Epoch: 3}); res != nil {
		t.Fatalf("deregister: %v", res)
	}
	if rr, ok := h.apply(tRegister, regCmd("w", "bob", 5)).(*raftfsm.RegisterResult); !ok || rr.Epoch != 4 {
		t.Fatalf("bob registers the gone worker: %v", rr)
	}
}

func TestMaxOwnerWorkers(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	reg := func(id, owner string) any {
		c := regCmd(id, owner, 1)
		c.MaxOwnerWorkers = 2
		return h.apply(tRegister, c)
	}
	for _, id := range []string{"a1", "a2"} {
		if _, ok := reg(id, "alice").(*raftfsm.RegisterResult); !ok {
			t.Fatalf("register %s refused", id)
		}
	}
	errResult(t, reg("a3", "alice"), raftfsm.ErrTooMany)
	if _, ok := reg("a1", "alice").(*raftfsm.RegisterResult); !ok {
		t.Fatalf("re-registering an owned worker at the limit was refused")
	}
	if _, ok := reg("b1", "bob").(*raftfsm.RegisterResult); !ok {
		t.Fatalf("another credential was refused")
	}
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "a2", Epoch: 1})
	if _, ok := reg("a3", "alice").(*raftfsm.RegisterResult); !ok {
		t.Fatalf("register under the limit again refused")
	}
}

func TestBlockQuota(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	c := regCmd("w", "", 0)
	c.BlockQuota = 10
	e := h.apply(tRegister, c).(*raftfsm.RegisterResult).Epoch
	chain := func(from, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(from + i)
		}
		return out
	}
	h.publish1(batch("w", e, 1, 1, stored(0, gpu, chain(1, 6)...)), stApplied)
	r := h.publish1(batch("w", e, 2, 2, stored(6, gpu, chain(7, 6)...)), stApplied)
	if !strings.Contains(r.Message, "quota") {
		t.Fatalf("over-quota batch message %q does not say so", r.Message)
	}
	w := mustWorker(t, h.f, "w")
	if w.Blocks != 10 || w.DroppedBlocks != 2 || w.BlockQuota != 10 || w.AppliedSeq != 2 {
		t.Fatalf("worker: blocks %d dropped %d quota %d seq %d, want 10, 2, 10, 2", w.Blocks, w.DroppedBlocks, w.BlockQuota, w.AppliedSeq)
	}
	if d := depth(t, h.f, "w", chain(1, 12)...); d != 10 {
		t.Fatalf("matched depth %d, want the 10 stored", d)
	}
	// Everything past the quota is dropped, and counted; watchers heard
	// of the first drop only.
	changes := len(h.changes)
	h.publish1(batch("w", e, 3, 3, stored(0, gpu, chain(100, 4)...)), stApplied)
	if len(h.changes) != changes {
		t.Fatalf("a later drop told the watchers again: %v", h.changes[changes:])
	}
	if w := mustWorker(t, h.f, "w"); w.Blocks != 10 || w.DroppedBlocks != 6 {
		t.Fatalf("at the quota: blocks %d dropped %d", w.Blocks, w.DroppedBlocks)
	}
	// Removing makes room again.
	h.publish1(batch("w", e, 4, 5, removed(gpu, true, chain(9, 2)...), stored(0, gpu, chain(200, 3)...)), stApplied)
	if w := mustWorker(t, h.f, "w"); w.Blocks != 10 || w.DroppedBlocks != 7 {
		t.Fatalf("after removing 2: blocks %d dropped %d, want 10, 7", w.Blocks, w.DroppedBlocks)
	}
	// The quota and the count survive a snapshot.
	g := raftfsm.New(raftfsm.Options{Logger: discardLogger})
	if err := restore(g, snapshotBytes(t, h.f)); err != nil {
		t.Fatal(err)
	}
	if g.Digest() != h.f.Digest() {
		t.Fatalf("restored digest differs")
	}
	if w := mustWorker(t, g, "w"); w.BlockQuota != 10 || w.DroppedBlocks != 7 {
		t.Fatalf("restored: quota %d dropped %d", w.BlockQuota, w.DroppedBlocks)
	}
	// A new registration starts a new count.
	e = h.apply(tRegister, c).(*raftfsm.RegisterResult).Epoch
	if w := mustWorker(t, h.f, "w"); w.DroppedBlocks != 0 || w.Blocks != 0 {
		t.Fatalf("re-registered: blocks %d dropped %d", w.Blocks, w.DroppedBlocks)
	}
	_ = e
}

func TestEpochsNeverRestart(t *testing.T) {
	h := newHarness(t, raftfsm.Options{MaxGoneWorkers: 2})
	var e uint64
	for range 5 {
		e = h.register("x")
	}
	if e != 5 {
		t.Fatalf("epoch %d after five registrations", e)
	}
	h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: "x", Epoch: e})
	if b := snapshotBytes(t, h.f); b[8] != 1 {
		t.Fatalf("snapshot version %d before any prune, want 1 (readable by older builds)", b[8])
	}
	// Churn enough gone workers through the bounded records to prune x.
	for i := range 10 {
		id := "churn-" + string(rune('a'+i))
		ce := h.register(id)
		h.apply(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: id, Epoch: ce})
	}
	if _, ok := h.f.Worker("x"); ok {
		t.Fatalf("x was not pruned")
	}
	if f := h.f.EpochFloor(); f < 5 {
		t.Fatalf("epoch floor %d, want at least 5", f)
	}
	// The floor survives a snapshot (version 2).
	snap := snapshotBytes(t, h.f)
	if snap[8] != 2 {
		t.Fatalf("snapshot version %d with an epoch floor, want 2", snap[8])
	}
	g := newHarness(t, raftfsm.Options{MaxGoneWorkers: 2})
	if err := restore(g.f, snap); err != nil {
		t.Fatal(err)
	}
	g.idx, g.now = h.idx, h.now
	if g.f.Digest() != h.f.Digest() || g.f.EpochFloor() != h.f.EpochFloor() {
		t.Fatalf("restored state differs")
	}
	for _, hh := range []*harness{h, g} {
		if e2 := hh.register("x"); e2 <= 5 {
			t.Fatalf("pruned worker x re-registered at epoch %d: its epoch restarted (was 5)", e2)
		}
	}
	if g.f.Digest() != h.f.Digest() {
		t.Fatalf("digests differ after the same registration")
	}
	// A batch of the old epoch stays fenced.
	r := h.publish(batch("x", 5, 1, 1, stored(0, gpu, 1)))[0]
	if r.Status != stStale {
		t.Fatalf("batch of x's old epoch 5: %v, want STALE_EPOCH", r.Status)
	}
}

// FuzzRegisterDeregister applies fuzz-chosen registrations (by a few
// owners, some with override or an owner limit), deregistrations and
// expiries, and checks that a live worker only changes owner as allowed,
// owner limits hold, no id's epoch ever goes back, and that a replica fed
// the same log through a snapshot ends in the same state.
func FuzzRegisterDeregister(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 1, 1, 0, 0, 2, 0, 1, 1, 0, 3, 0})
	f.Add(bytes.Repeat([]byte{0, 1, 2, 3, 4, 5, 6, 7}, 16))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer failOnPanic(t)
		z := &fuzzBytes{b: data}
		opts := raftfsm.Options{MaxGoneWorkers: 2, Logger: discardLogger}
		opts.Index.MaxWorkers = 4
		a := newHarness(t, opts)
		var mid []byte // a's state halfway, restored into b
		ids := []string{"w0", "w1", "w2", "w3", "w4"}
		owners := []string{"", "alice", "bob"}
		maxEpoch := map[string]uint64{}
		var logs [][]byte
		for step := 0; !z.done() && step < 200; step++ {
			op, id := z.next()%4, ids[z.next()%len(ids)]
			var data []byte
			before, known := a.f.WorkerAuth(id)
			switch op {
			case 0, 1:
				c := regCmd(id, owners[z.next()%len(owners)], byte(step))
				flags := z.next()
				c.Override = flags&1 != 0
				if flags&2 != 0 {
					c.MaxOwnerWorkers = uint32(1 + flags>>2&1)
				}
				data = a.data(tRegister, c)
				res := a.applyData(data)
				rr, ok := res.(*raftfsm.RegisterResult)
				after, _ := a.f.WorkerAuth(id)
				switch {
				case ok:
					if rr.Epoch <= maxEpoch[id] {
						t.Fatalf("step %d: %s registered at epoch %d, had reached %d", step, id, rr.Epoch, maxEpoch[id])
					}
					maxEpoch[id] = rr.Epoch
					if known && before.Alive && before.Owner != "" && after.Owner != before.Owner {
						t.Fatalf("step %d: live %s went from owner %q to %q", step, id, before.Owner, after.Owner)
					}
					kept := known && before.Alive && before.Owner == after.Owner // a re-registration
					if c.MaxOwnerWorkers > 0 && after.Owner != "" && !kept {
						n := 0
						for _, w := range a.f.Workers("", false) {
							if w.Owner == after.Owner {
								n++
							}
						}
						if n > int(c.MaxOwnerWorkers) {
							t.Fatalf("step %d: %q owns %d live workers, limit %d", step, after.Owner, n, c.MaxOwnerWorkers)
						}
					}
				case errors.Is(res.(error), raftfsm.ErrNotOwner):
					if !known || !before.Alive || before.Owner == "" || before.Owner == c.Owner || c.Override {
						t.Fatalf("step %d: %s refused as owned by another: before %+v, command owner %q override %v", step, id, before, c.Owner, c.Override)
					}
				case errors.Is(res.(error), raftfsm.ErrTooMany):
				default:
					t.Fatalf("step %d: register %s: %v", step, id, res)
				}
			case 2:
				data = a.data(tDeregister, &kvdirv1.DeregisterCommand{WorkerId: id, Epoch: before.Epoch - uint64(z.next()%2)})
				a.applyData(data)
			case 3:
				data = a.data(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: id, Epoch: before.Epoch})
				a.applyData(data)
			}
			logs = append(logs, data)
			if step == 20 {
				mid = snapshotBytes(t, a.f)
			}
			checkInvariants(t, a.f, 4)
		}
		b := raftfsm.New(opts)
		start := 0
		if mid != nil {
			if err := restore(b, mid); err != nil {
				t.Fatal(err)
			}
			start = 21
		}
		for i := start; i < len(logs); i++ {
			b.Apply(cmdLog(uint64(i+1), logs[i]))
		}
		if a.f.Digest() != b.Digest() {
			t.Fatalf("replica fed the same log differs")
		}
	})
}
