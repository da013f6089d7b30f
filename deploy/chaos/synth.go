package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Synthetic is a publishing worker of the test's own, registered beside
// the real agents: it streams large batches of stored and removed blocks at
// a steady rate, so that the directory takes far more event traffic than
// four simulated engines produce. It keeps a bounded set of resident
// blocks (chains of chainLen): every batch stores new chains and removes
// as many blocks of the oldest ones, so the directory's memory stays flat
// however long it runs.
//
// It follows the agent's rules (internal/agent): it registers, sends
// AllCleared first in each epoch, numbers its batches through a
// dirclient.Publisher (which keeps every batch until the directory
// acknowledges it and re-sends the rest after a reconnection), heartbeats
// within the lease, and registers again when the directory refuses a
// batch or no longer knows the worker. A block event counts as acknowledged
// once the Publisher's acknowledged sequence number reaches its batch.
//
// Its model is SyntheticModel, which no request names, so routers never
// place a request on it, and its hashes are random, so no prompt matches
// them.
type Synthetic struct {
	cfg SyntheticConfig
	log *slog.Logger

	run     chan bool // true: publish; false: pause (Resume, Pause)
	stopped chan struct{}
	cancel  context.CancelFunc

	acked   atomic.Uint64 // block events acknowledged, every epoch
	sent    atomic.Uint64 // block events queued, every epoch
	refused atomic.Int64  // publisher stops (refusals or final errors)
	lostGap atomic.Int64  // acknowledged batches a GAP refusal says were lost

	mu       sync.Mutex
	epoch    uint64
	pub      *dirclient.Publisher
	cum      []uint64 // cum[seq] = block events of batches 1..seq in this epoch
	base     uint64   // block events acknowledged in earlier epochs
	regs     int
	problems []string
}

// SyntheticModel is the synthetic worker's model.
const SyntheticModel = "chaos-synthetic"

// chainLen is the length of the synthetic worker's chains.
const chainLen = 64

// SyntheticConfig configures a Synthetic worker.
type SyntheticConfig struct {
	Client   *dirclient.Client
	WorkerID string
	// Rate is the block events (blocks stored plus blocks removed) per
	// second to publish.
	Rate int
	// Every is the interval between batches (default 50 ms).
	Every time.Duration
	// Resident bounds the blocks the worker holds (default one second of
	// stores).
	Resident int
	// BlockSize is the worker's block size in tokens (default 16).
	BlockSize int
	Logger    *slog.Logger
}

// NewSynthetic registers the worker and starts it, paused.
func NewSynthetic(ctx context.Context, cfg SyntheticConfig) (*Synthetic, error) {
	if cfg.Every <= 0 {
		cfg.Every = 50 * time.Millisecond
	}
	if cfg.Resident <= 0 {
		cfg.Resident = max(cfg.Rate/2, chainLen)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	s := &Synthetic{cfg: cfg, log: cfg.Logger, run: make(chan bool), stopped: make(chan struct{})}
	if err := s.register(ctx); err != nil {
		return nil, err
	}
	ctx, s.cancel = context.WithCancel(ctx)
	go s.loop(ctx)
	go s.heartbeats(ctx)
	return s, nil
}

// register registers the worker (a new epoch) and starts its Publisher.
func (s *Synthetic) register(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := s.cfg.Client.Register(rctx, &kvdirv1.WorkerSpec{
		Id: s.cfg.WorkerID, Address: "http://synthetic.invalid:8000", Model: SyntheticModel, BlockSize: uint32(s.cfg.BlockSize),
	})
	if err != nil {
		return fmt.Errorf("register the synthetic worker: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pub != nil {
		s.base += s.ackedLocked()
		s.pub.Close()
	}
	s.epoch = resp.Epoch
	// An agent's Publisher holds its batches while there is no leader and
	// sends them once there is one; 256 batches are 12.8 s of events at
	// the 50 ms tick, more than any election the faults cause.
	s.pub = s.cfg.Client.NewPublisher(s.cfg.WorkerID, resp.Epoch, dirclient.WithQueueLimit(256))
	s.cum = []uint64{0}
	s.regs++
	return nil
}

// ackedLocked returns the block events acknowledged in the current epoch.
func (s *Synthetic) ackedLocked() uint64 {
	a := s.pub.Acked()
	if a >= uint64(len(s.cum)) {
		a = uint64(len(s.cum) - 1)
	}
	return s.cum[a]
}

// Resume starts publishing; Pause stops it and waits until every batch
// queued is acknowledged (or timeout passes).
func (s *Synthetic) Resume() {
	select {
	case s.run <- true:
	case <-s.stopped:
	}
}

// Pause stops publishing and flushes.
func (s *Synthetic) Pause(timeout time.Duration) error {
	select {
	case s.run <- false:
	case <-s.stopped:
	}
	s.mu.Lock()
	pub := s.pub
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := pub.Flush(ctx); err != nil {
		return fmt.Errorf("synthetic worker: %w", err)
	}
	s.count()
	return nil
}

// Close stops the worker (without deregistering it).
func (s *Synthetic) Close() {
	s.cancel()
	<-s.stopped
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pub.Close()
}

// Sent returns the block events handed to the Publisher so far, every
// epoch (acknowledged or not yet).
func (s *Synthetic) Sent() uint64 { return s.sent.Load() }

// Acked returns the block events acknowledged so far, every epoch.
func (s *Synthetic) Acked() uint64 { s.count(); return s.acked.Load() }

// count refreshes the acknowledged counter.
func (s *Synthetic) count() {
	s.mu.Lock()
	v := s.base + s.ackedLocked()
	s.mu.Unlock()
	for {
		old := s.acked.Load()
		if v <= old || s.acked.CompareAndSwap(old, v) {
			return
		}
	}
}

// Position returns the current epoch and the last sequence number the
// directory acknowledged in it.
func (s *Synthetic) Position() (epoch, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch, s.pub.Acked()
}

// Stats returns the registrations, the publisher stops and the
// acknowledged batches GAP refusals say the directory lost.
func (s *Synthetic) Stats() (registrations int, stops, gapLost int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.regs, s.refused.Load(), s.lostGap.Load()
}

// TakeProblems returns and forgets what went wrong since the last call.
func (s *Synthetic) TakeProblems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.problems
	s.problems = nil
	return p
}

func (s *Synthetic) problem(format string, a ...any) {
	s.mu.Lock()
	s.problems = append(s.problems, fmt.Sprintf(format, a...))
	s.mu.Unlock()
}

// loop publishes a batch every cfg.Every while running.
func (s *Synthetic) loop(ctx context.Context) {
	defer close(s.stopped)
	var (
		running  bool
		next     uint64     = uint64(time.Now().UnixNano()) // hash generator
		chains   [][]uint64                                 // resident, oldest first
		resident int
		clear    = true // AllCleared before the first blocks of an epoch
		epoch    uint64
		credit   float64 // block events owed by the rate
		last     time.Time
	)
	per := float64(s.cfg.Rate) // block events per second
	tick := time.NewTicker(s.cfg.Every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case running = <-s.run:
			last = time.Now()
			continue
		case <-tick.C:
		}
		s.count()
		if !running {
			continue
		}
		s.mu.Lock()
		pub, ep := s.pub, s.epoch
		s.mu.Unlock()
		select {
		case <-pub.Done():
			s.stoppedPublisher(ctx, pub)
			continue
		default:
		}
		if ep != epoch {
			epoch, chains, resident, clear = ep, nil, 0, true
		}
		now := time.Now()
		credit = min(credit+per*now.Sub(last).Seconds(), per) // at most a second's backlog
		last = now
		var events []*kvdirv1.Event
		blocks := 0
		if clear {
			events = append(events, &kvdirv1.Event{Kind: &kvdirv1.Event_Cleared{Cleared: &kvdirv1.AllCleared{}}})
			clear = false
		}
		// Store new chains and evict as many blocks, oldest first, once
		// the resident set is full: two block events per block stored.
		for credit-float64(blocks) >= 2*chainLen {
			chain := make([]uint64, chainLen)
			for i := range chain {
				next++
				chain[i] = splitmix(next)
			}
			events = append(events, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}})
			chains = append(chains, chain)
			resident += chainLen
			blocks += chainLen
			for resident > s.cfg.Resident && len(chains) > 0 {
				old := chains[0]
				chains = chains[1:]
				resident -= len(old)
				events = append(events, &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: old}}})
				blocks += len(old)
			}
		}
		if len(events) == 0 {
			continue
		}
		credit -= float64(blocks)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		seq, err := pub.Send(sctx, events)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, context.DeadlineExceeded) {
				credit = 0 // the directory is behind: the rate drops
				continue
			}
			s.stoppedPublisher(ctx, pub)
			continue
		}
		s.sent.Add(uint64(blocks))
		s.mu.Lock()
		if s.pub == pub && seq == uint64(len(s.cum)) {
			s.cum = append(s.cum, s.cum[len(s.cum)-1]+uint64(blocks))
		}
		s.mu.Unlock()
	}
}

// stoppedPublisher handles a stopped Publisher as the agent does: it
// records why and registers the worker again (a new epoch).
func (s *Synthetic) stoppedPublisher(ctx context.Context, pub *dirclient.Publisher) {
	err := pub.Err()
	s.refused.Add(1)
	var re *dirclient.RefusedError
	if errors.As(err, &re) && re.Status() == kvdirv1.PublishStatus_PUBLISH_STATUS_GAP {
		r := re.Response
		if lost := int64(r.FirstSeq) - 1 - int64(r.AppliedSeq); lost > 0 {
			s.lostGap.Add(lost)
		}
	}
	s.log.Warn("chaos: synthetic worker's publisher stopped; registering again", "err", err)
	s.problem("synthetic worker's publisher stopped: %v", err)
	for ctx.Err() == nil {
		if err := s.register(ctx); err == nil {
			return
		} else {
			s.log.Warn("chaos: synthetic worker", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// heartbeats renews the worker's lease every second; a heartbeat the
// directory answers with Known false (the worker expired) makes the loop
// register again on its next batch, by stopping the Publisher.
func (s *Synthetic) heartbeats(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		pub, ep := s.pub, s.epoch
		s.mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err := s.cfg.Client.Heartbeat(hctx, s.cfg.WorkerID, ep, nil)
		cancel()
		if err == nil && !resp.Known {
			s.problem("the directory no longer knows the synthetic worker in epoch %d", ep)
			s.log.Warn("chaos: synthetic worker unknown to the directory; registering again", "epoch", ep)
			pub.Close() // the loop sees it stopped and registers again
		}
	}
}

// splitmix is a step of SplitMix64: distinct, well-spread hashes.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	z := x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
