// Command indexbench measures the block-prefix index and the content hash at
// the full shape of the project's figures (64 workers, 10 M (block, worker)
// entries, sharing factor 4) and writes the figures as JSON.
//
//	go run ./bench/cmd/indexbench -out bench/results/index.json
//
// It also builds the same contents, at a reduced scale, in
// github.com/armon/go-radix keyed by chain prefixes, to compare memory and
// match time with the specialised tree (see internal/radix/DESIGN.md).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
)

func main() {
	var (
		out        = flag.String("out", "bench/results/index.json", "where to write the JSON figures (- for stdout)")
		scale      = flag.Float64("scale", 1, "fraction of the full shape's 10 M entries to build")
		matches    = flag.Int("matches", 200_000, "match queries to time under write load")
		writeRate  = flag.Int("write-rate", 100_000, "block events per second applied while matches are timed")
		churn      = flag.Int("churn-events", 5_000_000, "block events to time for the apply rate")
		goradix    = flag.Float64("goradix-scale", 0.005, "fraction of the full shape to build in go-radix for the comparison (0 to skip)")
		chainBlock = flag.Int("chain", 2048, "blocks per matched chain")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: indexbench [flags]\n\n"+
			"Measures the block-prefix index (apply rate, match latency under writes, memory,\n"+
			"snapshot throughput) and the content hash, and writes the figures as JSON.\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	res, err := run(log, config{
		scale: *scale, matches: *matches, writeRate: *writeRate, churnEvents: *churn,
		goradixScale: *goradix, chainBlocks: *chainBlock,
	})
	if err != nil {
		log.Error("indexbench failed", "err", err)
		os.Exit(1)
	}
	if err := benchjson.Write(*out, res); err != nil {
		log.Error("write results", "err", err)
		os.Exit(1)
	}
	if *out != "-" {
		log.Info("wrote results", "file", *out)
	}
}

type config struct {
	scale        float64
	matches      int
	writeRate    int
	churnEvents  int
	goradixScale float64
	chainBlocks  int
}

// Results is the JSON written to bench/results/index.json.
type Results struct {
	Machine benchjson.Machine `json:"machine"`

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
	Targets map[string]string  `json:"targets"`
}

func run(log *slog.Logger, cfg config) (*Results, error) {
	res := &Results{Machine: benchjson.ThisMachine(), ChainBlocks: cfg.chainBlocks, Targets: map[string]string{
		"apply_events_per_sec": ">= 5000000", "match_p50_us": "<= 10", "match_p99_us": "<= 30",
		"bytes_per_entry": "<= 40", "snapshot_write_mb_per_sec": ">= 200", "snapshot_read_mb_per_sec": ">= 200",
		"hash_32k_tokens_us": "<= 40",
	}}
	res.Hash32kUs = hash32k()
	log.Info("content hash", "hash_32k_tokens_us", res.Hash32kUs)

	shape := radixtest.Full.Scaled(cfg.scale)
	wl := radixtest.Generate(shape)
	heapBefore := liveHeap()
	x := radix.New(radix.Options{})
	start := time.Now()
	events, err := wl.Populate(x)
	if err != nil {
		return nil, err
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

	if res.ApplyEventsPerSec, err = applyRate(wl, x, cfg.churnEvents); err != nil {
		return nil, err
	}
	log.Info("apply", "events_per_sec", res.ApplyEventsPerSec)

	chains := longChains(wl, cfg.chainBlocks)
	if len(chains) == 0 {
		return nil, errors.New("no session chain is long enough to match")
	}
	idle, _, err := timeMatches(wl, x, chains, cfg.matches/4, 0)
	if err != nil {
		return nil, err
	}
	res.MatchIdleP50us, res.MatchIdleP99us = pct(idle, 0.50), pct(idle, 0.99)
	busy, rate, err := timeMatches(wl, x, chains, cfg.matches, cfg.writeRate)
	if err != nil {
		return nil, err
	}
	res.MatchQueries = len(busy)
	res.MatchP50us, res.MatchP99us, res.MatchP999us = pct(busy, 0.50), pct(busy, 0.99), pct(busy, 0.999)
	res.MatchMaxUs = pct(busy, 1)
	res.WriterEventsPerS = rate
	log.Info("match", "p50_us", res.MatchP50us, "p99_us", res.MatchP99us, "writer_events_per_sec", rate)

	if err := snapshots(x, res); err != nil {
		return nil, err
	}
	log.Info("snapshot", "bytes", res.SnapshotBytes, "write_mb_s", res.SnapshotWriteMBs, "read_mb_s", res.SnapshotReadMBs)

	if cfg.goradixScale > 0 {
		x = nil
		wl = nil
		runtime.GC()
		cmp, err := compareGoRadix(radixtest.Full.Scaled(cfg.goradixScale), cfg.chainBlocks)
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

func snapshots(x *radix.Index, res *Results) error {
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
		y, err := radix.ReadSnapshot(bytes.NewReader(buf.Bytes()), radix.Options{})
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
