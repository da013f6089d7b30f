package follow

import (
	"io"
	"time"

	"github.com/kvdir/kvdir/internal/raftfsm"
)

// restoreQueue is how many snapshot chunks may wait for the decoder: the
// stream receives ahead of the decoder by at most this many (1 MiB each
// from a node), so a snapshot is never held whole.
const restoreQueue = 8

// restore decodes a snapshot while its chunks arrive. The stream's
// goroutine hands each chunk over (add); the state machine's Restore reads
// them on a goroutine of its own, so that decoding overlaps the transfer.
// Restore swaps the new state in only once all of it has been read and
// checked, so a snapshot that breaks off leaves the state as it was.
type restore struct {
	index  uint64
	bytes  int64
	start  time.Time
	chunks chan []byte
	done   chan struct{} // closed once Restore returned
	err    error         // Restore's result, once done is closed

	// The reader's side: the chunk being read, and what Read returns once
	// chunks is closed (set before it is closed).
	cur    []byte
	endErr error
}

func startRestore(fsm *raftfsm.FSM, index uint64) *restore {
	r := &restore{index: index, start: time.Now(), chunks: make(chan []byte, restoreQueue), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = fsm.Restore(io.NopCloser(r))
	}()
	return r
}

// add hands one chunk to the decoder. It returns false when Restore has
// already returned: the snapshot was refused, or ended before its last
// chunk.
func (r *restore) add(b []byte) bool {
	r.bytes += int64(len(b))
	select {
	case r.chunks <- b:
		return true
	case <-r.done:
		return false
	}
}

// finish ends the input, with io.EOF after the last chunk or with why the
// stream broke off, and returns Restore's result.
func (r *restore) finish(end error) error {
	r.endErr = end
	close(r.chunks)
	<-r.done
	return r.err
}

// Read is what Restore reads from: the chunks in order.
func (r *restore) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		b, ok := <-r.chunks
		if !ok {
			return 0, r.endErr
		}
		r.cur = b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}
