package node

import (
	"bytes"
	"errors"
	"testing"
)

// drain takes every chunk of c and checks the labels: the index on every
// chunk, Last on the final one only.
func drain(t *testing.T, c *snapChunks, index uint64) ([][]byte, error) {
	t.Helper()
	var out [][]byte
	for {
		chunk, last, idx, err := c.next(nil)
		if err != nil {
			return out, err
		}
		if idx != index {
			t.Fatalf("chunk %d labelled index %d, want %d", len(out), idx, index)
		}
		out = append(out, chunk)
		if last {
			return out, nil
		}
	}
}

func TestSnapChunksSplitsAndLabels(t *testing.T) {
	data := make([]byte, 2*followChunkBytes+followChunkBytes/3)
	for i := range data {
		data[i] = byte(i * 7)
	}
	c := newSnapChunks()
	c.begin(42)
	// Written in odd pieces, as the encoder's buffers flush.
	for rest := data; len(rest) > 0; {
		n := min(len(rest), 300_001)
		if _, err := c.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	c.close(nil)
	chunks, err := drain(t, c, 42)
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) != 3 || len(chunks[0]) != followChunkBytes || len(chunks[1]) != followChunkBytes {
		t.Fatalf("chunk sizes %d, %d, ... of %d chunks; want 3, the first two of %d", len(chunks[0]), len(chunks[1]), len(chunks), followChunkBytes)
	}
	if got := bytes.Join(chunks, nil); !bytes.Equal(got, data) {
		t.Fatal("the chunks do not add up to what was written")
	}
}

func TestSnapChunksHoldsBackUntilTheEndIsKnown(t *testing.T) {
	c := newSnapChunks()
	c.begin(7)
	if _, err := c.Write(make([]byte, followChunkBytes)); err != nil {
		t.Fatal(err)
	}
	// One full chunk, the encoder still going: whether it is the last is
	// not known yet, so it is not handed out.
	stop := make(chan struct{})
	close(stop)
	if chunk, _, _, err := c.next(stop); chunk != nil || err != nil {
		t.Fatalf("a chunk (%d bytes, %v) was handed out before it was known whether it is the last", len(chunk), err)
	}
	c.close(nil)
	chunks, err := drain(t, c, 7)
	if err != nil || len(chunks) != 1 || len(chunks[0]) != followChunkBytes {
		t.Fatalf("after the end: %d chunks, %v; want the one full chunk, last", len(chunks), err)
	}
}

func TestSnapChunksEmptyStateAndErrors(t *testing.T) {
	c := newSnapChunks()
	c.begin(0)
	c.close(nil)
	chunks, err := drain(t, c, 0)
	if err != nil || len(chunks) != 1 || chunks[0] == nil || len(chunks[0]) != 0 {
		t.Fatalf("nothing written: %d chunks, %v; want one empty chunk, last", len(chunks), err)
	}

	boom := errors.New("encoder failed")
	c = newSnapChunks()
	c.begin(3)
	_, _ = c.Write(make([]byte, 2*followChunkBytes))
	c.close(boom)
	if _, err := drain(t, c, 3); !errors.Is(err, boom) {
		t.Fatalf("after an encoder error: %v, want it", err)
	}
}
