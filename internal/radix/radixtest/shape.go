// Package radixtest generates the synthetic directory contents that the
// index benchmarks run on: many workers, chains of realistic depth (shared
// system-prompt prefixes with sessions of hundreds to thousands of blocks
// under them), and a chosen sharing factor (entries per distinct block).
package radixtest

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvdir/kvdir/internal/radix"
)

// Shape describes the contents to generate.
type Shape struct {
	Workers int     // workers in the pool
	Entries int     // target (block, worker) entries
	Sharing float64 // entries per distinct block

	SystemPrompts        int // distinct shared system prompts
	SystemMin, SystemMax int // system prompt length, blocks
	SystemHolders        int // workers holding each system prompt

	SessionMin, SessionMax int // session length below its system prompt, blocks
	TurnBlocks             int // blocks a session grows by per turn (one Insert)

	Seed uint64
}

// Full is the shape the index's target figures are defined on: 64 workers, 10 M
// entries, sharing factor 4 (2.5 M distinct blocks), sessions of 100 to 4,000
// blocks under 256 shared system prompts.
var Full = Shape{
	Workers: 64, Entries: 10_000_000, Sharing: 4,
	SystemPrompts: 256, SystemMin: 16, SystemMax: 512, SystemHolders: 16,
	SessionMin: 100, SessionMax: 4000, TurnBlocks: 200,
	Seed: 1,
}

// Scaled returns the shape with its entry count multiplied by f.
func (s Shape) Scaled(f float64) Shape {
	s.Entries = int(float64(s.Entries) * f)
	s.SystemPrompts = max(1, int(float64(s.SystemPrompts)*f))
	return s
}

// Session is one session's own blocks, under a system prompt.
type Session struct {
	System  int      // index into Workload.Systems
	Hashes  []uint64 // the session's blocks, after the system prompt
	Holders []int    // workers holding it
}

// Workload is generated contents.
type Workload struct {
	Shape         Shape
	Systems       [][]uint64
	SystemHolders [][]int
	Sessions      []Session
	Distinct      int // distinct blocks
	Entries       int // (block, worker) entries
}

// WorkerName names worker i.
func WorkerName(i int) string { return fmt.Sprintf("worker-%03d", i) }

// Generate builds the workload deterministically from the shape's seed.
func Generate(s Shape) *Workload {
	r := rand.New(rand.NewPCG(s.Seed, 0x6b76646972))
	w := &Workload{Shape: s}
	next := func() uint64 {
		for {
			if h := r.Uint64(); h != radix.Root {
				return h
			}
		}
	}
	holders := func(n int) []int {
		return r.Perm(s.Workers)[:min(n, s.Workers)]
	}
	for range s.SystemPrompts {
		n := s.SystemMin + r.IntN(s.SystemMax-s.SystemMin+1)
		sys := make([]uint64, n)
		for i := range sys {
			sys[i] = next()
		}
		w.Systems = append(w.Systems, sys)
		h := holders(s.SystemHolders)
		w.SystemHolders = append(w.SystemHolders, h)
		w.Distinct += n
		w.Entries += n * len(h)
	}
	targetDistinct := int(float64(s.Entries) / s.Sharing)
	for w.Distinct < targetDistinct {
		// Replicas per session so that entries reach the target with the
		// distinct blocks that remain.
		mean := float64(s.Entries-w.Entries) / float64(targetDistinct-w.Distinct)
		reps := int(mean)
		if r.Float64() < mean-float64(reps) {
			reps++
		}
		reps = max(1, min(reps, s.Workers))
		n := s.SessionMin + r.IntN(s.SessionMax-s.SessionMin+1)
		n = min(n, targetDistinct-w.Distinct)
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = next()
		}
		w.Sessions = append(w.Sessions, Session{System: r.IntN(len(w.Systems)), Hashes: hs, Holders: holders(reps)})
		w.Distinct += n
		w.Entries += n * reps
	}
	return w
}

// Chain returns the first n blocks of session i's full chain (system prompt
// then session), or fewer if the chain is shorter.
func (w *Workload) Chain(i, n int) []uint64 {
	s := w.Sessions[i]
	c := append([]uint64(nil), w.Systems[s.System]...)
	c = append(c, s.Hashes...)
	return c[:min(n, len(c))]
}

// Piece is a run of blocks one worker stores under a parent block.
type Piece struct {
	Parent uint64
	Hashes []uint64
}

// Pieces returns what each worker stores, in order: its system prompts,
// then its sessions turn by turn (TurnBlocks blocks a piece).
func (w *Workload) Pieces() [][]Piece {
	pieces := make([][]Piece, w.Shape.Workers)
	for i, sys := range w.Systems {
		for _, h := range w.SystemHolders[i] {
			pieces[h] = append(pieces[h], Piece{radix.Root, sys})
		}
	}
	for _, s := range w.Sessions {
		sys := w.Systems[s.System]
		for _, h := range s.Holders {
			parent := sys[len(sys)-1]
			for start := 0; start < len(s.Hashes); start += w.Shape.TurnBlocks {
				end := min(start+w.Shape.TurnBlocks, len(s.Hashes))
				pieces[h] = append(pieces[h], Piece{parent, s.Hashes[start:end]})
				parent = s.Hashes[end-1]
			}
		}
	}
	return pieces
}

// Populate inserts the workload into x, sessions turn by turn, and returns the
// number of block events applied.
func (w *Workload) Populate(x *radix.Index) (int, error) {
	events := 0
	for i, sys := range w.Systems {
		for _, h := range w.SystemHolders[i] {
			if err := x.Insert(WorkerName(h), radix.Root, sys, radix.GPU); err != nil {
				return events, fmt.Errorf("system prompt %d: %w", i, err)
			}
			events += len(sys)
		}
	}
	for i := range w.Sessions {
		for _, h := range w.Sessions[i].Holders {
			n, err := w.InsertSession(x, i, h)
			events += n
			if err != nil {
				return events, err
			}
		}
	}
	return events, nil
}

// InsertSession inserts session i for worker h, one turn per Insert.
func (w *Workload) InsertSession(x *radix.Index, i, h int) (int, error) {
	s := w.Sessions[i]
	parent := w.Systems[s.System][len(w.Systems[s.System])-1]
	events := 0
	for start := 0; start < len(s.Hashes); start += w.Shape.TurnBlocks {
		end := min(start+w.Shape.TurnBlocks, len(s.Hashes))
		if err := x.Insert(WorkerName(h), parent, s.Hashes[start:end], radix.GPU); err != nil {
			return events, fmt.Errorf("session %d: %w", i, err)
		}
		events += end - start
		parent = s.Hashes[end-1]
	}
	return events, nil
}

// RemoveSession removes session i from worker h, tail first as an engine's
// LRU evicts, one turn per Remove.
func (w *Workload) RemoveSession(x *radix.Index, i, h int) (int, error) {
	s := w.Sessions[i]
	events := 0
	for end := len(s.Hashes); end > 0; end -= w.Shape.TurnBlocks {
		start := max(0, end-w.Shape.TurnBlocks)
		if err := x.Remove(WorkerName(h), s.Hashes[start:end], radix.GPU); err != nil {
			return events, fmt.Errorf("session %d: %w", i, err)
		}
		events += end - start
	}
	return events, nil
}
