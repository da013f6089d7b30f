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
//
// # Bounded messages
//
// zmq4 allocates each inbound frame from the length its peer declares,
// before reading it, and has no maximum message size (libzmq's
// ZMQ_MAXMSGSIZE); no other pure-Go ZeroMQ implementation among the Go
// modules available offers one. So every tcp:// and ipc:// socket of this
// package runs over its own zmq4 transport (zmtplimit.go, registered once
// under private schemes, with the limit in the address, since zmq4 keeps
// one process-wide registry): the connection's reads pass through a ZMTP
// 3.x parser (the 64-byte greeting, then frame headers: flags and a 1- or
// 8-byte size) that reads straight into zmq4's buffer, keeps no data, and
// closes the connection with a non-timeout net.Error as soon as a
// message's frames declare more than MaxMessageBytes in total (or more
// than MaxFramesPerMessage frames), before zmq4 allocates. The bytes
// before the offending header are still delivered. OversizedMessages and
// the configs' OnOversized count such connections. DefaultMaxMessageBytes
// (64 MiB) is 6.9 times the largest batch an engine plausibly sends in
// one step (TestLargestBatchUnderDefaultLimit: an unchunked 1M-token
// prefill encodes to 9.3 MiB).
//
// Wrapping the dialing side too needs care: zmq4's PUB writer takes a
// write error (a net.Error) as the connection's end and, with automatic
// reconnection, dials again while holding its writer lock, which its
// connection reaper may be waiting for while holding the socket lock (a
// publisher that never rejoins a restarted subscriber). Dialed
// connections therefore report write errors as plain errors; the
// connection's reader, always reading, sees the loss and reconnects
// outside that lock. BenchmarkIngest measures the cost on the agent's
// ingest path against zmq4's plain transport, BenchmarkFrameParser the
// parser alone (about 0.2 µs per 24 KiB message); the engine-side guide
// has the figures.
package kvevents
