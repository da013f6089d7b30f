package radix_test

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
)

// The Go benchmarks run on a tenth of the full shape (1 M entries) so that
// their set-up stays short; `make bench-index` measures the full shape.
var (
	benchOnce  sync.Once
	benchLoad  *radixtest.Workload
	benchIndex *radix.Index
)

func benchSetup(b *testing.B) (*radixtest.Workload, *radix.Index) {
	benchOnce.Do(func() {
		benchLoad = radixtest.Generate(radixtest.Full.Scaled(0.1))
		benchIndex = radix.New(radix.Options{})
		if _, err := benchLoad.Populate(benchIndex); err != nil {
			b.Fatal(err)
		}
	})
	return benchLoad, benchIndex
}

// BenchmarkChurn removes a session from one of its holders and inserts it
// back; it reports block events per second.
func BenchmarkChurn(b *testing.B) {
	w, x := benchSetup(b)
	events := 0
	for i := 0; b.Loop(); i++ {
		s := i % len(w.Sessions)
		h := w.Sessions[s].Holders[0]
		n, err := w.RemoveSession(x, s, h)
		if err != nil {
			b.Fatal(err)
		}
		m, err := w.InsertSession(x, s, h)
		if err != nil {
			b.Fatal(err)
		}
		events += n + m
	}
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkMatch2048 matches 2,048-block chains of sessions long enough.
func BenchmarkMatch2048(b *testing.B) {
	w, x := benchSetup(b)
	benchMatch(b, w, x)
}

// BenchmarkMatchPool matches 2,048-block chains on a tenth of the full shape
// spread over pools of several sizes (same sharing factor).
func BenchmarkMatchPool(b *testing.B) {
	for _, n := range []int{64, 1024, 4096, 16384} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			shape := radixtest.Full.Scaled(0.1)
			shape.Workers = n
			w := radixtest.Generate(shape)
			x := radix.New(radix.Options{MaxWorkers: n})
			if _, err := w.Populate(x); err != nil {
				b.Fatal(err)
			}
			benchMatch(b, w, x)
		})
	}
}

func benchMatch(b *testing.B, w *radixtest.Workload, x *radix.Index) {
	var chains [][]uint64
	for i := range w.Sessions {
		if c := w.Chain(i, 2048); len(c) == 2048 {
			chains = append(chains, c)
		}
	}
	var dst []radix.WorkerMatch
	var err error
	for i := 0; b.Loop(); i++ {
		if dst, err = x.MatchInto(dst, chains[i%len(chains)]); err != nil || len(dst) == 0 {
			b.Fatalf("match: %v %v", dst, err)
		}
	}
}

func BenchmarkSnapshotWrite(b *testing.B) {
	_, x := benchSetup(b)
	n, err := x.WriteSnapshot(io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(n)
	for b.Loop() {
		if _, err := x.WriteSnapshot(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSnapshotRead(b *testing.B) {
	_, x := benchSetup(b)
	var buf bytes.Buffer
	if _, err := x.WriteSnapshot(&buf); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		if _, err := radix.ReadSnapshot(bytes.NewReader(buf.Bytes()), radix.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWidePrefix is the holder sets' worst shape: a 512-block prefix
// held by a whole pool, each worker holding a prefix of its own length (as
// staggered LRU evictions leave it), so that every block has its own large
// holder set. It reports the index's live heap per (block, worker) entry and
// times the match of the whole prefix.
func BenchmarkWidePrefix(b *testing.B) {
	for _, n := range []int{64, 1024, 4096, 16384} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			const blocks = 512
			chain := make([]uint64, blocks)
			for i := range chain {
				chain[i] = uint64(i+1) * 0x9e3779b97f4a7c15
			}
			before := liveHeap()
			x := radix.New(radix.Options{MaxWorkers: n})
			for w := range n {
				if err := x.Insert(radixtest.WorkerName(w), radix.Root, chain[:blocks-w%blocks], radix.GPU); err != nil {
					b.Fatal(err)
				}
			}
			heap := liveHeap() - before
			st := x.Stats()
			var dst []radix.WorkerMatch
			var err error
			for b.Loop() {
				if dst, err = x.MatchInto(dst, chain); err != nil || len(dst) != n {
					b.Fatalf("match: %d rows, %v", len(dst), err)
				}
			}
			b.ReportMetric(float64(heap)/float64(st.Entries), "B/entry")
			b.ReportMetric(float64(st.HolderSets), "sets")
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkInsertInterleaved builds the index the way a directory's state
// machine does under a pool publishing at once: every worker's pieces (its
// system prompts, then its sessions turn by turn) cut into its batches of at
// most 256 blocks, and the workers' batches applied in turn, one batch of
// each worker after the other, for pools of 64 and 1,024 workers. It
// reports block events per second.
func BenchmarkInsertInterleaved(b *testing.B) {
	for _, pool := range []int{64, 1024} {
		b.Run(fmt.Sprintf("workers=%d", pool), func(b *testing.B) {
			shape := radixtest.Full.Scaled(0.2)
			shape.Workers = pool
			batches := interleavedBatches(radixtest.Generate(shape), 256)
			events := 0
			for b.Loop() {
				x := radix.New(radix.Options{})
				for _, bt := range batches {
					for _, p := range bt.pieces {
						if err := x.Insert(bt.worker, p.Parent, p.Hashes, radix.GPU); err != nil {
							b.Fatal(err)
						}
						events += len(p.Hashes)
					}
				}
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

type benchBatch struct {
	worker string
	pieces []radixtest.Piece
}

// interleavedBatches cuts each worker's pieces into batches of at most max
// blocks and orders them one batch per worker in turn.
func interleavedBatches(w *radixtest.Workload, max int) []benchBatch {
	pieces := w.Pieces()
	perWorker := make([][]benchBatch, len(pieces))
	for wk, ps := range pieces {
		n := 0
		for _, p := range ps {
			bs := perWorker[wk]
			if len(bs) == 0 || n+len(p.Hashes) > max {
				perWorker[wk] = append(bs, benchBatch{worker: radixtest.WorkerName(wk)})
				n = 0
			}
			last := &perWorker[wk][len(perWorker[wk])-1]
			last.pieces = append(last.pieces, p)
			n += len(p.Hashes)
		}
	}
	var out []benchBatch
	for round := 0; ; round++ {
		added := false
		for _, bs := range perWorker {
			if round < len(bs) {
				out = append(out, bs[round])
				added = true
			}
		}
		if !added {
			return out
		}
	}
}
