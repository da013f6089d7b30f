// Package costmodel is the timing model of an LLM inference engine: how long
// a prefill chunk, a decode step and a mixed step take on given hardware, as
// a [Profile] of a [PrefillModel] and a [DecodeModel].
//
// It holds the calibrated built-in profiles (llama3-8b and llama3-70b
// measured on one NVIDIA H200, bf16; [ProfileByName], [ProfileNames],
// [DefaultProfileName]), the one loader of profiles from JSON files
// ([LoadProfile], and [ResolveProfile] for a name-or-file flag) and the step
// pricing ([Profile.StepMillis], [StepCost]) and the time to load offloaded
// KV back into GPU memory ([Profile.TransferMillis], over the profile's
// host and disk link bandwidths).
//
// A [Calibrator] fits the prefill coefficients online to measured
// prefills, with a hand-given profile as its prior: the router and the
// benchmark simulator feed it and hand its current [Profile] to the
// placement policy.
//
// # Where observations come from
//
// The observation that always exists is the router's own, per request: the
// prompt tokens, the cached tokens the engine reports in the response's
// usage.prompt_tokens_details.cached_tokens, and the time to first token the
// router measures. Only requests placed on a worker with nothing queued
// ahead of them are clean (the engine's vllm:num_requests_waiting and the
// router's queued prefill tokens for that worker both 0 at placement): then
// the time to first token is the prefill plus the decodes riding along,
// which the calibrator subtracts per the decode model. The engine's own
// vllm:request_prefill_time_seconds is a histogram: its sums cannot be
// attributed to request shapes (new and cached tokens per request), so it
// cannot separate the four coefficients (nor does the engine simulator,
// cmd/enginesim, export it), and it is not used.
//
// Production and simulation share it: the kvdir placement policy (package
// placement, used by the router and kvdirctl) predicts time to first token
// with it, and the engine simulator (package simengine) and the benchmark
// simulator time their steps with it. It depends on nothing else in kvdir,
// so a production binary that links it links no simulator.
package costmodel
