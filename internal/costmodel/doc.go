// Package costmodel is the timing model of an LLM inference engine: how long
// a prefill chunk, a decode step and a mixed step take on given hardware, as
// a [Profile] of a [PrefillModel] and a [DecodeModel].
//
// It holds the calibrated built-in profiles (llama3-8b and llama3-70b
// measured on one NVIDIA H200, bf16; [ProfileByName], [ProfileNames],
// [DefaultProfileName]), the one loader of profiles from JSON files
// ([LoadProfile], and [ResolveProfile] for a name-or-file flag) and the step
// pricing ([Profile.StepMillis], [StepCost]).
//
// Production and simulation share it: the kvdir placement policy (package
// placement, used by the router and kvdirctl) predicts time to first token
// with it, and the engine simulator (package simengine) and the benchmark
// simulator time their steps with it. It depends on nothing else in kvdir,
// so a production binary that links it links no simulator.
package costmodel
