package placement

import (
	"cmp"
	"math/rand/v2"
)

// pickBy returns the index of the best of n candidates, where better(i, j)
// is < 0 when i is better than j and 0 when they tie. Ties are broken
// uniformly at random with rng (reservoir sampling), the way the peers'
// pickers break them (llm-d's max-score picker shuffles, Dynamo samples
// among the minimal logits). The caller holds the lock guarding rng.
func pickBy(rng *rand.Rand, n int, better func(i, j int) int) int {
	best, ties := 0, 0
	for i := range n {
		switch d := better(i, best); {
		case i == 0 || d < 0:
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

// pickBest returns the index of the best value in vals: the lowest when
// lowerWins, else the highest, ties at random (see pickBy).
func pickBest(rng *rand.Rand, vals []float64, lowerWins bool) int {
	return pickBy(rng, len(vals), func(i, j int) int {
		d := cmp.Compare(vals[i], vals[j])
		if !lowerWins {
			d = -d
		}
		return d
	})
}

// requestBlocks is ⌈PromptTokens/BlockSize⌉, or 0 without a block size.
func requestBlocks(req Request) int {
	if req.BlockSize <= 0 {
		return 0
	}
	return (req.PromptTokens + req.BlockSize - 1) / req.BlockSize
}
