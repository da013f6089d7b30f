package admission

import (
	"errors"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/placement"
)

func all(*Entry[int]) bool { return true }

func TestQueueFIFOPerSession(t *testing.T) {
	q := NewQueue[int](10, time.Minute)
	a1, _ := q.Push(0, "a", 1)
	b1, _ := q.Push(1, "b", 2)
	a2, _ := q.Push(2, "a", 3)
	// a1 does not fit anywhere: a2 must not overtake it, b1 may.
	fitsNotA1 := func(e *Entry[int]) bool { return e != a1 }
	if got := q.Next(3, fitsNotA1); got != b1 {
		t.Fatalf("first grant %v, want b1", got)
	}
	if got := q.Next(3, fitsNotA1); got != nil {
		t.Fatalf("a2 overtook a1: granted %v", got.Value)
	}
	if got := q.Next(3, all); got != a1 {
		t.Fatalf("grant %v, want a1", got)
	}
	// a1 granted and not done: a2 still waits, and a new request of a is busy.
	if !q.Busy("a") {
		t.Fatal("session a not busy with a1 granted and a2 queued")
	}
	if got := q.Next(3, all); got != nil {
		t.Fatalf("a2 granted before a1 was done: %v", got.Value)
	}
	q.Done(a1)
	if got := q.Next(3, all); got != a2 {
		t.Fatalf("grant %v, want a2", got)
	}
	q.Done(a2)
	q.Done(b1)
	if q.Len() != 0 || q.Busy("a") || q.Busy("b") {
		t.Fatalf("len %d busy a %v b %v after all done", q.Len(), q.Busy("a"), q.Busy("b"))
	}
}

func TestQueueNoSessionKeepsNoOrder(t *testing.T) {
	q := NewQueue[int](10, time.Minute)
	x, _ := q.Push(0, "", 1)
	y, _ := q.Push(0, "", 2)
	if got := q.Next(0, func(e *Entry[int]) bool { return e == y }); got != y {
		t.Fatalf("got %v, want y", got)
	}
	if q.Busy("") {
		t.Fatal(`"" counts as a session`)
	}
	if got := q.Next(0, all); got != x {
		t.Fatalf("got %v, want x", got)
	}
}

func TestQueueBounds(t *testing.T) {
	q := NewQueue[int](2, 10*time.Second)
	if _, err := q.Push(0, "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(time.Second, "b", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push(time.Second, "c", 3); !errors.Is(err, ErrFull) {
		t.Fatalf("third push: %v, want ErrFull", err)
	}
	if got := q.Expired(10*time.Second - 1); len(got) != 0 {
		t.Fatalf("expired %d before the max wait", len(got))
	}
	got := q.Expired(10 * time.Second)
	if len(got) != 1 || got[0].Value != 1 {
		t.Fatalf("expired %v, want the first entry", got)
	}
	if q.Len() != 1 || q.Busy("a") {
		t.Fatalf("len %d, busy a %v after expiry", q.Len(), q.Busy("a"))
	}
}

func TestQueueRemove(t *testing.T) {
	q := NewQueue[int](4, time.Minute)
	a1, _ := q.Push(0, "a", 1)
	a2, _ := q.Push(0, "a", 2)
	if !q.Remove(a1) {
		t.Fatal("remove of a queued entry said not queued")
	}
	if q.Remove(a1) {
		t.Fatal("second remove said queued")
	}
	if got := q.Next(0, all); got != a2 {
		t.Fatalf("after removing a1, grant %v, want a2", got)
	}
	if q.Remove(a2) {
		t.Fatal("remove of a granted entry said queued")
	}
	q.Done(a2)
	if q.Len() != 0 || q.Busy("a") {
		t.Fatalf("len %d busy %v: entries leaked", q.Len(), q.Busy("a"))
	}
}

func TestRetryAfter(t *testing.T) {
	q := NewQueue[int](100, 7500*time.Millisecond)
	if got := q.RetryAfter(0); got != 8*time.Second {
		t.Fatalf("no estimate: %v, want the max wait rounded up (8s)", got)
	}
	// 10 grants in 1 s: 10/s; 19 queued + 1 → 2 s.
	for i := range 10 {
		q.Push(0, "", i)
		q.Next(time.Duration(i)*100*time.Millisecond, all)
	}
	for i := range 19 {
		q.Push(time.Second, "", i)
	}
	if got := q.RetryAfter(time.Second); got != 2*time.Second {
		t.Fatalf("RetryAfter %v, want 2s (20 at 10/s)", got)
	}
	// A fast drain still says at least a second.
	q2 := NewQueue[int](100, time.Minute)
	for i := range 32 {
		q2.Push(0, "", i)
		q2.Next(time.Duration(i)*time.Microsecond, all)
	}
	if got := q2.RetryAfter(time.Millisecond); got != time.Second {
		t.Fatalf("RetryAfter %v, want the 1s floor", got)
	}
}

func TestKnee(t *testing.T) {
	prof, err := costmodel.ProfileByName("llama3-70b")
	if err != nil {
		t.Fatal(err)
	}
	k := NewKnee(prof, 8192)
	if k.Limit() != 16384 {
		t.Fatalf("limit %d, want two 8192-token steps", k.Limit())
	}
	// The calibration: a 2,048-token chunk of llama3-70b is about 490 ms.
	if iv := NewKnee(prof, 2048).Interval(); iv < 800*time.Millisecond || iv > 1200*time.Millisecond {
		t.Fatalf("interval %v: two 2k chunks of llama3-70b should be about a second", iv)
	}
	cases := []struct {
		l    placement.Load
		p    int
		past bool
	}{
		{placement.Load{}, 4000, false},
		{placement.Load{QueuedPrefillTokens: 16384}, 4000, false},
		{placement.Load{QueuedPrefillTokens: 16385}, 4000, true},
		{placement.Load{Waiting: 4}, 4000, false},   // 16000 tokens
		{placement.Load{Waiting: 5}, 4000, true},    // 20000
		{placement.Load{Waiting: 1}, 20000, true},   // one request bigger than the interval
		{placement.Load{Waiting: -3}, 20000, false}, // nonsense gauge
	}
	for _, c := range cases {
		if got := k.Past(c.l, c.p); got != c.past {
			t.Errorf("Past(%+v, %d) = %v, want %v", c.l, c.p, got, c.past)
		}
	}
	busy := placement.Candidate{Load: placement.Load{QueuedPrefillTokens: 1 << 20}}
	idle := placement.Candidate{}
	if !k.AllPast([]placement.Candidate{busy, busy}, 100) || k.AllPast([]placement.Candidate{busy, idle}, 100) || k.AllPast(nil, 100) {
		t.Fatal("AllPast: want true only when every candidate is past")
	}
}
