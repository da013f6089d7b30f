// Package simengine models an LLM inference engine that behaves like vLLM V1
// without a GPU: a paged KV cache with prefix caching and LRU eviction, a
// continuous-batching scheduler with chunked prefill and recompute
// preemption, and step durations from a calibrated timing profile
// ([costmodel.Profile]).
//
// The [Engine] runs on a caller-supplied clock: [Engine.Submit] and
// [Engine.Step] take the current time as a [time.Duration] since an arbitrary
// epoch, and Step returns the time its iteration ends. A discrete-event
// simulator drives it directly on a virtual clock; [RealtimeRunner] drives it
// on the wall clock, sleeping scale × the modelled duration of every step, and
// streams the generated tokens to callers such as HTTP handlers.
//
// The cache publishes what vLLM's KV-event publisher would, as the wire types
// of package kvevents: one [kvevents.BlockStored] per request and step for
// the blocks that just became full, one [kvevents.BlockRemoved] per evicted
// block, and [kvevents.AllBlocksCleared] on a reset, in one [EventBatch] per
// step; a publisher sends them as they are (cmd/enginesim), and a consumer
// reads them as it reads a real engine's. Block hashes are the engine's own
// opaque chained 64-bit hashes ([BlockHash], on the wire as integers: a
// multiply-xorshift chain over the parent hash and the block's tokens,
// rooted in a per-namespace seed); they are deliberately not kvdir's content
// hash, so a consumer must treat them as opaque identifiers, as it would
// with a real engine.
//
// An Engine is not safe for concurrent use; RealtimeRunner is.
package simengine
