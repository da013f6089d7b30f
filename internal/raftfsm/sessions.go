package raftfsm

import (
	"cmp"
	"container/list"
	"slices"
	"strings"

	goradix "github.com/armon/go-radix"
	"github.com/zeebo/xxh3"
	"google.golang.org/protobuf/proto"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// sessionTable holds sessions by id in a string radix tree, for look-ups by
// session-id prefix, and in a list ordered by when each was last recorded,
// for eviction. It keeps an order-independent digest of its records.
type sessionTable struct {
	byID   *goradix.Tree // session id -> *list.Element holding *kvdirv1.SessionRecord
	order  *list.List    // least recently recorded first
	digest uint64
}

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
	if v, ok := t.byID.Get(r.SessionId); ok {
		e := v.(*list.Element)
		t.digest -= recordHash(e.Value.(*kvdirv1.SessionRecord))
		e.Value = r
		t.order.MoveToBack(e)
	} else {
		t.byID.Insert(r.SessionId, t.order.PushBack(r))
	}
	t.digest += recordHash(r)
}

func (t *sessionTable) remove(e *list.Element) {
	r := e.Value.(*kvdirv1.SessionRecord)
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
		if e.Value.(*kvdirv1.SessionRecord).TimeUnixNano < unixNano {
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
	return v.(*list.Element).Value.(*kvdirv1.SessionRecord), true
}

// withPrefix returns up to limit sessions whose id starts with prefix and
// that went to worker (any worker if empty), most recently recorded first.
func (t *sessionTable) withPrefix(prefix, worker string, limit int) []*kvdirv1.SessionRecord {
	var out []*kvdirv1.SessionRecord
	if prefix == "" {
		for e := t.order.Back(); e != nil && len(out) < limit; e = e.Prev() {
			if r := e.Value.(*kvdirv1.SessionRecord); worker == "" || r.WorkerId == worker {
				out = append(out, r)
			}
		}
		return out
	}
	t.byID.WalkPrefix(prefix, func(_ string, v any) bool {
		if r := v.(*list.Element).Value.(*kvdirv1.SessionRecord); worker == "" || r.WorkerId == worker {
			out = append(out, r)
		}
		return false
	})
	slices.SortFunc(out, func(a, b *kvdirv1.SessionRecord) int {
		if c := cmp.Compare(b.TimeUnixNano, a.TimeUnixNano); c != 0 {
			return c
		}
		return strings.Compare(a.SessionId, b.SessionId)
	})
	return out[:min(len(out), limit)]
}
