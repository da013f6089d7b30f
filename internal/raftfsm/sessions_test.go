package raftfsm_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func sess(id, worker string, tail uint64) *kvdirv1.SessionRecord {
	return &kvdirv1.SessionRecord{SessionId: id, WorkerId: worker, Tail: tail, Blocks: 3, PromptTokens: 48, CachedTokens: 32, BlockSize: 16}
}

func (h *harness) record(at int64, rs ...*kvdirv1.SessionRecord) any {
	h.t.Helper()
	return h.applyAt(tRecordSessions, &kvdirv1.RecordSessionsCommand{Sessions: rs}, at)
}

func sessionIDs(rs []*kvdirv1.SessionRecord) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.SessionId)
	}
	return out
}

func allSessions(f *raftfsm.FSM) []string {
	rs, _ := f.Sessions("", "", 1<<30)
	return sessionIDs(rs)
}

func TestRecordSessionsStampsTime(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	in := sess("s1", "w", 77)
	in.TimeUnixNano = 5 // the proposer's claim is overwritten
	if res := h.record(1234, in); res != nil {
		t.Fatalf("record: %v", res)
	}
	got, ok := h.f.Session("s1")
	if !ok {
		t.Fatalf("session s1 not recorded")
	}
	want := proto.Clone(in).(*kvdirv1.SessionRecord)
	want.TimeUnixNano = 1234
	if !proto.Equal(got, want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
	// The FSM holds its own copy.
	got.WorkerId = "mutated"
	in.WorkerId = "mutated"
	if again, _ := h.f.Session("s1"); again.WorkerId != "w" {
		t.Fatalf("session record aliased: worker %q", again.WorkerId)
	}
	if _, ok := h.f.Session("nope"); ok {
		t.Fatalf("unknown session found")
	}
}

func TestRecordSessionReplaces(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.record(100, sess("s1", "a", 1), sess("s2", "a", 2))
	h.record(200, sess("s1", "b", 9))
	r, _ := h.f.Session("s1")
	if r.WorkerId != "b" || r.Tail != 9 || r.TimeUnixNano != 200 {
		t.Fatalf("re-recorded session %v", r)
	}
	if rs, n := h.f.Sessions("", "", 10); n != 2 || !slices.Equal(sessionIDs(rs), []string{"s1", "s2"}) {
		t.Fatalf("Sessions = %v (%d), want [s1 s2] (2)", sessionIDs(rs), n)
	}
	// Re-recording the identical record at another time is a change.
	d := h.f.Digest()
	h.record(300, sess("s1", "b", 9))
	if h.f.Digest() == d {
		t.Fatalf("digest unchanged after re-recording a session at a new time")
	}
}

func TestMaxSessionsEvictsLeastRecentlyRecorded(t *testing.T) {
	h := newHarness(t, raftfsm.Options{MaxSessions: 3})
	h.record(100, sess("s1", "w", 1))
	h.record(200, sess("s2", "w", 1))
	h.record(300, sess("s3", "w", 1))
	h.record(400, sess("s1", "w", 1)) // s1 is now the most recent
	h.record(500, sess("s4", "w", 1))
	if got := allSessions(h.f); !slices.Equal(got, []string{"s4", "s1", "s3"}) {
		t.Fatalf("sessions %v, want [s4 s1 s3]", got)
	}
	if _, ok := h.f.Session("s2"); ok {
		t.Fatalf("s2 not evicted")
	}
	// One batch larger than the bound keeps its last sessions.
	h.record(600, sess("b1", "w", 1), sess("b2", "w", 1), sess("b3", "w", 1), sess("b4", "w", 1))
	if got := allSessions(h.f); !slices.Equal(got, []string{"b4", "b3", "b2"}) {
		t.Fatalf("sessions %v, want [b4 b3 b2]", got)
	}
	if c := h.f.Counters(); c.Sessions != 3 {
		t.Fatalf("Counters.Sessions %d, want 3", c.Sessions)
	}
}

func TestExpireSessions(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.record(300, sess("s3", "w", 1))
	h.record(100, sess("s1", "w", 1)) // recorded later, proposed earlier
	h.record(200, sess("s2", "w", 1))
	if res := h.apply(tExpireSessions, &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: 200}); res != nil {
		t.Fatalf("expire sessions: %v", res)
	}
	for id, want := range map[string]bool{"s1": false, "s2": true, "s3": true} {
		if _, ok := h.f.Session(id); ok != want {
			t.Errorf("session %s present %v, want %v", id, ok, want)
		}
	}
	h.apply(tExpireSessions, &kvdirv1.ExpireSessionsCommand{BeforeUnixNano: 1 << 62})
	if _, n := h.f.Sessions("", "", 10); n != 0 {
		t.Fatalf("%d sessions after expiring all", n)
	}
	// Expiry and re-recording agree with a fresh table on the digest.
	h2 := newHarness(t, raftfsm.Options{})
	h.record(1000, sess("x", "w", 1))
	h2.record(1000, sess("x", "w", 1))
	if h.f.Digest() != h2.f.Digest() {
		t.Fatalf("digest after expiring sessions differs from a table that never held them")
	}
}

func TestSessionsQuery(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.record(100, sess("chat-1", "a", 1), sess("chat-2", "b", 1))
	h.record(200, sess("api-1", "a", 1))
	h.record(300, sess("chat-3", "a", 1))
	h.record(400, sess("chat-10", "b", 1))
	h.record(500, sess("chat-1", "b", 1)) // re-recorded: now the newest

	for _, c := range []struct {
		prefix, worker string
		limit          int
		want           []string
	}{
		{"", "", 10, []string{"chat-1", "chat-10", "chat-3", "api-1", "chat-2"}},
		{"", "", 2, []string{"chat-1", "chat-10"}},
		{"", "", 0, nil},
		{"", "a", 10, []string{"chat-3", "api-1"}},
		{"", "b", 10, []string{"chat-1", "chat-10", "chat-2"}},
		{"chat-", "", 10, []string{"chat-1", "chat-10", "chat-3", "chat-2"}},
		{"chat-1", "", 10, []string{"chat-1", "chat-10"}},
		{"chat-", "b", 2, []string{"chat-1", "chat-10"}},
		{"chat-", "a", 10, []string{"chat-3"}},
		{"chat-", "", 0, nil},
		{"api", "b", 10, nil},
		{"zzz", "", 10, nil},
		{"", "nobody", 10, nil},
	} {
		rs, n := h.f.Sessions(c.prefix, c.worker, c.limit)
		if got := sessionIDs(rs); !slices.Equal(got, c.want) {
			t.Errorf("Sessions(%q, %q, %d) = %v, want %v", c.prefix, c.worker, c.limit, got, c.want)
		}
		if n != 5 {
			t.Errorf("Sessions(%q, %q, %d) total %d, want 5", c.prefix, c.worker, c.limit, n)
		}
	}
	rs, _ := h.f.Sessions("chat-1", "", 1)
	if rs[0].WorkerId != "b" || rs[0].TimeUnixNano != 500 {
		t.Fatalf("newest chat-1 record %v", rs[0])
	}
	rs[0].WorkerId = "mutated"
	if r, _ := h.f.Session("chat-1"); r.WorkerId != "b" {
		t.Fatalf("Sessions returned the FSM's own record")
	}
}

func TestRecordSessionsInvalidRefusesBatch(t *testing.T) {
	long := strings.Repeat("s", 257)
	for _, bad := range []*kvdirv1.SessionRecord{
		{SessionId: ""},
		{SessionId: long},
		{SessionId: "ok", WorkerId: long},
	} {
		h := newHarness(t, raftfsm.Options{})
		h.record(100, sess("old", "w", 1))
		before := h.f.Digest()
		res := h.record(200, sess("new1", "w", 1), bad, sess("old", "x", 2))
		errResult(t, res, raftfsm.ErrInvalid)
		if h.f.Digest() != before {
			t.Fatalf("refused batch (bad %.10q) changed the state", bad.SessionId)
		}
		if _, ok := h.f.Session("new1"); ok {
			t.Fatalf("session of a refused batch recorded")
		}
		if r, _ := h.f.Session("old"); r.WorkerId != "w" {
			t.Fatalf("refused batch replaced a session")
		}
	}
	// The bounds themselves are accepted.
	h := newHarness(t, raftfsm.Options{})
	if res := h.record(1, &kvdirv1.SessionRecord{SessionId: long[:256], WorkerId: long[:256]}); res != nil {
		t.Fatalf("256-byte ids refused: %v", res)
	}
}

func TestSessionChain(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 11, 12, 13), stored(12, gpu, 20)), stApplied)
	h.record(100, sess("s", "w", 20), sess("t", "w", 99))
	r, _ := h.f.Session("s")
	chain, ok := h.f.SessionChain(r)
	if !ok || !slices.Equal(chain, []uint64{11, 12, 20}) {
		t.Fatalf("SessionChain(s) = %v, %v; want [11 12 20], true", chain, ok)
	}
	r, _ = h.f.Session("t")
	if chain, ok := h.f.SessionChain(r); ok {
		t.Fatalf("SessionChain of an unindexed tail = %v, true", chain)
	}
	// Once the blocks are gone, the chain is gone.
	h.apply(tExpireWorker, &kvdirv1.ExpireWorkerCommand{WorkerId: "w", Epoch: 1})
	r, _ = h.f.Session("s")
	if chain, ok := h.f.SessionChain(r); ok {
		t.Fatalf("SessionChain after the blocks were removed = %v, true", chain)
	}
}

func TestMemberAPI(t *testing.T) {
	h := newHarness(t, raftfsm.Options{})
	if res := h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n1", ApiAddress: "10.0.0.1:7000"}); res != nil {
		t.Fatalf("member api: %v", res)
	}
	h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n2", ApiAddress: "10.0.0.2:7000"})
	h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n1", ApiAddress: "10.0.0.9:7000"})
	before := h.f.Digest()
	errResult(t, h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{ApiAddress: "x"}), raftfsm.ErrInvalid)
	errResult(t, h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: strings.Repeat("n", 257)}), raftfsm.ErrInvalid)
	errResult(t, h.apply(tMemberAPI, &kvdirv1.MemberAPICommand{Id: "n3", ApiAddress: strings.Repeat("a", 257)}), raftfsm.ErrInvalid)
	if h.f.Digest() != before {
		t.Fatalf("refused member commands changed the state")
	}
	m := h.f.Members()
	if len(m) != 2 || m["n1"] != "10.0.0.9:7000" || m["n2"] != "10.0.0.2:7000" {
		t.Fatalf("Members = %v", m)
	}
	m["n1"] = "mutated"
	if h.f.Members()["n1"] != "10.0.0.9:7000" {
		t.Fatalf("Members returned the FSM's own map")
	}
}
