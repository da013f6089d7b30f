// Package trtevents reads TensorRT-LLM's pull-only KV-cache events: the
// JSON array that trtllm-serve answers to POST /kv_cache_events, and turns
// each event into the event types of package kvevents, so that the agent's
// translator consumes them as it consumes a ZeroMQ stream.
//
// It is a package of its own, not part of kvevents, because nothing but the
// event types is shared: kvevents is msgpack over ZeroMQ with a sequence
// number per batch and a replay socket, while this endpoint is JSON over
// HTTP, numbers every event (event_id), drains the engine's queue on read
// and keeps nothing to replay. Keeping it apart also keeps the JSON decoder
// free of the ZeroMQ transport and lets it be fuzzed on its own.
//
// The wire shape (see the fixtures in testdata and decode_test.go) is the
// one KVCacheEventSerializer in tensorrt_llm/_utils.py writes:
//
//	[{"event_id": 1, "window_size": 4096, "attention_dp_rank": 0,
//	  "data": {"type": "stored", "parent_hash": null, "blocks": [
//	    {"type": "stored_block", "block_hash": 123, "cache_level": 0,
//	     "priority": 35, "tokens": [{"type": "unique_token",
//	     "token_id": 1, "token_extra_id": 0}, ...]}]}}, ...]
//
// with data.type "created" (a new KV cache manager: event 0), "stored",
// "removed" (block_hashes) and "updated" (cache_level or priority of one
// block changed). [Decoder] maps them as follows:
//
//   - created becomes [kvevents.AllBlocksCleared]: the engine's cache is new
//     and empty;
//   - stored becomes one [kvevents.BlockStored] whose token ids are the
//     blocks' tokens in order and whose block size is the engine's
//     tokens_per_block. A block shorter than that (TensorRT-LLM stores
//     partially filled blocks for partial reuse) cannot be hashed as a full
//     block: it and the blocks after it are left out, counted, and later
//     removals of such blocks are dropped too. A token with a non-zero
//     token_extra_id (a multimodal placeholder) is recorded as a
//     [kvevents.StrToken], which the translator does not hash past;
//   - removed becomes one [kvevents.BlockRemoved];
//   - updated carries no change to what the engine holds (a block moving
//     between the primary and secondary cache levels stays reusable: the
//     engine onboards it on a hit), so it is counted and kept only for its
//     event_id.
//
// Every block is reported on the GPU medium whatever its cache_level, for
// the same reason, and so that a removal (which names no level) always
// matches its store. A non-zero lora_id (not serialised by current
// releases) puts the blocks in a namespace of their own ("trtllm-lora-N"),
// which no base-model prompt can match. Events of different window_size
// (variable sliding-window attention) are all used: each store and removal
// counts once per window, as the engine keeps one pool per window.
//
// Unknown event types and malformed events are counted, never fatal; a
// body that is not a JSON array, or larger than the bounds below, is an
// error. [Client] performs the POST with a bounded body read.
package trtevents
