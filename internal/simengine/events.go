package simengine

import "time"

// BlockHash is an engine block hash: opaque, chained over the parent block's
// hash and the block's tokens, rooted in the request's namespace. It plays
// the role of vLLM's 64-bit external block hash on the wire.
type BlockHash uint64

// MediumGPU is the medium of every event this engine emits.
const MediumGPU = "GPU"

// Event is one KV-cache event: *[BlockStored], *[BlockRemoved] or
// *[AllBlocksCleared].
type Event interface {
	isEvent()
}

// BlockStored announces blocks of one request that just became full and
// cached, as vLLM's BlockStored. Field names follow the wire spec.
type BlockStored struct {
	BlockHashes     []BlockHash // block_hashes: the run of new blocks, in order
	ParentBlockHash BlockHash   // parent_block_hash: valid only if HasParent
	HasParent       bool        // false (wire None) when the run starts at block 0
	TokenIDs        []uint32    // token_ids: len(BlockHashes)·BlockSize tokens
	BlockSize       int         // block_size
	LoRAName        string      // lora_name; "" is wire None
	Medium          string      // medium: always MediumGPU
}

// BlockRemoved announces the eviction of one cached block (vLLM sends one
// hash per event).
type BlockRemoved struct {
	BlockHashes []BlockHash // block_hashes: exactly one hash
	Medium      string      // medium: always MediumGPU
}

// AllBlocksCleared announces that the whole prefix cache was reset.
type AllBlocksCleared struct{}

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}

// EventBatch is the events of one engine step (or one reset), in the order
// they happened, stamped with the engine time at which vLLM would publish them:
// the end of the step.
type EventBatch struct {
	Time   time.Duration
	Events []Event
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
