package radix

import "github.com/zeebo/xxh3"

// Digest returns the index's content digest (see the package documentation).
// It is kept up to date by every operation, so calling it costs nothing.
func (x *Index) Digest() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.digest
}

func hashString(s string) uint64 { return xxh3.HashString(s) }

// fmix is MurmurHash3's 64-bit finaliser: a bijection that spreads every
// input bit over the output.
func fmix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// entryHash is one (block, parent, worker, medium) entry's share of the
// digest. Each field goes through the finaliser in turn so that no two
// different entries combine their fields into the same value by design.
func entryHash(block, parent, workerHash uint64, m Medium) uint64 {
	h := fmix(block ^ 0x9e3779b97f4a7c15)
	h = fmix(h ^ parent)
	h = fmix(h ^ workerHash)
	return fmix(h ^ (uint64(m)+1)*0xbf58476d1ce4e5b9)
}
