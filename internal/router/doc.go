// Package router is kvdir's request router: an OpenAI-compatible HTTP proxy
// that places each request on the worker where its prompt's prefix already
// lives in the KV cache.
//
// Per request the [Server]
//
//  1. parses the body (chat or text completion) and renders the prompt into
//     token ids with the model's template; a per-session cache makes turn N
//     tokenize only the messages that are new since turn N-1 ([Renderer]);
//  2. hashes the ids into kvdir's content-hash chain (internal/blockhash),
//     in the namespace of the model, the LoRA adapter, the block size and
//     the cache salt; for a session, only the blocks past those of turn
//     N-1's chain, which the session cache keeps with its rendering;
//  3. asks the directory, with a deadline of a few milliseconds (or its
//     local replica of the directory, [LocalReplica]), how many leading
//     blocks of the chain each worker holds, and adds the blocks it placed
//     itself in the last seconds (speculative entries, [specSet]);
//  4. hands the candidates, with their load (engine metrics scraped every
//     ~100 ms plus the router's own accounting of what it sent), to a
//     placement.Policy;
//  5. proxies the request to the chosen worker, streaming the response bytes
//     as they arrive. A worker that refuses the connection or fails before
//     the first response byte is excluded and the request is placed again;
//     after the first byte, the engine's response reaches the client as is.
//
// With late binding (Config.AdmissionQueue), a request arriving while
// every candidate worker is past its knee (internal/admission) waits at the
// router, in a bounded queue kept in order per session, and is placed
// between steps 1 and 4 again, on the loads of that moment, as soon as a
// worker drops below its knee; past the queue's bounds the answer is 429
// or 503 with Retry-After.
//
// When the directory cannot answer in time (timeout, error, no leader, not
// yet synchronised), the request is placed by bounded-load consistent
// hashing on the session key, or on the prompt's first blocks, and still
// served.
//
// A request whose model is a LoRA adapter goes only to workers whose engine
// lists that adapter in its GET /v1/models (read every few seconds), and is
// hashed under the worker's registered model with the adapter as LoRA: the
// namespace the agent indexes that engine's adapter blocks in.
//
// The same placement serves a second front end: [Server.RegisterEPP] makes
// the router the endpoint picker of a Gateway API Inference Extension
// gateway (epp.go). Envoy's ext_proc filter streams each request to it; it
// is placed as in steps 1 to 4, answered with the chosen worker's
// host:port for Envoy to send it to, and its response, which Envoy streams
// back through the picker, is accounted as a relayed one. Both front ends
// share the request's flight on its worker (place.go): the decision, the
// admission queue, the load accounting, the speculative entry and the
// shared intent.
//
// Workers come from the directory (a watch of the worker list) or from a
// static list. The router only ever proxies to a registered worker's
// address; nothing in a request chooses the upstream address.
package router
