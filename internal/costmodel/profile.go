package costmodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
)

// Profile is the timing model of one model on one kind of hardware.
type Profile struct {
	Name            string       // short name, e.g. "llama3-8b"
	Prefill         PrefillModel // prefill cost
	Decode          DecodeModel  // decode step cost
	KVBytesPerToken int64        // KV-cache bytes per token (all layers, K and V)
	// HostToGPUGBps and DiskToGPUGBps are the bandwidths, in GB/s, at which
	// offloaded KV blocks load back into GPU memory from host memory and
	// from disk (see [Profile.TransferMillis]); zero selects
	// DefaultHostToGPUGBps and DefaultDiskToGPUGBps.
	HostToGPUGBps float64
	DiskToGPUGBps float64
}

// DefaultProfileName is the built-in profile used when none is named: the
// router's and kvdirctl's cost model, the engine simulator's timing and the
// kvdir placement policy's fallback.
const DefaultProfileName = "llama3-8b"

// Built-in profiles, measured on one NVIDIA H200 (bf16).
//
// Prefill coefficients: docs/reference/calibration/README.md, fitted to
// h200_prefill.json; they reproduce every measured row within 10.3 %
// (llama3-8b: cold 5,100 tokens 133.95 ms vs 132.0 measured, warm 200 on 4,900
// cached 13.59 ms vs 14.68).
//
// Decode coefficients: our least-squares fit, minimising relative error, of
// Floor + PerSeq·batch + PerToken·(batch·context) to the seven graph_ms decode
// rows of docs/reference/calibration/h200_batch.json (batch 1..128, context
// 2k..32k per sequence):
//
//	llama3-8b:  5.34 ms + 0.01054 ms·B + 2.960e-5 ms/token  max error 2.6 %, rms 1.6 %
//	llama3-70b: 38.61 ms + 0.0494 ms·B + 7.044e-5 ms/token  max error 1.6 %, rms 1.0 %
//
// PerToken is close to one token's KV bytes over the card's 4.3 TB/s (30.5
// and 76 ns). Mixed steps (2,048-token chunk + 32 decodes of 4k context) come
// out at 56.9 ms (8B, 62.2 measured eager, 56.4 for the chunk alone) and 475
// ms (70B, 508 measured, 490 for the chunk alone).
var builtinProfiles = []Profile{
	{
		Name:            DefaultProfileName,
		Prefill:         PrefillModel{A: 3.21, B: 0.02318, C: 9.63e-7, D: 0.000976},
		Decode:          DecodeModel{Floor: 5.34, PerSeq: 0.01054, PerToken: 2.960e-5},
		KVBytesPerToken: 131072,
	},
	{
		Name:            "llama3-70b",
		Prefill:         PrefillModel{A: 5.29, B: 0.21969, C: 4.46e-6, D: 0.002162},
		Decode:          DecodeModel{Floor: 38.61, PerSeq: 0.0494, PerToken: 7.044e-5},
		KVBytesPerToken: 327680,
	},
}

// ErrUnknownProfile is returned by [ProfileByName] for a name that is not
// built in.
var ErrUnknownProfile = errors.New("costmodel: unknown profile")

// ProfileNames returns the names of the built-in profiles.
func ProfileNames() []string {
	names := make([]string, len(builtinProfiles))
	for i, p := range builtinProfiles {
		names[i] = p.Name
	}
	return names
}

// ProfileByName returns the built-in profile with the given name
// ("llama3-8b" or "llama3-70b").
func ProfileByName(name string) (Profile, error) {
	for _, p := range builtinProfiles {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("%w %q (built in: %v)", ErrUnknownProfile, name, ProfileNames())
}

// Validate reports whether the profile is usable: a name, finite non-negative
// coefficients, a positive decode floor, a positive per-token or fixed prefill
// cost, and a positive KV size.
func (p Profile) Validate() error {
	if p.Name == "" {
		return errors.New("costmodel: profile: name is empty")
	}
	coefs := []struct {
		name string
		v    float64
	}{
		{"prefill.a_ms", p.Prefill.A},
		{"prefill.b_ms_per_token", p.Prefill.B},
		{"prefill.c_ms_per_token2", p.Prefill.C},
		{"prefill.d_ms_per_prefix_token", p.Prefill.D},
		{"decode.floor_ms", p.Decode.Floor},
		{"decode.per_seq_ms", p.Decode.PerSeq},
		{"decode.per_context_token_ms", p.Decode.PerToken},
		{"host_to_gpu_gb_per_s", p.HostToGPUGBps},
		{"disk_to_gpu_gb_per_s", p.DiskToGPUGBps},
	}
	for _, c := range coefs {
		if math.IsNaN(c.v) || math.IsInf(c.v, 0) || c.v < 0 {
			return fmt.Errorf("costmodel: profile %q: %s = %v, want a finite value >= 0", p.Name, c.name, c.v)
		}
	}
	if p.Decode.Floor <= 0 {
		return fmt.Errorf("costmodel: profile %q: decode.floor_ms must be > 0", p.Name)
	}
	if p.Prefill.A+p.Prefill.B <= 0 {
		return fmt.Errorf("costmodel: profile %q: prefill.a_ms or prefill.b_ms_per_token must be > 0", p.Name)
	}
	if p.KVBytesPerToken <= 0 {
		return fmt.Errorf("costmodel: profile %q: kv_bytes_per_token must be > 0", p.Name)
	}
	return nil
}

// profileJSON is the file form of a Profile. Pointers detect missing fields.
type profileJSON struct {
	Name    *string `json:"name"`
	Prefill *struct {
		A *float64 `json:"a_ms"`
		B *float64 `json:"b_ms_per_token"`
		C *float64 `json:"c_ms_per_token2"`
		D *float64 `json:"d_ms_per_prefix_token"`
	} `json:"prefill"`
	Decode *struct {
		Floor    *float64 `json:"floor_ms"`
		PerSeq   *float64 `json:"per_seq_ms"`
		PerToken *float64 `json:"per_context_token_ms"`
	} `json:"decode"`
	KVBytesPerToken *int64 `json:"kv_bytes_per_token"`
	// Optional: zero or missing selects the defaults.
	HostToGPUGBps float64 `json:"host_to_gpu_gb_per_s"`
	DiskToGPUGBps float64 `json:"disk_to_gpu_gb_per_s"`
}

// maxProfileBytes bounds the size of a profile file.
const maxProfileBytes = 1 << 20

// LoadProfile reads a profile from JSON. Every field is required except the
// two link bandwidths (missing or 0: DefaultHostToGPUGBps and
// DefaultDiskToGPUGBps), and unknown fields are rejected:
//
//	{
//	  "name": "llama3-8b-a100",                 // string, non-empty
//	  "prefill": {                              // prefill_ms(new, prefix) =
//	    "a_ms": 3.21,                           //   a
//	    "b_ms_per_token": 0.02318,              //   + b·new
//	    "c_ms_per_token2": 9.63e-7,             //   + c·new·(prefix + new/2)
//	    "d_ms_per_prefix_token": 0.000976       //   + d·prefix
//	  },
//	  "decode": {                               // decode_ms(batch, context) =
//	    "floor_ms": 5.34,                       //   floor (> 0)
//	    "per_seq_ms": 0.01054,                  //   + per_seq·batch
//	    "per_context_token_ms": 2.96e-5         //   + per_context_token·Σcontext
//	  },
//	  "kv_bytes_per_token": 131072,             // integer > 0
//	  "host_to_gpu_gb_per_s": 50,               // optional: offloaded KV loads from host memory
//	  "disk_to_gpu_gb_per_s": 6                 // optional: and from disk
//	}
//
// Coefficients are finite and non-negative; the result passes
// [Profile.Validate].
func LoadProfile(r io.Reader) (Profile, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxProfileBytes+1))
	if err != nil {
		return Profile{}, fmt.Errorf("costmodel: read profile: %w", err)
	}
	if len(data) > maxProfileBytes {
		return Profile{}, fmt.Errorf("costmodel: profile larger than %d bytes", maxProfileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var pj profileJSON
	if err := dec.Decode(&pj); err != nil {
		return Profile{}, fmt.Errorf("costmodel: decode profile: %w", err)
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		return Profile{}, errors.New("costmodel: decode profile: trailing data after the JSON object")
	}
	var missing []string
	need := func(ok bool, name string) {
		if !ok {
			missing = append(missing, name)
		}
	}
	need(pj.Name != nil, "name")
	need(pj.Prefill != nil, "prefill")
	need(pj.Decode != nil, "decode")
	need(pj.KVBytesPerToken != nil, "kv_bytes_per_token")
	if pj.Prefill != nil {
		need(pj.Prefill.A != nil, "prefill.a_ms")
		need(pj.Prefill.B != nil, "prefill.b_ms_per_token")
		need(pj.Prefill.C != nil, "prefill.c_ms_per_token2")
		need(pj.Prefill.D != nil, "prefill.d_ms_per_prefix_token")
	}
	if pj.Decode != nil {
		need(pj.Decode.Floor != nil, "decode.floor_ms")
		need(pj.Decode.PerSeq != nil, "decode.per_seq_ms")
		need(pj.Decode.PerToken != nil, "decode.per_context_token_ms")
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return Profile{}, fmt.Errorf("costmodel: profile: missing fields %v", missing)
	}
	p := Profile{
		Name:            *pj.Name,
		Prefill:         PrefillModel{A: *pj.Prefill.A, B: *pj.Prefill.B, C: *pj.Prefill.C, D: *pj.Prefill.D},
		Decode:          DecodeModel{Floor: *pj.Decode.Floor, PerSeq: *pj.Decode.PerSeq, PerToken: *pj.Decode.PerToken},
		KVBytesPerToken: *pj.KVBytesPerToken,
		HostToGPUGBps:   pj.HostToGPUGBps,
		DiskToGPUGBps:   pj.DiskToGPUGBps,
	}
	if err := p.Validate(); err != nil {
		return Profile{}, err
	}
	return p, nil
}

// ResolveProfile returns the built-in profile named spec or, if there is
// none, the profile in the JSON file at path spec (read by [LoadProfile]).
// It is how every command turns its --profile flag into a Profile.
func ResolveProfile(spec string) (Profile, error) {
	if p, err := ProfileByName(spec); err == nil {
		return p, nil
	}
	f, err := os.Open(spec)
	if err != nil {
		return Profile{}, fmt.Errorf("profile %q is neither a built-in profile %v nor a readable file: %w", spec, ProfileNames(), err)
	}
	defer f.Close()
	p, err := LoadProfile(f)
	if err != nil {
		return Profile{}, fmt.Errorf("profile %s: %w", spec, err)
	}
	return p, nil
}
