// Package kvevents decodes, encodes and transports the KV-cache events that
// LLM engines (vLLM, SGLang) publish over ZeroMQ.
//
// The wire format follows docs/reference/vllm-kv-events.md (sections 1
// and 6): every live message has three frames (topic, 8-byte big-endian
// sequence number, msgpack payload); the payload is a msgspec-encoded
// KVEventBatch whose events are either tagged arrays
// (["BlockStored", ...], vLLM up to v0.25) or maps ({"type": "BlockStored",
// ...}, vLLM v0.26 and later). The same decoder reads the other engines'
// variants of these events: SGLang's (no lora_name; BlockStoredWithMetadata
// with its cache_salt map after medium, or a top-level cache_salt; bigram
// token_ids pairs under EAGLE/NEXTN/MTP speculative decoding) and
// TensorRT-LLM's (string items in token_ids, locality). Group kinds
// (kv_cache_spec_kind) are kept as sent; [IsFullAttentionKind] tells which
// of them decide a prefix hit. The package offers:
//
//   - [DecodeBatch], a bounded, allocation-conscious decoder that accepts
//     every known layout and reports (rather than fails on) bad events;
//   - [EncodeBatch] / [AppendBatch], a msgspec-compatible encoder used by
//     the engine simulator;
//   - [Publisher], [Subscriber] and [Replay], a ZeroMQ transport built on the
//     pure-Go github.com/go-zeromq/zmq4 that mirrors vLLM's
//     ZmqEventPublisher, including both replay reply layouts.
package kvevents
