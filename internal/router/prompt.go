package router

import (
	"slices"
	"sync"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// prompt is a request's rendered prompt and its block-hash chains, one per
// namespace its candidates hash in (model, LoRA adapter, cache salt, block
// size). When a session cache rendered it (LocalRenderer), a chain extends
// the one the session's previous rendering carries for the same namespace:
// only the blocks past the ids the two renderings share are hashed, and the
// chain is attached to the new rendering for the session's next turn.
type prompt struct {
	ids    []uint32            // every id; for a rendering, filled only when a chain is hashed from the start
	rend   *tokenize.Rendering // nil unless rendered by a session cache
	base   *tokenize.Rendering // the session's previous rendering; nil if none
	shared int                 // leading ids rend and base have in common
	chains map[blockhash.Namespace][]uint64
	hashed int // blocks hashed, over all namespaces (the others came from base)
}

// chainKey keys a rendering's chain in a namespace (tokenize.Rendering.SetAux).
type chainKey blockhash.Namespace

// idPool holds buffers for the ids a chain extension hashes; larger ones
// are not kept.
var idPool = sync.Pool{New: func() any { return new([]uint32) }}

const maxPooledIDs = 1 << 16

func newIDsPrompt(ids []uint32) *prompt { return &prompt{ids: ids} }

func newRenderedPrompt(r, base *tokenize.Rendering, shared int) *prompt {
	return &prompt{rend: r, base: base, shared: shared}
}

// len returns the number of ids.
func (p *prompt) len() int {
	if p.rend != nil {
		return p.rend.Len()
	}
	return len(p.ids)
}

// allIDs returns every id in one slice.
func (p *prompt) allIDs() []uint32 {
	if p.ids == nil && p.rend != nil {
		p.ids = p.rend.IDs()
	}
	return p.ids
}

// chain returns the prompt's chain in ns, hashing it on first use. The
// chain must not be modified.
func (p *prompt) chain(ns blockhash.Namespace) ([]uint64, error) {
	if c, ok := p.chains[ns]; ok {
		return c, nil
	}
	h, err := blockhash.New(ns)
	if err != nil {
		return nil, err
	}
	n := blockhash.FullBlocks(p.len(), ns.BlockSize)
	c := p.extend(h, n)
	if c == nil {
		c = h.Chain(make([]uint64, 0, n), p.allIDs(), nil)
		p.hashed += len(c)
	}
	if p.rend != nil {
		p.rend.SetAux(chainKey(ns), c)
	}
	if p.chains == nil {
		p.chains = make(map[blockhash.Namespace][]uint64, 1)
	}
	p.chains[ns] = c
	return c, nil
}

// extend returns the chain of n blocks in h's namespace as the base
// rendering's chain (its blocks within the shared ids) extended by the
// blocks after them; nil when there is nothing to extend.
func (p *prompt) extend(h *blockhash.Hasher, n int) []uint64 {
	if p.rend == nil || p.base == nil {
		return nil
	}
	v, ok := p.base.Aux(chainKey(h.Namespace()))
	if !ok {
		return nil
	}
	prev, _ := v.([]uint64)
	bs := h.BlockSize()
	keep := min(len(prev), p.shared/bs, n)
	if keep == 0 {
		return nil
	}
	c := slices.Grow(prev[:keep:keep], n-keep) // a copy: prev is immutable
	bp := idPool.Get().(*[]uint32)
	rest := p.rend.AppendIDs((*bp)[:0], keep*bs)
	c = h.Extend(c, c[keep-1], keep, rest, nil)
	p.hashed += len(c) - keep
	if cap(rest) <= maxPooledIDs {
		*bp = rest
		idPool.Put(bp)
	}
	return c
}
