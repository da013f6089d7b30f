package simengine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// recorder is an EventSink that keeps every batch.
type recorder struct {
	batches []EventBatch
}

func (r *recorder) Publish(b EventBatch) { r.batches = append(r.batches, b) }

// take returns the events recorded since the last call.
func (r *recorder) take() []kvevents.Event {
	var ev []kvevents.Event
	for _, b := range r.batches {
		ev = append(ev, b.Events...)
	}
	r.batches = nil
	return ev
}

func mustProfile(t testing.TB, name string) costmodel.Profile {
	t.Helper()
	p, err := costmodel.ProfileByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustEngine(t testing.TB, cfg Config, sink EventSink) *Engine {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = mustProfile(t, costmodel.DefaultProfileName)
	}
	e, err := New(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustSubmit(t testing.TB, e *Engine, now time.Duration, r Request) {
	t.Helper()
	if err := e.Submit(now, r); err != nil {
		t.Fatal(err)
	}
}

// drain steps e until it is idle and returns the finished requests by ID.
func drain(t testing.TB, e *Engine, now time.Duration) map[string]Result {
	t.Helper()
	out := make(map[string]Result)
	for i := 0; ; i++ {
		if i > 1_000_000 {
			t.Fatal("engine does not drain")
		}
		res := e.Step(now)
		if res.Idle {
			if e.Busy() {
				t.Fatal("idle step while busy")
			}
			return out
		}
		now = res.End
		for _, f := range res.Finished {
			out[f.ID] = f
		}
	}
}

func randTokens(rng *rand.Rand, n, vocab int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(vocab))
	}
	return t
}

// blockMeta is what the events say about a hash.
type blockMeta struct {
	parent    BlockHash
	hasParent bool
	tokens    []uint32
}

// eventModel is the cache content implied by the event stream: a multiset of
// hashes, as a consumer counting references would keep.
type eventModel struct {
	blockSize int
	count     map[BlockHash]int
	meta      map[BlockHash]blockMeta
	// coverage counters
	stores, dupStores, removes, clears int
}

func newEventModel(blockSize int) *eventModel {
	return &eventModel{blockSize: blockSize, count: map[BlockHash]int{}, meta: map[BlockHash]blockMeta{}}
}

func (m *eventModel) apply(ev kvevents.Event) error {
	switch ev := ev.(type) {
	case *kvevents.BlockStored:
		if ev.Medium != MediumGPU || ev.BlockSize != m.blockSize {
			return fmt.Errorf("bad BlockStored header %s", dumpEvents([]kvevents.Event{ev}))
		}
		// An adapter's blocks carry its name as their extra key, as vLLM's do.
		if ev.LoRAID != nil || (ev.ExtraKeys != nil && ev.LoRAName == "") || ev.GroupIdx != nil || ev.SpecKind != "" || ev.SlidingWindow != nil {
			return fmt.Errorf("BlockStored sets a field vLLM's GPU publisher leaves None: %+v", *ev)
		}
		for i, k := range ev.ExtraKeys {
			if len(k) != 1 || k[0] != ev.LoRAName {
				return fmt.Errorf("BlockStored extra keys of block %d are %v, want [%q]", i, k, ev.LoRAName)
			}
		}
		if len(ev.BlockHashes) == 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*m.blockSize {
			return fmt.Errorf("BlockStored with %d hashes and %d tokens", len(ev.BlockHashes), len(ev.TokenIDs))
		}
		var parent BlockHash
		has := ev.Parent != nil
		if has {
			var err error
			if parent, err = engineHash(*ev.Parent); err != nil {
				return err
			}
		}
		if has && m.count[parent] == 0 {
			return fmt.Errorf("BlockStored parent %x not cached", parent)
		}
		for i, wh := range ev.BlockHashes {
			h, err := engineHash(wh)
			if err != nil {
				return err
			}
			toks := ev.TokenIDs[i*m.blockSize : (i+1)*m.blockSize]
			if has && hashBlock(parent, toks) != h {
				return fmt.Errorf("hash %x does not chain from parent %x", h, parent)
			}
			meta := blockMeta{parent: parent, hasParent: has, tokens: slices.Clone(toks)}
			if old, ok := m.meta[h]; ok && m.count[h] > 0 {
				if old.parent != meta.parent || old.hasParent != meta.hasParent || !slices.Equal(old.tokens, meta.tokens) {
					return fmt.Errorf("hash %x stored twice with different content", h)
				}
			}
			m.meta[h] = meta
			if m.count[h] > 0 {
				m.dupStores++
			}
			m.stores++
			m.count[h]++
			parent, has = h, true
		}
	case *kvevents.BlockRemoved:
		if len(ev.BlockHashes) != 1 || ev.Medium != MediumGPU || ev.GroupIdx != nil {
			return fmt.Errorf("bad BlockRemoved %s", dumpEvents([]kvevents.Event{ev}))
		}
		h, err := engineHash(ev.BlockHashes[0])
		if err != nil {
			return err
		}
		m.removes++
		if m.count[h] == 0 {
			return fmt.Errorf("BlockRemoved %x not stored", h)
		}
		m.count[h]--
		if m.count[h] == 0 {
			delete(m.count, h)
			delete(m.meta, h)
		}
	case *kvevents.AllBlocksCleared:
		m.clears++
		clear(m.count)
		clear(m.meta)
	default:
		return fmt.Errorf("unknown event %T", ev)
	}
	return nil
}

// check compares the model with the cache, block by block.
func (m *eventModel) check(c *Cache) error {
	got := map[BlockHash]int{}
	for _, b := range c.Contents() {
		got[b.Hash]++
		meta, ok := m.meta[b.Hash]
		if !ok {
			return fmt.Errorf("block %d (hash %x) cached but never announced", b.ID, b.Hash)
		}
		if meta.parent != b.Parent || meta.hasParent != b.HasParent || !slices.Equal(meta.tokens, b.Tokens) {
			return fmt.Errorf("block %d (hash %x) content differs from its BlockStored", b.ID, b.Hash)
		}
	}
	if len(got) != len(m.count) {
		return fmt.Errorf("cache has %d distinct hashes, events imply %d", len(got), len(m.count))
	}
	for h, n := range m.count {
		if got[h] != n {
			return fmt.Errorf("hash %x: cache has %d blocks, events imply %d", h, got[h], n)
		}
	}
	return nil
}

// checkRefs verifies the reference counts against the running requests and
// the free queue against the reference counts.
func checkRefs(e *Engine) error {
	c := e.cache
	want := make([]int32, len(c.blocks))
	for _, s := range e.running {
		for _, id := range s.blocks {
			want[id]++
		}
	}
	for i, b := range c.blocks {
		if b.ref != want[i] {
			return fmt.Errorf("block %d: ref %d, running requests hold %d", i, b.ref, want[i])
		}
		if b.inFree != (b.ref == 0) {
			return fmt.Errorf("block %d: ref %d, inFree %v", i, b.ref, b.inFree)
		}
	}
	n := 0
	for id := c.freeHead; id != none; id = c.blocks[id].next {
		n++
	}
	if n != c.numFree {
		return fmt.Errorf("free list has %d blocks, numFree %d", n, c.numFree)
	}
	for _, s := range e.waiting[e.head:] {
		if len(s.blocks) != 0 {
			return fmt.Errorf("waiting request %s holds blocks", s.id)
		}
	}
	return nil
}

// engineHash returns the engine hash an event carries: the engine emits
// integer wire hashes only.
func engineHash(h kvevents.Hash) (BlockHash, error) {
	if h.IsBytes() {
		return 0, fmt.Errorf("event hash %s is a raw digest, want an integer", h)
	}
	return BlockHash(h.Key()), nil
}

// wire returns the wire forms of engine hashes.
func wire(hs ...BlockHash) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = h.Wire()
	}
	return out
}

// dumpEvents prints events deterministically (no pointers), one a line.
func dumpEvents(evs []kvevents.Event) string {
	var s string
	for _, ev := range evs {
		switch ev := ev.(type) {
		case *kvevents.BlockStored:
			parent := "none"
			if ev.Parent != nil {
				parent = ev.Parent.String()
			}
			s += fmt.Sprintf("  BlockStored{BlockHashes:%v Parent:%s TokenIDs:%v BlockSize:%d LoRAName:%q Medium:%q}\n",
				ev.BlockHashes, parent, ev.TokenIDs, ev.BlockSize, ev.LoRAName, ev.Medium)
		case *kvevents.BlockRemoved:
			s += fmt.Sprintf("  BlockRemoved{BlockHashes:%v Medium:%q}\n", ev.BlockHashes, ev.Medium)
		default:
			s += fmt.Sprintf("  %T\n", ev)
		}
	}
	return s
}

// fill returns n tokens, all equal to v.
func fill(n int, v uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = v
	}
	return t
}
