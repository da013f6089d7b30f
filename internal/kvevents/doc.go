// Package kvevents decodes, encodes and transports the KV-cache events that
// LLM engines (vLLM, SGLang) publish over ZeroMQ.
//
// The wire format follows docs/reference/vllm-kv-events.md (sections 1
// and 6): every live message has three frames (topic, 8-byte big-endian
// sequence number, msgpack payload); the payload is a msgspec-encoded
// KVEventBatch whose events are either tagged arrays
// (["BlockStored", ...], vLLM up to v0.25) or maps ({"type": "BlockStored",
// ...}, vLLM v0.26 and later). The package offers:
//
//   - [DecodeBatch], a bounded, allocation-conscious decoder that accepts
//     every known layout and reports (rather than fails on) bad events;
//   - [EncodeBatch] / [AppendBatch], a msgspec-compatible encoder used by
//     the engine simulator;
//   - [Publisher], [Subscriber] and [Replay], a ZeroMQ transport built on the
//     pure-Go github.com/go-zeromq/zmq4 that mirrors vLLM's
//     ZmqEventPublisher, including both replay reply layouts.
package kvevents
