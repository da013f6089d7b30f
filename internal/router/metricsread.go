package router

import (
	"context"
	"sync"
	"time"
)

// sharedReads shares one read of an engine's /metrics among the workers at
// its address: the data-parallel ranks behind one API server are several
// workers at one address, and each reads its own rank's series from the
// same exposition. A read is reused by the workers that scrape within
// fresh of it, so the engine is read about once per interval, not once per
// rank.
type sharedReads struct {
	fresh time.Duration

	mu     sync.Mutex
	byAddr map[string]*sharedRead
}

// sharedRead is the latest read of one address; its token (a one-slot
// channel) is held while reading, so that workers arriving meanwhile wait
// for that read instead of reading too.
type sharedRead struct {
	token chan struct{}
	at    time.Time // when the read ended; zero before the first
	body  []byte
	err   error
}

func newSharedReads(fresh time.Duration) *sharedReads {
	return &sharedReads{fresh: fresh, byAddr: map[string]*sharedRead{}}
}

// get returns the body of a read of address made within fresh, or reads it
// now with read. ctx bounds the wait for another worker's read.
func (r *sharedReads) get(ctx context.Context, address string, read func() ([]byte, error)) ([]byte, error) {
	r.mu.Lock()
	e := r.byAddr[address]
	if e == nil {
		r.prune()
		e = &sharedRead{token: make(chan struct{}, 1)}
		r.byAddr[address] = e
	}
	r.mu.Unlock()
	select {
	case e.token <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-e.token }()
	if !e.at.IsZero() && time.Since(e.at) < r.fresh {
		return e.body, e.err
	}
	e.body, e.err = read()
	e.at = time.Now()
	return e.body, e.err
}

// prune drops the reads of addresses nobody read for a long time (workers
// that left); r.mu is held.
func (r *sharedReads) prune() {
	if len(r.byAddr) < 64 {
		return
	}
	for addr, e := range r.byAddr {
		select {
		case e.token <- struct{}{}:
			if time.Since(e.at) > 100*r.fresh {
				delete(r.byAddr, addr)
			}
			<-e.token
		default: // being read: in use
		}
	}
}
