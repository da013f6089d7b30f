// Package indexbench measures the block-prefix index and the content hash at
// the full shape of the project's figures (64 workers, 10 M (block, worker)
// entries, sharing factor 4): apply rate, match latency under writes, memory,
// snapshot throughput (kvbench index, make bench-index).
//
// It also builds the same contents, at a reduced scale, in
// github.com/armon/go-radix keyed by chain prefixes, to compare memory and
// match time with the specialised tree (see internal/radix/DESIGN.md).
package indexbench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
)

// Tool is the name the results carry.
const Tool = "index"

// Options shape a run. The zero value of a field means its default (see
// Defaults); Log may be nil.
type Options struct {
	// Scale is the fraction of the full shape's 10 M entries to build.
	Scale float64
	// Matches is the number of match queries timed under write load.
	Matches int
	// WriteRate is the block events per second applied while matches are
	// timed.
	WriteRate int
	// ChurnEvents is the number of block events timed for the apply rate.
	ChurnEvents int
	// GoRadixScale is the fraction of the full shape built in go-radix for
	// the comparison; negative skips it.
	GoRadixScale float64
	// ChainBlocks is the length of the matched chains, in blocks.
	ChainBlocks int
	// Workers is the pool size the contents are spread over (0: the full
	// shape's 64); the sharing factor stays the same.
	Workers int
	Log     *slog.Logger
}

// Defaults are the options of the committed figures.
var Defaults = Options{Scale: 1, Matches: 200_000, WriteRate: 100_000, ChurnEvents: 5_000_000, GoRadixScale: 0.005, ChainBlocks: 2048}

func (o Options) withDefaults() Options {
	d := o
	// A Scale that is not > 0, NaN included, is the default.
	if !(d.Scale > 0) {
		d.Scale = Defaults.Scale
	}
	benchopt.Default(&d.Matches, Defaults.Matches)
	benchopt.Default(&d.WriteRate, Defaults.WriteRate)
	benchopt.Default(&d.ChurnEvents, Defaults.ChurnEvents)
	// Only zero is the default: a negative GoRadixScale skips the comparison.
	d.GoRadixScale = cmp.Or(d.GoRadixScale, Defaults.GoRadixScale)
	benchopt.Default(&d.ChainBlocks, Defaults.ChainBlocks)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// Measures are a run's numbers, as the tool measured them. Their JSON names
// are the figure names (Results turns them into the envelope).
type Measures struct {
	Workers        int     `json:"workers"`
	Entries        int64   `json:"entries"`
	DistinctBlocks int64   `json:"distinct_blocks"`
	Sharing        float64 `json:"sharing_factor"`
	Sessions       int     `json:"sessions"`

	BuildEventsPerSec float64 `json:"build_events_per_sec"`
	ApplyEventsPerSec float64 `json:"apply_events_per_sec"`

	ChainBlocks       int     `json:"match_chain_blocks"`
	MatchP50us        float64 `json:"match_p50_us"`
	MatchP99us        float64 `json:"match_p99_us"`
	MatchP999us       float64 `json:"match_p999_us"`
	MatchMaxUs        float64 `json:"match_max_us"`
	MatchIdleP50us    float64 `json:"match_idle_p50_us"`
	MatchIdleP99us    float64 `json:"match_idle_p99_us"`
	WriterEventsPerS  float64 `json:"match_writer_events_per_sec"`
	MatchQueries      int     `json:"match_queries"`
	BytesPerEntry     float64 `json:"bytes_per_entry"`
	ApproxBytesPerEnt float64 `json:"approx_bytes_per_entry"`

	SnapshotBytes    int64   `json:"snapshot_bytes"`
	SnapshotWriteMBs float64 `json:"snapshot_write_mb_per_sec"`
	SnapshotReadMBs  float64 `json:"snapshot_read_mb_per_sec"`

	Hash32kUs float64 `json:"hash_32k_tokens_us"`

	GoRadix *GoRadixComparison `json:"goradix_comparison,omitempty"`
}

// Details are the envelope's details: the shape the figures were measured
// at.
type Details struct {
	Workers        int     `json:"workers"`
	Entries        int64   `json:"entries"`
	DistinctBlocks int64   `json:"distinct_blocks"`
	Sharing        float64 `json:"sharing_factor"`
	Sessions       int     `json:"sessions"`
	ChainBlocks    int     `json:"match_chain_blocks"`
	MatchQueries   int     `json:"match_queries"`
	// GoRadix is the shape of the go-radix comparison (its figures are
	// goradix_comparison.*).
	GoRadix *GoRadixShape `json:"goradix_comparison,omitempty"`
}

// GoRadixShape is the shape the go-radix comparison ran at.
type GoRadixShape struct {
	Entries        int64 `json:"entries"`
	DistinctBlocks int64 `json:"distinct_blocks"`
	ChainBlocks    int   `json:"match_chain_blocks"`
}

// GoRadixPrefix starts the names of the go-radix comparison's figures.
const GoRadixPrefix = "goradix_comparison."

// Results fills res (from benchjson.New) with m's figures and details.
func (m *Measures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	chain := fmt.Sprintf("%d-block chain", m.ChainBlocks)
	res.Figures = append(res.Figures,
		fig{Name: "build_events_per_sec", Unit: "events/s", Measured: m.BuildEventsPerSec,
			Note: "block events inserted into an empty index up to the shape, one goroutine"},
		fig{Name: "apply_events_per_sec", Unit: "events/s", Target: benchjson.Min(5_000_000), Measured: m.ApplyEventsPerSec,
			Note: "remove + re-insert of sessions in turns, as an engine evicts, one goroutine"},
		fig{Name: "match_p50_us", Unit: "µs", Target: benchjson.Max(10), Measured: m.MatchP50us, Note: "match of a " + chain + " while a writer applies block events"},
		fig{Name: "match_p99_us", Unit: "µs", Target: benchjson.Max(30), Measured: m.MatchP99us, Note: "same, p99"},
		fig{Name: "match_p999_us", Unit: "µs", Measured: m.MatchP999us, Note: "same, p99.9"},
		fig{Name: "match_max_us", Unit: "µs", Measured: m.MatchMaxUs, Note: "same, slowest"},
		fig{Name: "match_idle_p50_us", Unit: "µs", Measured: m.MatchIdleP50us, Note: "match of a " + chain + ", no writer"},
		fig{Name: "match_idle_p99_us", Unit: "µs", Measured: m.MatchIdleP99us, Note: "same, p99"},
		fig{Name: "match_writer_events_per_sec", Unit: "events/s", Measured: m.WriterEventsPerS, Note: "the write rate achieved while matches were timed"},
		fig{Name: "bytes_per_entry", Unit: "B", Target: benchjson.Max(40), Measured: m.BytesPerEntry, Note: "live heap after GC / (block, worker) entries"},
		fig{Name: "approx_bytes_per_entry", Unit: "B", Measured: m.ApproxBytesPerEnt, Note: "the index's own estimate of its size / entries"},
		fig{Name: "snapshot_bytes", Unit: "B", Measured: float64(m.SnapshotBytes), Note: "size of a snapshot of the index"},
		fig{Name: "snapshot_write_mb_per_sec", Unit: "MB/s", Target: benchjson.Min(200), Measured: m.SnapshotWriteMBs, Note: "snapshot written to memory, median of 9"},
		fig{Name: "snapshot_read_mb_per_sec", Unit: "MB/s", Target: benchjson.Min(200), Measured: m.SnapshotReadMBs, Note: "snapshot restored and verified, median of 9"},
		fig{Name: "hash_32k_tokens_us", Unit: "µs", Target: benchjson.Max(40), Measured: m.Hash32kUs, Note: "content hash of a 32,768-token prompt, block size 16, median"},
	)
	d := Details{Workers: m.Workers, Entries: m.Entries, DistinctBlocks: m.DistinctBlocks, Sharing: m.Sharing, Sessions: m.Sessions,
		ChainBlocks: m.ChainBlocks, MatchQueries: m.MatchQueries}
	if g := m.GoRadix; g != nil {
		d.GoRadix = &GoRadixShape{Entries: g.Entries, DistinctBlocks: g.DistinctBlocks, ChainBlocks: g.ChainBlocks}
		res.Figures = append(res.Figures,
			fig{Name: GoRadixPrefix + "tree_bytes_per_entry", Unit: "B", Measured: g.TreeBytesPerEntry, Note: "specialised tree, live heap / entries"},
			fig{Name: GoRadixPrefix + "goradix_bytes_per_entry", Unit: "B", Measured: g.GoRadixBytesPerEntry, Note: "go-radix keyed by chain prefixes, live heap / entries"},
			fig{Name: GoRadixPrefix + "goradix_key_bytes", Unit: "B", Measured: float64(g.GoRadixKeyBytes), Note: "go-radix's keys, summed"},
			fig{Name: GoRadixPrefix + "tree_match_p50_us", Unit: "µs", Measured: g.TreeMatchP50us, Note: "specialised tree, match p50"},
			fig{Name: GoRadixPrefix + "goradix_match_p50_us", Unit: "µs", Measured: g.GoRadixMatchP50us, Note: "go-radix WalkPath match p50"},
			fig{Name: GoRadixPrefix + "tree_build_seconds", Unit: "s", Measured: g.TreeBuildSeconds, Note: "specialised tree, build"},
			fig{Name: GoRadixPrefix + "goradix_build_seconds", Unit: "s", Measured: g.GoRadixBuildSeconds, Note: "go-radix, build"},
		)
	}
	return res.SetDetails(d)
}

// Run measures and returns the results (without their command, which the
// caller knows).
func Run(ctx context.Context, opts Options) (*benchjson.Results, error) {
	return benchjson.Measure(Tool, func() (*Measures, error) { return measure(ctx, opts.withDefaults()) })
}

func measure(ctx context.Context, cfg Options) (*Measures, error) {
	log := cfg.Log
	res := &Measures{ChainBlocks: cfg.ChainBlocks}
	res.Hash32kUs = hash32k()
	log.Info("content hash", "hash_32k_tokens_us", res.Hash32kUs)

	shape := radixtest.Full.Scaled(cfg.Scale)
	if cfg.Workers > 0 {
		shape.Workers = cfg.Workers
	}
	wl := radixtest.Generate(shape)
	iopts := radix.Options{MaxWorkers: max(shape.Workers, radix.DefaultMaxWorkers)}
	heapBefore := liveHeap()
	x := radix.New(iopts)
	start := time.Now()
	events, err := wl.Populate(x)
	if err != nil {
		return nil, fmt.Errorf("build the index: %w", err)
	}
	res.BuildEventsPerSec = float64(events) / time.Since(start).Seconds()
	heapAfter := liveHeap()
	st := x.Stats()
	res.Workers, res.Entries, res.DistinctBlocks, res.Sessions = st.Workers, st.Entries, st.Blocks, len(wl.Sessions)
	res.Sharing = float64(st.Entries) / float64(st.Blocks)
	res.BytesPerEntry = float64(heapAfter-heapBefore) / float64(st.Entries)
	res.ApproxBytesPerEnt = float64(st.ApproxBytes) / float64(st.Entries)
	log.Info("built", "entries", st.Entries, "distinct", st.Blocks, "bytes_per_entry", res.BytesPerEntry,
		"build_events_per_sec", res.BuildEventsPerSec)

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if res.ApplyEventsPerSec, err = applyRate(wl, x, cfg.ChurnEvents); err != nil {
		return nil, fmt.Errorf("apply rate: %w", err)
	}
	log.Info("apply", "events_per_sec", res.ApplyEventsPerSec)

	chains := longChains(wl, cfg.ChainBlocks)
	if len(chains) == 0 {
		return nil, errors.New("no session chain is long enough to match")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	idle, _, err := timeMatches(wl, x, chains, cfg.Matches/4, 0)
	if err != nil {
		return nil, fmt.Errorf("idle matches: %w", err)
	}
	res.MatchIdleP50us, res.MatchIdleP99us = pct(idle, 0.50), pct(idle, 0.99)
	busy, rate, err := timeMatches(wl, x, chains, cfg.Matches, cfg.WriteRate)
	if err != nil {
		return nil, fmt.Errorf("matches under writes: %w", err)
	}
	res.MatchQueries = len(busy)
	res.MatchP50us, res.MatchP99us, res.MatchP999us = pct(busy, 0.50), pct(busy, 0.99), pct(busy, 0.999)
	res.MatchMaxUs = pct(busy, 1)
	res.WriterEventsPerS = rate
	log.Info("match", "p50_us", res.MatchP50us, "p99_us", res.MatchP99us, "writer_events_per_sec", rate)

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := snapshots(x, iopts, res); err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	log.Info("snapshot", "bytes", res.SnapshotBytes, "write_mb_s", res.SnapshotWriteMBs, "read_mb_s", res.SnapshotReadMBs)

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.GoRadixScale > 0 {
		x = nil
		wl = nil
		runtime.GC()
		cmp, err := compareGoRadix(radixtest.Full.Scaled(cfg.GoRadixScale), cfg.ChainBlocks)
		if err != nil {
			return nil, err
		}
		res.GoRadix = cmp
		log.Info("go-radix comparison", "tree_bytes_per_entry", cmp.TreeBytesPerEntry, "goradix_bytes_per_entry", cmp.GoRadixBytesPerEntry)
	}
	return res, nil
}

// hash32k times the content hash of a 32,768-token prompt (median of runs).
func hash32k() float64 {
	h, err := blockhash.New(blockhash.Namespace{Model: "llama3-70b", BlockSize: 16})
	if err != nil {
		panic(err) // a constant namespace: cannot fail
	}
	r := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 32768)
	for i := range tokens {
		tokens[i] = uint32(r.IntN(128_000))
	}
	dst := make([]uint64, 0, 2048)
	var runs []time.Duration
	for range 3000 {
		t := time.Now()
		dst = h.Chain(dst[:0], tokens, nil)
		runs = append(runs, time.Since(t))
	}
	return pct(runs, 0.5)
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// applyRate removes sessions from a holder and inserts them back, tail first
// as an engine evicts, and returns block events per second.
func applyRate(wl *radixtest.Workload, x *radix.Index, target int) (float64, error) {
	events := 0
	start := time.Now()
	for i := 0; events < target; i++ {
		s := i % len(wl.Sessions)
		h := wl.Sessions[s].Holders[0]
		n, err := wl.RemoveSession(x, s, h)
		if err != nil {
			return 0, err
		}
		m, err := wl.InsertSession(x, s, h)
		if err != nil {
			return 0, err
		}
		events += n + m
	}
	return float64(events) / time.Since(start).Seconds(), nil
}

func longChains(wl *radixtest.Workload, n int) [][]uint64 {
	var out [][]uint64
	for i := range wl.Sessions {
		if c := wl.Chain(i, n); len(c) == n {
			out = append(out, c)
		}
	}
	return out
}

// timeMatches times n matches on one goroutine while another applies
// writeRate block events per second (none if 0). It returns the latencies and
// the write rate achieved.
func timeMatches(wl *radixtest.Workload, x *radix.Index, chains [][]uint64, n, writeRate int) ([]time.Duration, float64, error) {
	var (
		stop    atomic.Bool
		wg      sync.WaitGroup
		written int
		werr    error
	)
	start := time.Now()
	if writeRate > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The last turn of sessions in the second half (which the
			// matched chains, taken in order, mostly do not reach) is
			// removed and inserted back, paced to the target rate.
			turn := wl.Shape.TurnBlocks
			for i := 0; !stop.Load(); i++ {
				due := int(time.Since(start).Seconds() * float64(writeRate))
				if written >= due {
					time.Sleep(100 * time.Microsecond)
					continue
				}
				s := wl.Sessions[len(wl.Sessions)-1-i%(len(wl.Sessions)/2)]
				if len(s.Hashes) <= turn {
					continue
				}
				worker := radixtest.WorkerName(s.Holders[len(s.Holders)-1])
				tail := s.Hashes[len(s.Hashes)-turn:]
				if werr = x.Remove(worker, tail, radix.GPU); werr != nil {
					return
				}
				if werr = x.Insert(worker, s.Hashes[len(s.Hashes)-turn-1], tail, radix.GPU); werr != nil {
					return
				}
				written += 2 * len(tail)
			}
		}()
	}
	lat := make([]time.Duration, 0, n)
	var dst []radix.WorkerMatch
	var err error
	for i := range n {
		c := chains[i%len(chains)]
		t := time.Now()
		dst, err = x.MatchInto(dst, c)
		lat = append(lat, time.Since(t))
		if err != nil || len(dst) == 0 {
			stop.Store(true)
			wg.Wait()
			return nil, 0, fmt.Errorf("match returned %v, %v", dst, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	return lat, float64(written) / time.Since(start).Seconds(), werr
}

func snapshots(x *radix.Index, opts radix.Options, res *Measures) error {
	var buf bytes.Buffer
	n, err := x.WriteSnapshot(&buf)
	if err != nil {
		return err
	}
	res.SnapshotBytes = n
	const runs = 9
	var w, r []time.Duration
	for range runs {
		t := time.Now()
		if _, err := x.WriteSnapshot(io.Discard); err != nil {
			return err
		}
		w = append(w, time.Since(t))
		t = time.Now()
		y, err := radix.ReadSnapshot(bytes.NewReader(buf.Bytes()), opts)
		if err != nil {
			return err
		}
		r = append(r, time.Since(t))
		if y.Digest() != x.Digest() {
			return errors.New("snapshot round trip changed the digest")
		}
		y = nil
		runtime.GC()
	}
	mb := float64(n) / 1e6
	res.SnapshotWriteMBs = mb / (pct(w, 0.5) / 1e6)
	res.SnapshotReadMBs = mb / (pct(r, 0.5) / 1e6)
	return nil
}

// pct returns the q-quantile of ds in microseconds.
func pct(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return float64(s[i].Nanoseconds()) / 1e3
}
