package tokenize

import "math"

// smallPiece is the longest piece merged by the simple quadratic scan; longer
// pieces use a heap so that their cost is O(n log n).
const smallPiece = 48

const noRank = math.MaxInt

// mergeScratch holds buffers reused across the pieces of one AppendEncode.
type mergeScratch struct {
	next, prev []int
	heap       pairHeap
}

func (b *BPE) rank(tok string) int {
	if r, ok := b.table.lookup(tok); ok {
		return int(r)
	}
	return noRank
}

// appendPiece appends the ids of one pre-tokenized piece: it repeatedly
// merges the adjacent pair of parts whose concatenation has the lowest rank,
// the leftmost one on ties, as tiktoken does.
func (b *BPE) appendPiece(dst []uint32, piece string, sc *mergeScratch) []uint32 {
	if r, ok := b.table.lookup(piece); ok {
		return append(dst, r)
	}
	if len(piece) <= smallPiece {
		return b.mergeSmall(dst, piece)
	}
	return b.mergeLarge(dst, piece, sc)
}

func (b *BPE) mergeSmall(dst []uint32, piece string) []uint32 {
	var bounds [smallPiece + 1]int // start of each part, then len(piece)
	var pair [smallPiece]int       // rank of part k joined with part k+1
	m := len(piece)                // number of parts
	for k := 0; k <= m; k++ {
		bounds[k] = k
	}
	for k := 0; k+1 < m; k++ {
		pair[k] = b.rank(piece[k : k+2])
	}
	for m > 1 {
		best, bestRank := -1, noRank
		for k := 0; k+1 < m; k++ {
			if pair[k] < bestRank {
				best, bestRank = k, pair[k]
			}
		}
		if best < 0 {
			break
		}
		copy(bounds[best+1:m], bounds[best+2:m+1])
		if best+2 < m {
			copy(pair[best+1:m-2], pair[best+2:m-1])
		}
		m--
		if best+1 < m {
			pair[best] = b.rank(piece[bounds[best]:bounds[best+2]])
		}
		if best > 0 {
			pair[best-1] = b.rank(piece[bounds[best-1]:bounds[best+1]])
		}
	}
	for k := 0; k < m; k++ {
		dst = append(dst, uint32(b.rank(piece[bounds[k]:bounds[k+1]])))
	}
	return dst
}

// pairCand is a candidate merge of the part starting at pos with the part
// after it, which together end at end.
type pairCand struct {
	rank, pos, end int
}

// pairHeap is a binary min-heap ordered by rank, then position.
type pairHeap []pairCand

func (h pairHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].pos < h[j].pos)
}

func (h *pairHeap) push(c pairCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *pairHeap) pop() pairCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s.less(l, m) {
			m = l
		}
		if r < len(s) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// mergeLarge keeps the parts in a linked list indexed by their start byte and
// the candidate merges in a heap; a candidate is stale once its left part is
// gone or the pair no longer ends where it did.
func (b *BPE) mergeLarge(dst []uint32, piece string, sc *mergeScratch) []uint32 {
	n := len(piece)
	if cap(sc.next) < n {
		sc.next = make([]int, n)
		sc.prev = make([]int, n)
	}
	next, prev := sc.next[:n], sc.prev[:n]
	h := sc.heap[:0]
	for i := range n {
		next[i], prev[i] = i+1, i-1
		if i+1 < n {
			if r := b.rank(piece[i : i+2]); r != noRank {
				h.push(pairCand{rank: r, pos: i, end: i + 2})
			}
		}
	}
	for len(h) > 0 {
		c := h.pop()
		i := c.pos
		j := next[i]
		if j < 0 || j >= n || endOf(next, j, n) != c.end {
			continue
		}
		// Merge part j into part i.
		next[i] = next[j]
		if next[j] < n {
			prev[next[j]] = i
		}
		next[j] = -1
		if k := next[i]; k < n {
			end := endOf(next, k, n)
			if r := b.rank(piece[i:end]); r != noRank {
				h.push(pairCand{rank: r, pos: i, end: end})
			}
		}
		if p := prev[i]; p >= 0 {
			if r := b.rank(piece[p:next[i]]); r != noRank {
				h.push(pairCand{rank: r, pos: p, end: next[i]})
			}
		}
	}
	sc.heap = h
	for i := 0; i < n; i = next[i] {
		dst = append(dst, uint32(b.rank(piece[i:next[i]])))
	}
	return dst
}

func endOf(next []int, k, n int) int {
	if k >= n {
		return n
	}
	return next[k]
}
