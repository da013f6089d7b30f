package costmodel

import (
	"math"
	"time"
)

// PrefillModel is the cost of computing new tokens on top of a cached prefix:
//
//	prefill_ms(new, prefix) = A + B·new + C·new·(prefix + new/2) + D·prefix
//
// B is the per-token matrix work, C the attention over earlier tokens and D
// the reading of the cached KV.
type PrefillModel struct {
	A float64 // fixed cost of a forward pass, ms
	B float64 // ms per new token
	C float64 // ms per (new token × attended token)
	D float64 // ms per cached prefix token
}

// Millis returns the modelled prefill time in milliseconds of newTokens tokens
// computed after a prefix of prefix tokens already in the KV cache.
func (m PrefillModel) Millis(newTokens, prefix int) float64 {
	n, p := float64(newTokens), float64(prefix)
	return m.A + m.B*n + m.C*n*(p+n/2) + m.D*p
}

// DecodeModel is the cost of a decode step (one token for each of a batch of
// sequences, run as a CUDA graph):
//
//	decode_ms(batch, context) = Floor + PerSeq·batch + PerToken·context
//
// where context is the total number of cached tokens the batch attends to (the
// sum over its sequences). Floor is mostly the weight reads, PerToken the KV
// reads.
type DecodeModel struct {
	Floor    float64 // ms per step
	PerSeq   float64 // ms per sequence in the batch
	PerToken float64 // ms per context token read
}

// Millis returns the modelled duration in milliseconds of a decode-only step.
func (m DecodeModel) Millis(batch, context int) float64 {
	return m.Floor + m.Extra(batch, context)
}

// Extra returns what a decode batch adds to a step beyond the floor, in
// milliseconds: the cost of the decodes when they ride along with a prefill
// chunk whose forward pass already pays for the weight reads.
func (m DecodeModel) Extra(batch, context int) float64 {
	return m.PerSeq*float64(batch) + m.PerToken*float64(context)
}

// Chunk is one request's share of a step's prefill: New tokens computed after
// Prefix tokens already in the KV cache.
type Chunk struct {
	New, Prefix int
}

// StepMillis returns the modelled duration in milliseconds of one engine step
// that runs the given prefill chunks plus decodeSeqs single-token decodes
// attending to decodeContext cached tokens in total.
//
// Prefill chunks are batched: they share one fixed cost A. A step with
// chunks costs the chunks' prefill plus the decodes' [DecodeModel.Extra], but
// never less than a decode-only step would ("a mixed step costs about the
// prefill chunk plus the decode batch's extra tokens", calibration README). A
// step without chunks is a decode step. An empty step costs 0.
func (p Profile) StepMillis(chunks []Chunk, decodeSeqs, decodeContext int) float64 {
	sc := NewStepCost(&p)
	for _, c := range chunks {
		sc.AddChunk(c.New, c.Prefix)
	}
	sc.decodes, sc.context = decodeSeqs, decodeContext
	return sc.Millis()
}

// StepCost accumulates the cost of one engine step as the step is scheduled,
// chunk by chunk and decode by decode, without allocating; its [StepCost.Millis]
// is [Profile.StepMillis] of the same chunks and decodes. Start from
// [NewStepCost].
type StepCost struct {
	p       *Profile
	chunks  int
	prefill float64 // sum of the per-chunk terms, without A
	decodes int
	context int
}

// NewStepCost returns an empty step priced by p, which must outlive it and
// not change while it is in use.
func NewStepCost(p *Profile) StepCost { return StepCost{p: p} }

// AddChunk adds a prefill chunk of newTokens tokens computed after prefix
// tokens already in the KV cache.
func (s *StepCost) AddChunk(newTokens, prefix int) {
	s.chunks++
	s.prefill += s.p.Prefill.Millis(newTokens, prefix) - s.p.Prefill.A
}

// AddDecode adds one single-token decode of a sequence that attends to
// context cached tokens.
func (s *StepCost) AddDecode(context int) {
	s.decodes++
	s.context += context
}

// Millis returns the modelled duration of the step so far, in milliseconds.
func (s *StepCost) Millis() float64 {
	switch {
	case s.chunks == 0 && s.decodes == 0:
		return 0
	case s.chunks == 0:
		return s.p.Decode.Millis(s.decodes, s.context)
	case s.decodes == 0:
		return s.p.Prefill.A + s.prefill
	default:
		return max(s.p.Prefill.A+s.prefill, s.p.Decode.Floor) + s.p.Decode.Extra(s.decodes, s.context)
	}
}

// MillisToDuration converts modelled milliseconds to a Duration, rounding to
// the nanosecond.
func MillisToDuration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * 1e6))
}
