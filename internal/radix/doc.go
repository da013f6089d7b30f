// Package radix is kvdir's block-prefix index: which worker holds which chain
// of token-block content hashes, and how far along a given chain each worker's
// cached prefix reaches.
//
// # Model
//
// A block is named by a 64-bit content hash that already encodes its whole
// prefix (see internal/blockhash), so every block has exactly one parent: the
// block before it, or the root (hash 0, [Root]). The index stores these blocks as
// a tree of segments. A segment is a run of blocks in which each block is the
// parent of the next; a segment hangs under a block of another segment (its
// parent), under the root, or, while its parent is not yet known, in the
// detached set (see "Out-of-order pieces"). A hash table maps each block hash to
// its segment and offset, so a block is found in O(1) and a chain is matched by
// walking a segment's contiguous hash array, with a table look-up only where the
// chain leaves a segment.
//
// Workers are given dense slots; each block refers, per storage medium (GPU,
// CPU, disk, remote), to the interned set of the worker slots that hold it
// there. A set is stored once however many blocks share it (a session's
// blocks all share their holders'), so a block costs a 4-byte set id per
// medium in use whatever the size of the pool. Match walks a run of blocks
// comparing hashes and set ids, and does more only where the holders change:
// its cost follows the chain and its holders, not the pool.
//
// # Out-of-order pieces
//
// Insert takes a piece of a chain and the hash of the piece's parent. When the
// parent is neither the root nor a known block, the piece is not dropped: it is
// stored as a detached segment, keyed by the missing parent hash, and is
// attached the moment a block with that hash is inserted. Detached blocks are
// indexed (later pieces can hang under them, Remove and ClearWorker see them)
// but Match never reaches them, because Match only follows blocks connected to
// the root. Detached blocks are bounded by Options.MaxOrphanBlocks: beyond it the
// oldest detached subtree is dropped whole, deterministically (oldest first),
// and Stats.DroppedOrphanBlocks counts what was dropped.
//
// # Removal and memory
//
// A block that no worker holds on any medium is removed from the structure as
// soon as it is the tail of its segment and nothing hangs under it; a block in
// the middle of a run stays (as an unheld block Match stops at) until the run's
// tail recedes past it. Remove of an absent block, of an unheld block and of an
// unknown worker are no-ops. Inserts are idempotent.
//
// # Concurrency
//
// One writer (the replicated state machine) and any number of readers. Writers
// (Insert, Remove, ClearWorker, and snapshot writing) are serialised by a writer
// mutex; a reader/writer lock guards the data, and a writer holds it for at most
// a bounded number of blocks at a time ([writeChunk]) before letting waiting
// readers in, so a reader never waits behind a whole large batch. A reader may
// thus observe a piece half applied, which is a state the index also passes
// through when the pieces are applied one by one. Snapshot writing holds only the
// writer mutex: readers go on while it streams.
//
// # Digest
//
// Digest is the sum (mod 2^64) of a strong 64-bit mix of every (block, parent,
// worker name, medium) entry. It is maintained incrementally, does not depend on
// the order of operations or on the segment layout, and two indexes have equal
// digests exactly when they hold the same entries, up to the 2^-64 chance of a
// collision.
package radix
