package admission

import (
	"container/list"
	"errors"
	"time"
)

// ErrFull is returned by [Queue.Push] when the queue holds its maximum.
var ErrFull = errors.New("admission: queue full")

// scanLimit bounds the entries [Queue.Next] looks at past the first: a
// long queue of requests that fit nowhere costs a wake-up no more than this.
const scanLimit = 128

// drainSamples is how many recent grants estimate the drain rate.
const drainSamples = 32

// Entry is one held request.
type Entry[T any] struct {
	Value    T
	Session  string        // "" for none: no order is kept with other entries
	Enqueued time.Duration // when it was pushed, on the queue's clock
	elem     *list.Element
}

// Queue is a bounded queue of held requests, oldest first, that keeps each
// session's requests in order: an entry is granted only when no earlier
// entry of its session is queued or granted and not yet done.
//
// Times are durations on the caller's clock (virtual time in the
// simulator, time since a fixed instant in the router). Queue is not safe
// for concurrent use: the router locks around it.
type Queue[T any] struct {
	max     int
	maxWait time.Duration
	l       list.List
	queued  map[string]int // session -> entries queued
	granted map[string]int // session -> entries granted and not done
	grants  [drainSamples]time.Duration
	ngrants int
}

// NewQueue returns a queue of at most maxLen entries (at least 1), each
// waiting at most maxWait (> 0).
func NewQueue[T any](maxLen int, maxWait time.Duration) *Queue[T] {
	return &Queue[T]{max: max(maxLen, 1), maxWait: maxWait, queued: map[string]int{}, granted: map[string]int{}}
}

// Len returns the number of queued entries.
func (q *Queue[T]) Len() int { return q.l.Len() }

// Cap returns the most entries the queue holds.
func (q *Queue[T]) Cap() int { return q.max }

// MaxWait returns the longest an entry may wait.
func (q *Queue[T]) MaxWait() time.Duration { return q.maxWait }

// Busy reports whether session has an entry queued, or granted and not
// done: a new request of the session must queue behind it.
func (q *Queue[T]) Busy(session string) bool {
	return session != "" && (q.queued[session] > 0 || q.granted[session] > 0)
}

// Push queues v for session at now, or fails with ErrFull.
func (q *Queue[T]) Push(now time.Duration, session string, v T) (*Entry[T], error) {
	if q.l.Len() >= q.max {
		return nil, ErrFull
	}
	e := &Entry[T]{Value: v, Session: session, Enqueued: now}
	e.elem = q.l.PushBack(e)
	if session != "" {
		q.queued[session]++
	}
	return e, nil
}

// Next grants the oldest entry that fits and whose session has no earlier
// entry queued or granted, removes it from the queue and returns it; nil
// when none does. The caller places the granted request and then calls
// Done.
func (q *Queue[T]) Next(now time.Duration, fits func(*Entry[T]) bool) *Entry[T] {
	var blocked map[string]bool
	n := 0
	for el := q.l.Front(); el != nil && n <= scanLimit; el, n = el.Next(), n+1 {
		e := el.Value.(*Entry[T])
		if e.Session != "" && (q.granted[e.Session] > 0 || blocked[e.Session]) {
			continue
		}
		if fits(e) {
			q.unlink(e)
			if e.Session != "" {
				q.granted[e.Session]++
			}
			q.grants[q.ngrants%drainSamples] = now
			q.ngrants++
			return e
		}
		if e.Session != "" {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[e.Session] = true
		}
	}
	return nil
}

// Done marks a granted entry's request placed (or failed): its session's
// next entry may be granted.
func (q *Queue[T]) Done(e *Entry[T]) {
	if e.Session == "" {
		return
	}
	if q.granted[e.Session]--; q.granted[e.Session] <= 0 {
		delete(q.granted, e.Session)
	}
}

// Remove takes a queued entry out (its client went away, or it waited too
// long) and reports whether it was queued; false means it was granted
// already (or removed before).
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	if e.elem == nil {
		return false
	}
	q.unlink(e)
	return true
}

// Expired removes and returns the entries that have waited maxWait or
// longer at now, oldest first.
func (q *Queue[T]) Expired(now time.Duration) []*Entry[T] {
	var out []*Entry[T]
	for el := q.l.Front(); el != nil; el = q.l.Front() {
		e := el.Value.(*Entry[T])
		if now-e.Enqueued < q.maxWait {
			break
		}
		q.unlink(e)
		out = append(out, e)
	}
	return out
}

// unlink takes e off the list and its session's queued count.
func (q *Queue[T]) unlink(e *Entry[T]) {
	q.l.Remove(e.elem)
	e.elem = nil
	if e.Session != "" {
		if q.queued[e.Session]--; q.queued[e.Session] <= 0 {
			delete(q.queued, e.Session)
		}
	}
}

// DrainRate is the queue's recent grants per second at now: the last
// grants (up to 32) over the time since the oldest of them; 0 before the
// first.
func (q *Queue[T]) DrainRate(now time.Duration) float64 {
	n := min(q.ngrants, drainSamples)
	if n == 0 {
		return 0
	}
	oldest := q.grants[(q.ngrants-n)%drainSamples]
	span := now - oldest
	if span <= 0 {
		span = time.Millisecond
	}
	return float64(n) / span.Seconds()
}

// RetryAfter estimates when a request refused at now could be taken: the
// time to drain the queue and one more at DrainRate, rounded up to whole
// seconds and at least one; MaxWait (rounded up) before any estimate, as
// a full queue that drained nothing yet empties no sooner than its
// requests give up.
func (q *Queue[T]) RetryAfter(now time.Duration) time.Duration {
	d := q.maxWait
	if r := q.DrainRate(now); r > 0 {
		d = time.Duration(float64(q.l.Len()+1) / r * float64(time.Second))
	}
	secs := (d + time.Second - 1) / time.Second
	return max(secs, 1) * time.Second
}
