package node

import (
	"testing"

	"github.com/hashicorp/raft"
)

func logs(from, to uint64, size int) []*raft.Log {
	var out []*raft.Log
	for i := from; i <= to; i++ {
		out = append(out, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: make([]byte, size)})
	}
	return out
}

func indexes(t *testing.T, f *feed, after uint64) []uint64 {
	t.Helper()
	es, behind, _, closed := f.read(after)
	if behind || closed {
		t.Fatalf("read after %d: behind %v closed %v", after, behind, closed)
	}
	var out []uint64
	for _, e := range es {
		out = append(out, e.Index)
	}
	return out
}

func TestFeedBoundsAndBehind(t *testing.T) {
	f := newFeed(4, 1<<20)
	f.push(logs(1, 3, 1))
	f.push(logs(5, 7, 1)) // index 4 was no command: a gap in indexes is no loss
	if got := indexes(t, f, 2); len(got) != 4 || got[0] != 3 || got[3] != 7 {
		t.Fatalf("after 2: %v, want [3 5 6 7]", got)
	}
	// Six pushed, bound four: 1 and 2 are gone, so a reader after 1 is behind.
	if _, behind, _, _ := f.read(1); !behind {
		t.Fatal("a reader after index 1 (dropped) is not told it is behind")
	}
	if got := indexes(t, f, 7); len(got) != 0 {
		t.Fatalf("after the newest: %v, want none", got)
	}

	// Bytes bound: three entries of 10 bytes in a 25-byte feed keep two.
	b := newFeed(100, 25)
	b.push(logs(1, 3, 10))
	if _, behind, _, _ := b.read(0); !behind {
		t.Fatal("bytes bound: a reader after index 0 (1 dropped) is not behind")
	}
	if got := indexes(t, b, 1); len(got) != 2 || got[0] != 2 {
		t.Fatalf("bytes bound, after 1: %v, want [2 3]", got)
	}
}

func TestFeedWakesAndResets(t *testing.T) {
	f := newFeed(0, 0)
	_, _, wake, _ := f.read(0)
	select {
	case <-wake:
		t.Fatal("woken before any entry")
	default:
	}
	f.push(logs(1, 1, 1))
	select {
	case <-wake:
	default:
		t.Fatal("not woken by a push")
	}
	f.reset(10) // a snapshot at 10 replaced the state
	if _, behind, _, _ := f.read(5); !behind {
		t.Fatal("a reader after 5 is not behind a restore at 10")
	}
	if got := indexes(t, f, 10); len(got) != 0 {
		t.Fatalf("after a reset: %v, want none", got)
	}
	f.push(logs(11, 12, 1))
	if got := indexes(t, f, 10); len(got) != 2 || got[0] != 11 {
		t.Fatalf("after 10: %v, want [11 12]", got)
	}
	f.close()
	if _, _, _, closed := f.read(10); !closed {
		t.Fatal("read after close is not told so")
	}
	// The state machine may still apply while the node shuts down.
	f.push(logs(13, 13, 1))
	f.reset(20)
}
