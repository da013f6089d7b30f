package blockhash

import (
	"math/rand/v2"
	"testing"
)

const benchTokens = 32768

// BenchmarkChain32k hashes a 32,768-token prompt (2,048 blocks of 16) with the
// kvdir content hash into a reused slice.
func BenchmarkChain32k(b *testing.B) {
	h := mustNew(b, Namespace{Model: "meta-llama/Llama-3.1-8B-Instruct", BlockSize: 16})
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), benchTokens)
	dst := make([]uint64, 0, benchTokens/16)
	b.SetBytes(4 * benchTokens)
	b.ReportAllocs()
	for b.Loop() {
		dst = h.Chain(dst[:0], tokens, nil)
	}
	if len(dst) != benchTokens/16 {
		b.Fatalf("%d hashes", len(dst))
	}
}

// BenchmarkChain32kMM is BenchmarkChain32k with two multimodal items.
func BenchmarkChain32kMM(b *testing.B) {
	h := mustNew(b, Namespace{Model: "meta-llama/Llama-3.1-8B-Instruct", BlockSize: 16})
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), benchTokens)
	items := []MMItem{{"img-1", 100, 600}, {"img-2", 20000, 1200}}
	dst := make([]uint64, 0, benchTokens/16)
	b.SetBytes(4 * benchTokens)
	b.ReportAllocs()
	for b.Loop() {
		dst = h.Chain(dst[:0], tokens, items)
	}
}

// BenchmarkVLLMChain32k computes vLLM sha256_cbor digests for a 32,768-token
// prompt (2,048 blocks of 16).
func BenchmarkVLLMChain32k(b *testing.B) {
	h, err := NewVLLM(DefaultVLLMSeed, 16)
	if err != nil {
		b.Fatal(err)
	}
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), benchTokens)
	b.SetBytes(4 * benchTokens)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Chain(tokens, "", "", nil); err != nil {
			b.Fatal(err)
		}
	}
}
