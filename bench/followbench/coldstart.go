package followbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/follow"
)

// replica is a running Follower.
type replica struct {
	f      *follow.Follower
	cancel context.CancelFunc
	done   chan error

	mu      sync.Mutex
	record  bool
	applies []applied // while record: each advance of the applied index
}

// applied is the replica's applied index at a moment.
type applied struct {
	index uint64
	at    time.Time
}

// startReplica starts a Follower of addr.
func startReplica(ctx context.Context, addr string, _ *slog.Logger) (*replica, error) {
	r := &replica{done: make(chan error, 1)}
	f, err := follow.New(follow.Config{Addrs: []string{addr}, Logger: slog.New(slog.DiscardHandler), OnApplied: r.onApplied})
	if err != nil {
		return nil, err
	}
	r.f = f
	ctx, r.cancel = context.WithCancel(ctx)
	go func() { r.done <- f.Run(ctx) }()
	return r, nil
}

func (r *replica) onApplied(index uint64) {
	r.mu.Lock()
	if r.record {
		r.applies = append(r.applies, applied{index, time.Now()})
	}
	r.mu.Unlock()
}

// recorded reports whether an advance to index or past it was recorded
// since recording started. The follower's applied index moves before its
// hook reports the move, so waiting on AppliedIndex alone can stop the
// recording just before the last advance is recorded.
func (r *replica) recorded(index uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applies) > 0 && r.applies[len(r.applies)-1].index >= index
}

// recording starts (on) or stops recording the applied index's advances,
// and returns those recorded since the last start.
func (r *replica) recording(on bool) []applied {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.applies
	r.record, r.applies = on, nil
	return out
}

// stop stops the replica and closes its connections.
func (r *replica) stop() {
	r.cancel()
	<-r.done
	r.f.Close()
}

// caughtUp waits until the replica has applied index and holds digest (the
// index digest a node's Status reports).
func (r *replica) caughtUp(ctx context.Context, index, digest uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if r.f.Synced() && r.f.AppliedIndex() >= index {
			if got := r.f.IndexDigest(); r.f.AppliedIndex() == index && got != digest {
				return fmt.Errorf("at index %d the replica's digest is %016x, the node's %016x", index, got, digest)
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not caught up with index %d after %v (applied %d, synced %v)", index, timeout, r.f.AppliedIndex(), r.f.Synced())
		}
		time.Sleep(time.Millisecond)
	}
}

// coldStarts starts n new replicas of addr one after another and times
// each from its creation until it is in sync.
func coldStarts(ctx context.Context, addr string, n int, res *Measures, log *slog.Logger) error {
	var secs, perEntry []float64
	for i := range n {
		before := liveHeap()
		start := time.Now()
		r, err := startReplica(ctx, addr, log)
		if err != nil {
			return fmt.Errorf("cold start %d: %w", i+1, err)
		}
		for !r.f.Synced() {
			if err := ctx.Err(); err != nil {
				r.stop()
				return err
			}
			if time.Since(start) > 2*time.Minute {
				r.stop()
				return fmt.Errorf("cold start %d: not in sync after 2 minutes", i+1)
			}
			time.Sleep(100 * time.Microsecond)
		}
		took := time.Since(start)
		rs, _ := r.f.LastRestore()
		heap := liveHeap() - before
		r.stop()
		cs := ColdStart{Seconds: took.Seconds(), WaitSeconds: rs.Wait.Seconds(), ReceiveSeconds: rs.Receive.Seconds(),
			ApplySeconds: rs.Apply.Seconds(), SnapshotBytes: rs.Bytes, HeapBytes: heap}
		res.ColdStarts = append(res.ColdStarts, cs)
		res.SnapshotBytes = rs.Bytes
		secs = append(secs, cs.Seconds)
		perEntry = append(perEntry, float64(heap)/float64(res.Entries))
		log.Info("cold start", "n", i+1, "seconds", cs.Seconds, "wait", rs.Wait, "receive", rs.Receive, "apply", rs.Apply,
			"bytes", rs.Bytes, "heap_bytes_per_entry", perEntry[len(perEntry)-1])
	}
	if len(secs) == 0 {
		return errors.New("no cold start timed")
	}
	res.ColdStartSeconds = median(secs)
	res.ColdStartMaxSeconds = slices.Max(secs)
	res.ReplicaBytesPerEntry = median(perEntry)
	res.MemoryRatio = max(res.ReplicaBytesPerEntry, res.NodeBytesPerEntry) / res.NodeBytesPerEntry
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// nodeMemory reads a node's heap in use and resident set from its
// /metrics (0 when unreadable).
func nodeMemory(httpAddr string) (heapInuse, rss float64) {
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "go_memstats_heap_inuse_bytes":
			heapInuse, _ = strconv.ParseFloat(v, 64)
		case "process_resident_memory_bytes":
			rss, _ = strconv.ParseFloat(v, 64)
		}
	}
	return heapInuse, rss
}
