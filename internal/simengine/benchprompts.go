package simengine

import "math/rand/v2"

// BenchPrompts are the prompts of the engine model's benchmarks
// (BenchmarkEngineVirtual and BenchmarkRunnerScaleZero here, kvbench
// agent's engine and event-path figures): a 1,024-token system prompt
// shared by all, 256 tokens shared by groups of 8 requests (a
// conversation), and 64 tokens unique to the request, from a fixed seed so
// that every run sends the same prompts.
type BenchPrompts struct {
	rng    *rand.Rand
	system []uint32
	conv   []uint32
	buf    []uint32
}

// NewBenchPrompts returns the generator at request 0.
func NewBenchPrompts() *BenchPrompts {
	rng := rand.New(rand.NewPCG(1, 1))
	p := &BenchPrompts{rng: rng, system: make([]uint32, 1024), conv: make([]uint32, 256)}
	for i := range p.system {
		p.system[i] = uint32(rng.IntN(128000))
	}
	return p
}

// Prompt returns the prompt of request i, for i = 0, 1, 2, ... in turn; it
// is valid until the next call.
func (p *BenchPrompts) Prompt(i int) []uint32 {
	if i%8 == 0 {
		for j := range p.conv {
			p.conv[j] = uint32(p.rng.IntN(128000))
		}
	}
	p.buf = append(append(p.buf[:0], p.system...), p.conv...)
	for range 64 {
		p.buf = append(p.buf, uint32(p.rng.IntN(128000)))
	}
	return p.buf
}
