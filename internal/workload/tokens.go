package workload

// VocabSize is the range token ids are drawn from: [0, VocabSize), Llama 3's
// vocabulary (the engine model's).
const VocabSize = 128256

// tokenDomain separates this package's token streams from other uses of the
// same generator.
const tokenDomain = 0x6b76646972746f6b // "kvdirtok"

// BlockTokens appends to dst the first n tokens of hash id's fixed content.
// The content is a pseudo-random stream seeded by the id alone (SplitMix64),
// so equal ids always give equal tokens, and a shorter block is a prefix of
// the longer one. Different ids give unrelated streams.
func BlockTokens(dst []uint32, id int64, n int) []uint32 {
	s := uint64(id)*0x9E3779B97F4A7C15 ^ tokenDomain
	for range n {
		s += 0x9E3779B97F4A7C15
		z := s
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		dst = append(dst, uint32((z>>32)*VocabSize>>32))
	}
	return dst
}

// Prompt appends to dst the prompt tokens of r, whose hash ids name blocks of
// blockSize tokens: each id's BlockTokens, the last one cut to what is left of
// InputLength. r must be valid for blockSize.
func Prompt(dst []uint32, r *Record, blockSize int) []uint32 {
	left := r.InputLength
	for _, id := range r.HashIDs {
		n := min(blockSize, left)
		dst = BlockTokens(dst, id, n)
		left -= n
	}
	return dst
}

// IdealHits returns, for each record in order, the prompt tokens that one
// engine with an unlimited prefix cache would serve from its cache if the
// records ran one after another in trace order: the leading tokens already
// seen, counted in whole engine blocks of engineBlockSize tokens (a trace
// block seen only as a partial last block contributes the engine blocks it
// filled) and capped, as an engine does, so that at least one token is
// computed. traceBlockSize is the trace's block size.
func IdealHits(recs []Record, traceBlockSize, engineBlockSize int) []int {
	seen := make(map[int64]int) // id → tokens of it that an engine would have cached
	out := make([]int, len(recs))
	for i := range recs {
		r := &recs[i]
		hit := 0
		matching := true
		left := r.InputLength
		for _, id := range r.HashIDs {
			n := min(traceBlockSize, left)
			left -= n
			if matching {
				c := seen[id]
				if c >= n {
					hit += n
				} else {
					hit += c
					matching = false
				}
			}
		}
		limit := (r.InputLength - 1) / engineBlockSize * engineBlockSize
		out[i] = min(hit/engineBlockSize*engineBlockSize, limit)
		// Record what this request leaves in the cache: the full engine
		// blocks of each of its trace blocks.
		left = r.InputLength
		off := 0
		for _, id := range r.HashIDs {
			n := min(traceBlockSize, left)
			left -= n
			// Engine blocks are aligned to the prompt, not to trace blocks;
			// count the tokens of this trace block inside full engine blocks.
			end := off + n
			fullEnd := r.InputLength / engineBlockSize * engineBlockSize
			cached := max(min(end, fullEnd)-off, 0)
			if cached > seen[id] {
				seen[id] = cached
			}
			off = end
		}
	}
	return out
}
