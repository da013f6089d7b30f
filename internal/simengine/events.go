package simengine

import (
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// BlockHash is an engine block hash: opaque, chained over the parent block's
// hash and the block's tokens, rooted in the request's namespace. It plays
// the role of vLLM's 64-bit external block hash; [BlockHash.Wire] is its
// form in the engine's events.
type BlockHash uint64

// Wire returns h as the engine's events carry it: an integer wire hash
// (msgpack uint), as vLLM publishes its 64-bit hashes.
func (h BlockHash) Wire() kvevents.Hash { return kvevents.HashFromUint64(uint64(h)) }

// wireHashes returns the wire forms of hs, in order, in a new slice.
func wireHashes(hs []BlockHash) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = h.Wire()
	}
	return out
}

// MediumGPU is the medium of every event this engine emits.
const MediumGPU = "GPU"

// EventBatch is the KV-cache events of one engine step (or one reset), in
// the order they happened, stamped with the engine time at which vLLM would
// publish them: the end of the step. The events are the wire types of
// package kvevents, filled in as vLLM's publisher fills them: a
// *[kvevents.BlockStored] per request and step for the blocks that just
// became full (Parent nil when the run starts at the request's first block,
// Medium [MediumGPU], LoRAName and LoRAID the request's adapter), a
// *[kvevents.BlockRemoved] with exactly one hash per evicted block, and
// *[kvevents.AllBlocksCleared] on a reset. Every other field is left None,
// but for a salted request's extra_keys (vLLM's: the salt is the last key of
// its first block) and what the engine's [Shape] adds: one store per
// KV-cache group with its group_idx and kind (a Mamba group's naming only
// its state block), SGLang's one page per store with its cache salt and
// bigrams, and in ReportFull mode the re-announcement of a request's
// prefix-cache hits when it is admitted.
//
// Time is engine time, not the wall clock of a [kvevents.Batch]: a
// publisher stamps the batch it sends, a simulator on a virtual clock
// orders and delays batches by Time.
type EventBatch struct {
	Time   time.Duration
	Events []kvevents.Event
}

// EventSink receives event batches. Publish is called synchronously by the
// engine (or by the goroutine of a RealtimeRunner); the sink owns the batch.
type EventSink interface {
	Publish(EventBatch)
}

// SinkFunc adapts a function to an EventSink.
type SinkFunc func(EventBatch)

// Publish calls f(b).
func (f SinkFunc) Publish(b EventBatch) { f(b) }
