package placement

import "math/rand/v2"

// pickBest returns the index of the best value in vals: the lowest when
// lowerWins, else the highest. Ties are broken uniformly at random with rng (reservoir sampling), the way
// the peers' pickers break them (llm-d's max-score picker shuffles, Dynamo
// samples among the minimal logits). The caller holds the lock guarding rng.
func pickBest(rng *rand.Rand, vals []float64, lowerWins bool) int {
	best, ties := 0, 0
	for i, v := range vals {
		d := v - vals[best]
		if lowerWins {
			d = -d
		}
		switch {
		case i == 0 || d > 0:
			best, ties = i, 1
		case d == 0:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// requestBlocks is ⌈PromptTokens/BlockSize⌉, or 0 without a block size.
func requestBlocks(req Request) int {
	if req.BlockSize <= 0 {
		return 0
	}
	return (req.PromptTokens + req.BlockSize - 1) / req.BlockSize
}
