package raftfsm

import (
	"cmp"
	"container/list"
	"slices"

	goradix "github.com/armon/go-radix"
	"github.com/zeebo/xxh3"
	"google.golang.org/protobuf/proto"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// sessionTable holds sessions by id in a string radix tree, for look-ups by
// session-id prefix, and in a list ordered by when each was last recorded,
// for eviction and listing. It keeps an order-independent digest of its
// records.
type sessionTable struct {
	byID   *goradix.Tree // session id -> *list.Element holding *sessionEntry
	order  *list.List    // least recently recorded first
	seq    uint64        // recording counter
	digest uint64
}

// sessionEntry is a record and when it was recorded, in recording order.
type sessionEntry struct {
	rec *kvdirv1.SessionRecord
	seq uint64
}

func entryOf(e *list.Element) *sessionEntry { return e.Value.(*sessionEntry) }

func newSessionTable() *sessionTable {
	return &sessionTable{byID: goradix.New(), order: list.New()}
}

func (t *sessionTable) len() int { return t.order.Len() }

// recordHash is one record's share of the digest.
func recordHash(r *kvdirv1.SessionRecord) uint64 {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r) // a valid message always encodes
	return xxh3.Hash(b)
}

// put records r, replacing any record of the same session, as the most
// recent.
func (t *sessionTable) put(r *kvdirv1.SessionRecord) {
	t.seq++
	if v, ok := t.byID.Get(r.SessionId); ok {
		e := v.(*list.Element)
		t.digest -= recordHash(entryOf(e).rec)
		e.Value = &sessionEntry{rec: r, seq: t.seq}
		t.order.MoveToBack(e)
	} else {
		t.byID.Insert(r.SessionId, t.order.PushBack(&sessionEntry{rec: r, seq: t.seq}))
	}
	t.digest += recordHash(r)
}

func (t *sessionTable) remove(e *list.Element) {
	r := entryOf(e).rec
	t.digest -= recordHash(r)
	t.byID.Delete(r.SessionId)
	t.order.Remove(e)
}

// evictOver drops the least recently recorded sessions beyond max.
func (t *sessionTable) evictOver(max int) {
	for t.order.Len() > max {
		t.remove(t.order.Front())
	}
}

// expireBefore drops sessions last recorded before the given time.
func (t *sessionTable) expireBefore(unixNano int64) {
	for e := t.order.Front(); e != nil; {
		next := e.Next()
		if entryOf(e).rec.TimeUnixNano < unixNano {
			t.remove(e)
		}
		e = next
	}
}

func (t *sessionTable) get(id string) (*kvdirv1.SessionRecord, bool) {
	v, ok := t.byID.Get(id)
	if !ok {
		return nil, false
	}
	return entryOf(v.(*list.Element)).rec, true
}

// withPrefix returns up to limit sessions whose id starts with prefix and
// that went to worker (any worker if empty), most recently recorded first.
func (t *sessionTable) withPrefix(prefix, worker string, limit int) []*kvdirv1.SessionRecord {
	if limit <= 0 {
		return nil
	}
	var out []*kvdirv1.SessionRecord
	if prefix == "" {
		for e := t.order.Back(); e != nil && len(out) < limit; e = e.Prev() {
			if r := entryOf(e).rec; worker == "" || r.WorkerId == worker {
				out = append(out, r)
			}
		}
		return out
	}
	var found []*sessionEntry
	t.byID.WalkPrefix(prefix, func(_ string, v any) bool {
		if se := entryOf(v.(*list.Element)); worker == "" || se.rec.WorkerId == worker {
			found = append(found, se)
		}
		return false
	})
	slices.SortFunc(found, func(a, b *sessionEntry) int { return cmp.Compare(b.seq, a.seq) })
	for _, se := range found[:min(len(found), limit)] {
		out = append(out, se.rec)
	}
	return out
}
