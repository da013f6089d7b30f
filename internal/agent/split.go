package agent

import (
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// The directory's bounds on what one batch may carry (its defaults:
// radix.DefaultMaxChain blocks per stored or removed piece,
// raftfsm.DefaultMaxBatchBlocks blocks and raftfsm.DefaultMaxBatchEvents
// events per batch). The directory refuses a batch past them, and a refusal
// stops the publisher, so that the agent registers again with an empty
// view: one long prompt (70k tokens at SGLang's block size 1 is 70k blocks
// in one event) must therefore be cut to fit instead of being sent whole.
const (
	maxPieceBlocks = 1 << 16
	maxBatchBlocks = 1 << 20
	maxBatchEvents = 1 << 16
)

// splitPieces cuts every stored or removed event of more than maxPiece
// blocks into consecutive pieces of at most maxPiece: each stored piece's
// parent is the last block of the piece before, so the directory indexes the
// same chain. Other events are kept as they are. It returns evs itself when
// nothing needs cutting.
func splitPieces(evs []*kvdirv1.Event, maxPiece int) []*kvdirv1.Event {
	long := false
	for _, ev := range evs {
		if eventBlocks(ev) > maxPiece {
			long = true
			break
		}
	}
	if !long {
		return evs
	}
	out := make([]*kvdirv1.Event, 0, len(evs)+1)
	for _, ev := range evs {
		if eventBlocks(ev) <= maxPiece {
			out = append(out, ev)
			continue
		}
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Stored:
			parent := k.Stored.Parent
			for h := k.Stored.Hashes; len(h) > 0; {
				n := min(len(h), maxPiece)
				out = append(out, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{
					Parent: parent, Hashes: h[:n:n], Medium: k.Stored.Medium,
				}}})
				parent, h = h[n-1], h[n:]
			}
		case *kvdirv1.Event_Removed:
			for h := k.Removed.Hashes; len(h) > 0; {
				n := min(len(h), maxPiece)
				out = append(out, &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{
					Hashes: h[:n:n], Medium: k.Removed.Medium, AllMedia: k.Removed.AllMedia,
				}}})
				h = h[n:]
			}
		}
	}
	return out
}

// chunkBatches cuts evs, in order, into runs of at most maxEvents events
// and maxBlocks blocks each (an event is never cut; splitPieces bounds it).
func chunkBatches(evs []*kvdirv1.Event, maxEvents, maxBlocks int) [][]*kvdirv1.Event {
	var out [][]*kvdirv1.Event
	start, blocks := 0, 0
	for i, ev := range evs {
		n := eventBlocks(ev)
		if i > start && (i-start >= maxEvents || blocks+n > maxBlocks) {
			out = append(out, evs[start:i:i])
			start, blocks = i, 0
		}
		blocks += n
	}
	return append(out, evs[start:])
}

// eventBlocks is the number of blocks an event names.
func eventBlocks(ev *kvdirv1.Event) int {
	switch k := ev.Kind.(type) {
	case *kvdirv1.Event_Stored:
		return len(k.Stored.GetHashes())
	case *kvdirv1.Event_Removed:
		return len(k.Removed.GetHashes())
	}
	return 0
}
