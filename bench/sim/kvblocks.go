package sim

import (
	"fmt"
	"strings"
)

// H200 memory arithmetic for the default --kv-blocks of a built-in profile:
// what the model leaves for KV on one NVIDIA H200 under vLLM's defaults.
const (
	// H200Bytes is the card's HBM as NVIDIA states it (141 GB, decimal).
	H200Bytes = 141e9
	// GPUMemoryUtilization is vLLM's default --gpu-memory-utilization.
	GPUMemoryUtilization = 0.9
)

// KVArithmetic is the memory budget of one model on one H200.
type KVArithmetic struct {
	Profile       string
	Weights       string  // how the weights are stored
	WeightBytes   float64 // weights in HBM
	ReserveBytes  float64 // activations at 8,192 batched tokens, CUDA graphs, non-torch memory (assumed)
	BudgetBytes   float64 // H200Bytes · GPUMemoryUtilization
	KVBytes       float64 // BudgetBytes − WeightBytes − ReserveBytes
	BytesPerToken int64   // layers · kv heads · head dim · 2 (K, V) · 2 bytes (bf16)
	Tokens        int64   // KVBytes / BytesPerToken
	BlockSize     int
	Blocks        int // Tokens / BlockSize
}

// modelMemory is what kvBlocks needs per built-in profile.
type modelMemory struct {
	weights                          string
	linearParams, bf16Params         float64 // parameters stored in 1 and 2 bytes
	reserve                          float64
	layers, kvHeads, headDim, kvSize int64
}

// Llama 3 shapes: 8B has 8,030,261,248 parameters, 70B 70,553,706,496; the
// embedding and the LM head are 128,256 × hidden each.
var models = map[string]modelMemory{
	// bf16: every parameter in 2 bytes.
	"llama3-8b": {weights: "bf16", bf16Params: 8_030_261_248, reserve: 3e9, layers: 32, kvHeads: 8, headDim: 128, kvSize: 2},
	// bf16 weights (141 GB) do not fit one H200: FP8 linear layers (1 byte),
	// embedding and LM head kept in bf16 (2 × 128,256 × 8,192 parameters),
	// KV cache in bf16.
	"llama3-70b": {weights: "fp8 (linear layers; embedding and LM head bf16), bf16 KV",
		linearParams: 70_553_706_496 - 2*128_256*8_192, bf16Params: 2 * 128_256 * 8_192,
		reserve: 5e9, layers: 80, kvHeads: 8, headDim: 128, kvSize: 2},
}

// DefaultKVBlocks returns the KV-cache blocks of blockSize tokens that the
// built-in profile's model leaves on one H200, with the arithmetic; ok is
// false for a profile it does not know (a profile file), for which the
// caller must be told to set --kv-blocks.
func DefaultKVBlocks(profile string, blockSize int) (KVArithmetic, bool) {
	m, ok := models[profile]
	if !ok || blockSize < 1 {
		return KVArithmetic{}, false
	}
	a := KVArithmetic{
		Profile: profile, Weights: m.weights,
		WeightBytes:   m.linearParams + 2*m.bf16Params,
		ReserveBytes:  m.reserve,
		BudgetBytes:   H200Bytes * GPUMemoryUtilization,
		BytesPerToken: m.layers * m.kvHeads * m.headDim * 2 * m.kvSize,
		BlockSize:     blockSize,
	}
	a.KVBytes = a.BudgetBytes - a.WeightBytes - a.ReserveBytes
	a.Tokens = int64(a.KVBytes) / a.BytesPerToken
	a.Blocks = int(a.Tokens / int64(blockSize))
	return a, true
}

// String writes the arithmetic out.
func (a KVArithmetic) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s on one H200: %.1f GB HBM × %.2f = %.2f GB; weights (%s) %.2f GB; reserve %.1f GB; KV %.2f GB\n",
		a.Profile, H200Bytes/1e9, GPUMemoryUtilization, a.BudgetBytes/1e9, a.Weights, a.WeightBytes/1e9, a.ReserveBytes/1e9, a.KVBytes/1e9)
	fmt.Fprintf(&b, "KV per token %d bytes; %d tokens; %d blocks of %d tokens", a.BytesPerToken, a.Tokens, a.Blocks, a.BlockSize)
	return b.String()
}
