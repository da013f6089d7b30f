package simengine

// The engine's block hash is a chain of bijective mixing steps: the state
// starts from the parent hash and the block length, absorbs the tokens two at
// a time (XOR of the 64-bit pair, multiplication by an odd constant, XOR of
// the high half into the low half) and ends with murmur3's 64-bit finaliser.
// For a fixed state each step is a bijection of its input, so two blocks with
// the same parent that differ in one token pair never collide. A request's
// first block takes as parent the root of its namespace: 64-bit FNV-1a over a
// domain tag, the engine seed and the length-prefixed namespace and LoRA
// name, so that different namespaces never share blocks. This is an
// engine-private identifier, unrelated to kvdir's content hash (package
// blockhash).

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
	rootDomain  = "kvdir.engine.root.v1"
)

func fnvByte(h uint64, b byte) uint64 {
	return (h ^ uint64(b)) * fnvPrime64
}

func fnvU64(h, v uint64) uint64 {
	for range 8 {
		h = fnvByte(h, byte(v))
		v >>= 8
	}
	return h
}

func fnvString(h uint64, s string) uint64 {
	h = fnvU64(h, uint64(len(s)))
	for i := 0; i < len(s); i++ {
		h = fnvByte(h, s[i])
	}
	return h
}

// namespaceRoot returns the parent hash of a namespace's first blocks.
func namespaceRoot(seed uint64, namespace, lora string) BlockHash {
	h := fnvString(fnvOffset64, rootDomain)
	h = fnvU64(h, seed)
	h = fnvString(h, namespace)
	h = fnvString(h, lora)
	return BlockHash(h)
}

// hashBlock returns the hash of a block of tokens whose parent is parent.
func hashBlock(parent BlockHash, tokens []uint32) BlockHash {
	h := fmix64(uint64(parent) ^ uint64(len(tokens))*blockSeed)
	i := 0
	for ; i+1 < len(tokens); i += 2 {
		h = absorb(h ^ (uint64(tokens[i]) | uint64(tokens[i+1])<<32))
	}
	if i < len(tokens) {
		h = absorb(h ^ uint64(tokens[i]))
	}
	return BlockHash(fmix64(h))
}

const (
	blockSeed = 0xD6E8FEB86659FD93 // odd
	absorbMul = 0x9E3779B97F4A7C15 // odd
)

// absorb is a bijective mixing step.
func absorb(x uint64) uint64 {
	x *= absorbMul
	return x ^ x>>32
}

// fmix64 is murmur3's 64-bit finaliser (a bijection).
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xFF51AFD7ED558CCD
	x ^= x >> 33
	x *= 0xC4CEB9FE1A85EC53
	return x ^ x>>33
}

// splitmix64 advances *s and returns the next pseudo-random value.
func splitmix64(s *uint64) uint64 {
	*s += 0x9E3779B97F4A7C15
	z := *s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
