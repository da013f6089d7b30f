// Package interop tests kvevents against the real ZMQ library: a small
// Python publisher (testdata/vllm_publisher.py, on Debian's python3-zmq and
// python3-msgpack) sends vLLM-shaped event batches that the Go subscriber
// and replay client consume.
package interop
