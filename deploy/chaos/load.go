package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/loadgen"
	"github.com/kvdir/kvdir/internal/workload"
)

// LoadConfig describes the steady load: chat sessions replayed open-loop
// with internal/loadgen in chunks, a new chunk every ChunkSec seconds until
// stopped. A chunk holds the sessions that begin in its ChunkSec seconds,
// with all their turns: its later turns run while the next chunk's
// sessions begin, so the offered load is steady (SessionRate sessions a
// second, each with all its turns), not a ramp that starts again at every
// chunk. Each chunk has its own sessions and content (its hash ids are
// offset by the chunk number), with two tenants' system prompts shared
// within the chunk.
type LoadConfig struct {
	URLs      []string
	Engines   []loadgen.Engine
	Model     string
	BlockSize int // tokens per trace block and engine block
	ChunkSec  float64
	Seed      uint64
	// SessionRate is the new chat sessions per second (default 2, about
	// 4 requests/s); each has 2-3 turns.
	SessionRate float64
	// Short makes the sessions cheap to serve: 256-token system prompts
	// and documents, 32-token user turns, 4 output tokens and 1 s of think
	// time, so that a few cores can serve a hundred requests a second.
	Short bool
}

// Load is a running load.
type Load struct {
	cfg  LoadConfig
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	chunks   int
	requests int
	errors   int
	firstErr string
	runErr   error
}

// LoadStats is what a load did.
type LoadStats struct {
	Chunks, Requests int
	// Errors are the requests internal/loadgen counted as failed (transport
	// errors, broken streams, unexpected statuses).
	Errors   int
	FirstErr string
}

// chunkTrace returns chunk n's records.
func chunkTrace(cfg LoadConfig, n int) ([]workload.Record, error) {
	rate := cfg.SessionRate
	if rate <= 0 {
		rate = 2
	}
	sc := workload.SessionsConfig{
		Sessions: int(rate*cfg.ChunkSec) + 2, Tenants: 2, SystemTokens: 512, DocumentTokens: 768, FirstUserTokens: 64,
		UserTokens: 48, OutputTokens: 12, MinTurns: 2, MaxTurns: 3, ThinkTimeSec: 1.5,
		SessionRate: rate, Jitter: 0.3, BlockSize: cfg.BlockSize, Seed: cfg.Seed + uint64(n),
	}
	if cfg.Short {
		sc.SystemTokens, sc.DocumentTokens, sc.FirstUserTokens, sc.UserTokens = 256, 256, 32, 32
		sc.OutputTokens, sc.ThinkTimeSec = 4, 1
	}
	recs, err := workload.GenerateSessions(sc)
	if err != nil {
		return nil, err
	}
	// The sessions that begin within the chunk, with every turn.
	limit := cfg.ChunkSec * 1000
	begins := make(map[string]float64)
	for _, r := range recs {
		if t, ok := begins[r.SessionID]; !ok || r.Timestamp < t {
			begins[r.SessionID] = r.Timestamp
		}
	}
	out := recs[:0]
	for _, r := range recs {
		if begins[r.SessionID] >= limit {
			continue
		}
		for i := range r.HashIDs {
			r.HashIDs[i] += int64(n+1) << 32
		}
		r.SessionID = fmt.Sprintf("c%d-%d-%s", cfg.Seed, n, r.SessionID)
		out = append(out, r)
	}
	return out, nil
}

// StartLoad starts replaying chunks, one every ChunkSec seconds.
func StartLoad(ctx context.Context, cfg LoadConfig) *Load {
	l := &Load{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	every := time.Duration(cfg.ChunkSec * float64(time.Second))
	go func() {
		defer close(l.done)
		var running sync.WaitGroup
		defer running.Wait()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; n++ {
			recs, err := chunkTrace(cfg, n)
			if err != nil {
				l.fail(fmt.Errorf("load chunk %d: %w", n, err))
				return
			}
			running.Add(1)
			go func() {
				defer running.Done()
				res, err := loadgen.Run(ctx, loadgen.Config{
					Records: recs, TraceBlockSize: cfg.BlockSize, EngineBlockSize: cfg.BlockSize,
					Model: cfg.Model, URLs: cfg.URLs, TimeScale: 1, Engines: cfg.Engines,
					QueueEvery: time.Second,
				})
				if err != nil {
					l.fail(fmt.Errorf("load chunk %d: %w", n, err))
					return
				}
				l.mu.Lock()
				defer l.mu.Unlock()
				l.chunks++
				l.requests += len(recs)
				l.errors += res.Errors
				if l.firstErr == "" {
					l.firstErr = res.FirstErr
				}
			}()
			select {
			case <-l.stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *Load) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runErr == nil {
		l.runErr = err
	}
}

// Stop starts no more chunks, lets the running ones finish, and returns
// what the load did; the error is set if a chunk could not run at all.
func (l *Load) Stop() (LoadStats, error) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return LoadStats{Chunks: l.chunks, Requests: l.requests, Errors: l.errors, FirstErr: l.firstErr}, l.runErr
}
