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
// with internal/loadgen in chunks of ChunkSec seconds, one after another, until
// stopped. Each chunk has its own sessions and content (its hash ids are
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
	limit := cfg.ChunkSec * 1000
	out := recs[:0]
	for _, r := range recs {
		if r.Timestamp >= limit {
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

// StartLoad starts replaying chunks.
func StartLoad(ctx context.Context, cfg LoadConfig) *Load {
	l := &Load{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			recs, err := chunkTrace(cfg, n)
			if err == nil {
				var res *loadgen.Result
				res, err = loadgen.Run(ctx, loadgen.Config{
					Records: recs, TraceBlockSize: cfg.BlockSize, EngineBlockSize: cfg.BlockSize,
					Model: cfg.Model, URLs: cfg.URLs, TimeScale: 1, Engines: cfg.Engines,
					QueueEvery: time.Second,
				})
				if err == nil {
					l.mu.Lock()
					l.chunks++
					l.requests += len(recs)
					l.errors += res.Errors
					if l.firstErr == "" {
						l.firstErr = res.FirstErr
					}
					l.mu.Unlock()
				}
			}
			if err != nil {
				l.mu.Lock()
				l.runErr = fmt.Errorf("load chunk %d: %w", n, err)
				l.mu.Unlock()
				return
			}
		}
	}()
	return l
}

// Stop lets the current chunk finish, stops, and returns what the load
// did; the error is set if a chunk could not run at all.
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
