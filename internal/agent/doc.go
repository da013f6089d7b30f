// Package agent is the engine-side agent of kvdir: it subscribes to an
// engine's KV-cache events (vLLM's ZMQ protocol, see internal/kvevents, or
// TensorRT-LLM's pull endpoint, see internal/trtevents),
// translates the engine's opaque block hashes into kvdir content hashes, and
// publishes the result to the directory in batches, keeping the worker
// registered and heartbeating with the engine's load.
//
// # Translation (robust mode)
//
// The agent never trusts the engine's hash function. For every BlockStored
// it re-hashes the event's token_ids with internal/blockhash, chained from
// the content hash of the parent block, and remembers engine hash -> content
// hash in a bounded LRU map so that later children and removals can be
// translated. Decisions, see [Translator]:
//
//   - A BlockStored whose parent engine hash is not in the map cannot be
//     hashed (a content hash names the whole prefix), so its blocks are
//     skipped and counted as "unknown_parent". The stream recovery rules
//     (replay, or clear-and-rebuild) keep this rare.
//   - Namespace: the model comes from the configuration, the LoRA adapter
//     from lora_name. vLLM puts the request's cache_salt into the extra keys
//     of block 0 only; for a root event (parent None) the agent takes the
//     last string item of extra_keys[0] that is not the LoRA name as the
//     cache salt, so salted prefixes land in the salted namespace the router
//     computes from the request's cache_salt. Multimodal (identifier, offset)
//     tuples become blockhash extra keys; prompt-embedding digests (bytes)
//     cannot be represented and such events are skipped and counted.
//   - Duplicate stores are reference-counted per (engine hash, medium); a
//     removal is published only when the count drops to zero.
//
// # What is indexed
//
// A prefix is reusable on a worker only when its full-attention KV is
// there, so only groups of the full-attention family enter the directory:
// kv_cache_spec_kind full_attention, mla_attention (DeepSeek and other MLA
// models) and sink_full_attention, whatever their group_idx (vLLM numbers
// groups in layer order, so a hybrid model's full-attention group may be
// group 1 or later). Sliding-window (incl. sliding_window_mla), chunked
// local, Mamba, encoder-only, cross-attention and unknown groups are not
// indexed: they keep only the last window or a recurrent state, which does
// not make a prefix reusable on its own (vLLM's hybrid coordinator needs
// the full-attention hit), and their hashes equal the full-attention
// group's, so their removals must not touch it. Their blocks are counted as
// "non_attention_group" and per group in [Translator.Layout]. A removal
// follows the kind its group's stores had. Without a kind (older vLLM,
// SGLang) the behaviour is unchanged: only group 0 (or no group) is
// indexed. Several full-attention groups share engine hashes and are
// reference-counted together.
//
// Engine shapes:
//
//   - SGLang's BlockStoredWithMetadata cache_salt (array or map layout)
//     enters the namespace exactly as vLLM's cache_salt does, so salted
//     prefixes never hit across tenants; SGLang's EAGLE/NEXTN/MTP bigram
//     token_ids are decoded back to the token sequence.
//   - TensorRT-LLM token_ids may hold strings (multimodal placeholders):
//     the blocks before the first such block are indexed, that block and
//     the rest of the event cannot be hashed and are counted as
//     "string_token"; its mm_keys are not read.
//   - Stores or removals with locality "REMOTE" are in a pool shared with
//     other workers, not held by this worker: counted as "remote_locality",
//     not indexed.
//   - Media: GPU; CPU for CPU, CPU_PINNED, CPU_TIER1; DISK for DISK,
//     STORAGE, FS, CPU_TIER2; REMOTE for OBJ and EXTERNAL (see parseMedium).
//   - vLLM's kv_cache_report_mode="full" re-sends stores of reused blocks
//     in events identical to the first; upstream marks them with no field.
//     With [ReportFull] such a store adds no reference (see [ReportMode]).
//   - Every store's group, kind, window and block size are recorded
//     ([Translator.Layout]); an indexed block size other than the
//     configured --block-size is logged as a warning and counted as
//     "block_size_mismatch" (the blocks are still indexed, under their own
//     block size's namespace, which routers hashing with the registered
//     size do not query).
//
// # Recovery
//
// At start-up the agent replays the engine's replay buffer from the first
// batch, so a restarted agent rebuilds the worker without waiting for new
// events (only what the buffer still holds). Gaps and a first live message
// with seq > 0 trigger a replay from the engine's replay socket; when that is
// impossible or incomplete the agent publishes AllCleared and rebuilds from
// new events (the directory then holds only what the engine emits from then
// on). A sequence going backwards means the engine restarted: the agent
// registers again (a new epoch, which clears the worker in the directory)
// and starts over. So does a drop of the engine's cumulative prefix-cache
// query counter, read with every heartbeat, once the event stream has been
// quiet for a second: a restarted engine that serves nothing publishes no
// event that would tell. A refused batch (GAP,
// STALE_EPOCH, UNKNOWN_WORKER) or a heartbeat answered known=false (an
// expiry, a lease lapsed while the agent was paused) also leads to a new
// registration followed by AllCleared; the agent then rebuilds the view by
// the start-up path, replaying the engine's buffer from its first batch.
// When the buffer cannot cover the cache (it starts after the engine's first
// batch, has a hole, or the engine has no replay, as with a pull endpoint)
// the worker is partial: a warning, kvdir_agent_view_partial 1,
// kvdir_agent_rebuilds_total{result="partial"} and view_partial in every
// heartbeat's load (kvdirctl workers: ACTIVE(partial)); the directory may
// then miss blocks the engine still holds (never the reverse) until the
// engine stores them again.
//
// # TensorRT-LLM's pull endpoint
//
// With Config.PullURL the agent polls trtllm-serve's POST /kv_cache_events
// instead of subscribing (pull.go; the JSON is decoded by
// internal/trtevents into the same event types). Its event_id numbers
// every event and nothing can be replayed: a gap clears the worker and
// rebuilds from the next events, an id going backwards is a restart (a new
// registration), and failed polls back off while heartbeats go on.
package agent
