package node

import (
	"sync"
)

// watchHub fans worker changes out to WatchWorkers streams. The state
// machine calls changed on its apply path, so changed never blocks: a
// subscriber that falls behind is marked for a full resend instead.
type watchHub struct {
	mu     sync.Mutex
	subs   map[*watcher]struct{}
	closed bool
}

type watcher struct {
	ch chan []string // ids changed; nil means "everything"
}

func newWatchHub() *watchHub { return &watchHub{subs: make(map[*watcher]struct{})} }

func (h *watchHub) subscribe() *watcher {
	w := &watcher{ch: make(chan []string, 64)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(w.ch)
		return w
	}
	h.subs[w] = struct{}{}
	return w
}

func (h *watchHub) unsubscribe(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[w]; ok {
		delete(h.subs, w)
		close(w.ch)
	}
}

// changed is the state machine's OnWorkersChanged hook. ids nil means the
// whole state was replaced (a snapshot restore).
func (h *watchHub) changed(ids []string, _ uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.subs {
		select {
		case w.ch <- ids:
		default:
			// Full: drop what is queued and ask for everything.
			for len(w.ch) > 0 {
				<-w.ch
			}
			w.ch <- nil
		}
	}
}

func (h *watchHub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for w := range h.subs {
		delete(h.subs, w)
		close(w.ch)
	}
}
