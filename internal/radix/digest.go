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

// mediumKeys separate the media in entry hashes.
var mediumKeys = [NumMedia]uint64{0x243f6a8885a308d3, 0x13198a2e03707344, 0xa4093822299f31d0, 0x082efa98ec4e6c89}

// blockKey is the part of an entry's hash that depends on the block alone, so
// that a block shared by many workers is mixed once.
func blockKey(block, parent uint64) uint64 {
	return fmix(fmix(block^0x9e3779b97f4a7c15) ^ parent)
}

// entryHash is one (block, parent, worker, medium) entry's share of the
// digest: the block key, the worker's name hash and the medium key, mixed.
// Worker name hashes and medium keys are independent random-looking values, so
// two different entries of a block collide only by a 2^-64 chance.
func entryHash(blockKey, workerHash uint64, m Medium) uint64 {
	return fmix(blockKey ^ workerHash ^ mediumKeys[m])
}
