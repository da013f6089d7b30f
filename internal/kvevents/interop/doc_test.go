// Package interop tests kvevents against the real ZMQ library: a small
// Python publisher (testdata/vllm_publisher.py, on Debian's python3-zmq and
// python3-msgpack) sends vLLM-shaped event batches that the Go subscriber
// and replay client consume. testdata/engine_shapes.py (python3-msgpack only)
// builds the payloads of other engines and model families (vLLM hybrid and
// MLA groups, SGLang EAGLE bigrams and cache salt, TensorRT-LLM string
// tokens and locality) from the upstream class layouts, which the decoder,
// the encoder (byte for byte) and the agent's translator are checked
// against.
package interop
