// Package blockhash names a prefix of prompt tokens as a chain of block
// hashes: kvdir's own 64-bit content hash (the identity used by the router,
// the agent and the directory), and, optionally, vLLM's sha256_cbor block
// hash reproduced bit for bit (see vllm.go).
//
// A prompt is cut into blocks of B consecutive tokens (B is the engine's block
// size). Only full blocks are hashed; a partial tail is ignored. The hash of
// block i depends on its tokens, its extra keys and the hash of block i-1, so
// it identifies the whole prefix up to and including block i.
//
// # Content hash, layout version 1
//
// This section is the specification; any change to the bytes it describes
// must bump [Version] (and the domain tag), and regenerate the test vectors in
// testdata/kvdir-v1-vectors.json.
//
// Notation: u32(x) is x as 4 bytes little-endian, i64(x) is x as 8 bytes
// little-endian two's complement, || is concatenation, len(s) is a string's
// length in bytes. XXH3(b) is XXH3-64 of b with the default secret and no
// seed (XXH3_64bits in the reference xxHash 0.8); XXH3(b, s) is XXH3-64 of b
// with 64-bit seed s (XXH3_64bits_withSeed). Token ids are uint32.
//
// The namespace root, from [Namespace] (block size B, model, LoRA adapter name,
// cache salt; strings are hashed as their UTF-8 bytes):
//
//	root = XXH3( "kvdir.blockhash.v1"          (18 ASCII bytes, no length prefix)
//	          || u32(B)
//	          || u32(len(Model))     || Model
//	          || u32(len(LoRA))      || LoRA
//	          || u32(len(CacheSalt)) || CacheSalt )
//
// with 1 <= B <= 65536 and each string at most 65536 bytes.
//
// Block i (0-based) covers tokens t[i*B] .. t[i*B+B-1]. With parent p = root for
// i = 0 and p = h(i-1) otherwise:
//
//	h(i) = XXH3( u32(t[i*B]) || u32(t[i*B+1]) || ... || u32(t[i*B+B-1])
//	             [ || u32(n) || u32(len(id_1)) || id_1 || i64(off_1)
//	                         || ...
//	                         || u32(len(id_n)) || id_n || i64(off_n) ],  p )
//
// The bracketed extra-key section is present only when the block has n > 0
// extra keys; a block without extra keys hashes exactly its 4*B token bytes.
//
// Extra keys come from multimodal items ([MMItem]: identifier, start offset
// and length in tokens, relative to the start of the whole prompt). Block i
// gets one key (id, off) for each item, in the caller's order, that overlaps
// the block, i.e. Offset < (i+1)*B and Offset+Length > i*B (so an item with
// Length <= 0 never overlaps), with off = Offset - i*B (negative when the
// item started in an earlier block). For items sorted by offset with positive
// lengths, as vLLM has them, this is the rule vLLM uses.
//
// The value 0 is reserved by the index for "no parent". Whenever the root or a
// block hash as computed above is 0, the value [ZeroReplacement]
// (0x9E3779B97F4A7C15) is used instead, both as the result and as the seed of
// the next block.
//
// The model, LoRA adapter and cache salt enter only through the root, and so
// change every block hash of the chain. Unlike vLLM, the cache salt is not an
// extra key of block 0.
package blockhash
