package workload

// PooledHits returns, for each record in order, the prompt tokens that ONE
// engine prefix cache of capacityTokens tokens with LRU eviction would serve
// if it received the whole trace in arrival order, compute time ignored: the
// bound of a cluster whose KV caches were pooled into one (capacityTokens is
// the cluster's KV, replicas × blocks × engine block size).
//
// The cache holds engine blocks of engineBlockSize tokens, the blocks
// IdealHits counts (a block is identified by the trace block holding its
// last token and its end offset there, which names the whole prefix up to
// it). A request hits the leading run of its blocks present in the cache,
// capped so that at least one token is computed, then touches every full
// block of its prompt, deepest first, so that among one request's blocks the
// leaves are the least recently used and are evicted first, as an engine's
// prefix cache does; a block evicted before its descendants leaves them
// unreachable until it is computed again. With a capacity at least the
// trace's distinct blocks the result equals IdealHits. The cache contents
// at a capacity are always a subset of those at any larger one, so the hits
// grow with capacityTokens.
func PooledHits(recs []Record, traceBlockSize, engineBlockSize int, capacityTokens int64) []int {
	out := make([]int, len(recs))
	if traceBlockSize < 1 || engineBlockSize < 1 {
		return out
	}
	capBlocks := int(min(capacityTokens/int64(engineBlockSize), int64(1)<<40))
	if capBlocks < 1 {
		return out
	}
	c := newLRU(capBlocks)
	var keys []blockKey
	for i := range recs {
		r := &recs[i]
		full := r.InputLength / engineBlockSize
		limit := (r.InputLength - 1) / engineBlockSize
		keys = keys[:0]
		for j := range full {
			end := (j + 1) * engineBlockSize // exclusive end of engine block j in the prompt
			t := (end - 1) / traceBlockSize  // trace block holding its last token
			if t >= len(r.HashIDs) {
				break // a record that does not match its block size; count what is named
			}
			keys = append(keys, blockKey{id: r.HashIDs[t], end: int32(end - t*traceBlockSize)})
		}
		hit := 0
		for j := 0; j < min(limit, len(keys)) && c.has(keys[j]); j++ {
			hit++
		}
		out[i] = hit * engineBlockSize
		for j := len(keys) - 1; j >= 0; j-- {
			c.touch(keys[j])
		}
	}
	return out
}

// blockKey names an engine block: the hash id of the trace block holding the
// block's last token and the block's end offset inside that trace block.
type blockKey struct {
	id  int64
	end int32
}

// lru is a set of blockKeys bounded by a capacity, evicting the least
// recently touched; entries live in a slice linked into a ring through
// their indices (index 0 is the sentinel).
type lru struct {
	capacity int
	index    map[blockKey]int32
	nodes    []lruNode
	free     []int32
}

type lruNode struct {
	key        blockKey
	prev, next int32
}

func newLRU(capacity int) *lru {
	return &lru{capacity: capacity, index: make(map[blockKey]int32), nodes: []lruNode{{}}}
}

func (c *lru) has(k blockKey) bool {
	_, ok := c.index[k]
	return ok
}

// touch makes k the most recently used entry, inserting it and evicting the
// least recently used beyond the capacity.
func (c *lru) touch(k blockKey) {
	if n, ok := c.index[k]; ok {
		c.unlink(n)
		c.pushFront(n)
		return
	}
	var n int32
	if len(c.free) > 0 {
		n = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	} else {
		c.nodes = append(c.nodes, lruNode{})
		n = int32(len(c.nodes) - 1)
	}
	c.nodes[n].key = k
	c.index[k] = n
	c.pushFront(n)
	for len(c.index) > c.capacity {
		last := c.nodes[0].prev
		c.unlink(last)
		delete(c.index, c.nodes[last].key)
		c.free = append(c.free, last)
	}
}

func (c *lru) unlink(n int32) {
	p, x := c.nodes[n].prev, c.nodes[n].next
	c.nodes[p].next = x
	c.nodes[x].prev = p
}

func (c *lru) pushFront(n int32) {
	first := c.nodes[0].next
	c.nodes[n].prev, c.nodes[n].next = 0, first
	c.nodes[first].prev = n
	c.nodes[0].next = n
}
