package tokenize

import (
	"container/list"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// SessionCache renders chat conversations incrementally: it remembers, per
// session, the messages last rendered and their token ids, and on the next
// turn tokenizes only the messages after the longest common prefix of
// messages (compared by role and rendered text, exactly). Because the
// template is message-separable the result always equals
// Template.RenderChat.
//
// A rendering keeps each message's ids in its own piece, shared with the
// session's earlier and later renderings that begin with the same messages,
// so a turn costs the new messages' tokens, not the whole conversation's
// (RenderSession); Render copies the pieces into one slice.
//
// The cache is an LRU bounded by the number of sessions and by the bytes
// its entries keep: 4 per token id, the messages' role and text (which for
// text that tokenizes poorly, such as runs of spaces, is a hundred times
// the ids), the session id and a fixed overhead per entry and message. A
// session whose entry alone exceeds the byte bound is not cached. What
// callers attach to a Rendering (SetAux) is not charged. It is safe for
// concurrent use; tokenization
// runs outside its lock. When two turns of one session render concurrently,
// the one that finishes last is the one remembered.
type SessionCache struct {
	tmpl        Template
	gen         []uint32 // the template's generation prompt, shared by the renderings
	maxSessions int
	maxBytes    int

	mu       sync.Mutex
	lru      list.List // of *sessionEntry, most recently used first
	sessions map[string]*list.Element
	tokens   int // ids over all entries
	bytes    int // entries' sizes (sessionEntry.size) over all entries
}

// sessionEntry is a session's latest rendering.
type sessionEntry struct {
	id   string
	r    *Rendering
	size int // bytes charged for the entry
}

// Bytes charged besides ids and text: an entry (list element, map slot,
// Rendering) and each message (cachedMessage).
const (
	entryOverhead   = 256
	messageOverhead = 64
)

// entrySize is what an entry for r under id is charged.
func entrySize(id string, r *Rendering) int {
	n := entryOverhead + 2*len(id) + 4*r.Len()
	for _, m := range r.msgs {
		n += messageOverhead + len(m.role) + len(m.text)
	}
	return n
}

// Rendering is a rendered chat conversation: each message's ids, in pieces
// shared with the session's other renderings that begin with the same
// messages, then the generation prompt (if asked for). It is immutable and
// safe for concurrent use; values attached with SetAux are the one thing
// that changes.
type Rendering struct {
	msgs []cachedMessage
	gen  []uint32 // the generation prompt, or nil
	n    int      // ids in msgs
	flat []uint32 // every id in one slice, when the rendering reused none

	auxMu sync.Mutex
	aux   []auxValue
}

type cachedMessage struct {
	role, text string
	ids        []uint32 // the message's ids; cap == len
	end        int      // end of the message's ids in the rendering
}

type auxValue struct{ key, v any }

// Len returns the number of ids, generation prompt included.
func (r *Rendering) Len() int { return r.n + len(r.gen) }

// MessageTokens returns the number of ids of the messages, without the
// generation prompt.
func (r *Rendering) MessageTokens() int { return r.n }

// AppendIDs appends the ids from position from (0 <= from <= Len) to the
// end to dst and returns the extended slice.
func (r *Rendering) AppendIDs(dst []uint32, from int) []uint32 {
	dst = slices.Grow(dst, max(r.Len()-from, 0))
	// The first message ending after from.
	i, _ := slices.BinarySearchFunc(r.msgs, from, func(m cachedMessage, pos int) int {
		if m.end <= pos {
			return -1
		}
		return 1
	})
	for ; i < len(r.msgs); i++ {
		m := r.msgs[i]
		start := m.end - len(m.ids)
		dst = append(dst, m.ids[max(from-start, 0):]...)
	}
	return append(dst, r.gen[min(max(from-r.n, 0), len(r.gen)):]...)
}

// IDs returns all the ids in one slice, which must not be modified. It
// copies them when the rendering reused pieces of another.
func (r *Rendering) IDs() []uint32 {
	if r.flat != nil || r.Len() == 0 {
		return r.flat
	}
	return r.AppendIDs(make([]uint32, 0, r.Len()), 0)
}

// SetAux attaches v to r under key (a comparable value), replacing what
// key held: e.g. a router's block hashes of r's ids, which the session's
// next rendering can extend instead of hashing from the start. v must not
// be modified afterwards.
func (r *Rendering) SetAux(key, v any) {
	r.auxMu.Lock()
	defer r.auxMu.Unlock()
	for i := range r.aux {
		if r.aux[i].key == key {
			r.aux[i].v = v
			return
		}
	}
	r.aux = append(r.aux, auxValue{key, v})
}

// Aux returns what SetAux attached to r under key.
func (r *Rendering) Aux(key any) (any, bool) {
	r.auxMu.Lock()
	defer r.auxMu.Unlock()
	for _, a := range r.aux {
		if a.key == key {
			return a.v, true
		}
	}
	return nil, false
}

// NewSessionCache returns a cache over tmpl holding at most maxSessions
// sessions and maxBytes bytes of entries in total (both must be positive).
func NewSessionCache(tmpl Template, maxSessions, maxBytes int) (*SessionCache, error) {
	if tmpl == nil {
		return nil, errors.New("tokenize: session cache: nil template")
	}
	if maxSessions <= 0 || maxBytes <= 0 {
		return nil, fmt.Errorf("tokenize: session cache: bounds must be positive (sessions %d, bytes %d)", maxSessions, maxBytes)
	}
	return &SessionCache{
		tmpl:        tmpl,
		gen:         slices.Clip(tmpl.AppendGenerationPrompt(nil)),
		maxSessions: maxSessions,
		maxBytes:    maxBytes,
		sessions:    make(map[string]*list.Element),
	}, nil
}

// Render returns tmpl.RenderChat(msgs, addGenerationPrompt), reusing the
// cached ids of the session's longest common message prefix, and how many
// ids it reused. The messages (not the generation prompt) then replace the
// session's entry. An empty sessionID bypasses the cache. On error the cache
// is unchanged. The returned slice shares memory with the cache and must not
// be modified. It copies the rendering into one slice (unless it reused
// nothing); RenderSession does not.
func (c *SessionCache) Render(sessionID string, msgs []Message, addGenerationPrompt bool) (ids []uint32, reusedTokens int, err error) {
	if sessionID == "" {
		ids, err = c.tmpl.RenderChat(msgs, addGenerationPrompt)
		return ids, 0, err
	}
	r, _, reused, err := c.RenderSession(sessionID, msgs, addGenerationPrompt)
	if err != nil {
		return nil, 0, err
	}
	return r.IDs(), reused, nil
}

// RenderSession renders msgs as Render does, and returns the rendering,
// the session's previous rendering it reused ids of (nil if none) and how
// many leading ids the two have in common (those of the common messages,
// which exclude the generation prompt). r then becomes the session's entry.
// An empty sessionID renders without the cache (base is nil). On error the
// cache is unchanged.
func (c *SessionCache) RenderSession(sessionID string, msgs []Message, addGenerationPrompt bool) (r, base *Rendering, shared int, err error) {
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		if texts[i], err = m.Content.PlainText(); err != nil {
			return nil, nil, 0, fmt.Errorf("tokenize: session %q: message %d: %w", sessionID, i, err)
		}
	}
	k := 0 // messages reused
	if sessionID != "" {
		base = c.lookup(sessionID)
	}
	if base != nil {
		for k < len(base.msgs) && k < len(msgs) && base.msgs[k].role == msgs[k].Role && base.msgs[k].text == texts[k] {
			k++
		}
		if k == 0 {
			base = nil
		}
	}
	r = &Rendering{msgs: make([]cachedMessage, len(msgs))}
	if k > 0 {
		copy(r.msgs, base.msgs[:k])
		shared = base.msgs[k-1].end
	}
	// Render the new messages into scratch space, then copy them and the
	// generation prompt into one allocation of the exact size, which the
	// pieces share.
	sp := scratchPool.Get().(*[]uint32)
	defer putScratch(sp)
	tail := (*sp)[:0]
	ends := make([]int, 0, len(msgs)-k)
	for i := k; i < len(msgs); i++ {
		tail, err = c.tmpl.AppendMessage(tail, Message{Role: msgs[i].Role, Content: TextContent(texts[i])})
		if err != nil {
			*sp = tail
			return nil, nil, 0, fmt.Errorf("tokenize: session %q: message %d: %w", sessionID, i, err)
		}
		ends = append(ends, len(tail))
	}
	n := len(tail)
	if addGenerationPrompt {
		tail = append(tail, c.gen...)
	}
	*sp = tail
	own := slices.Clone(tail)
	start := 0
	for j, end := range ends {
		i := k + j
		r.msgs[i] = cachedMessage{role: msgs[i].Role, text: texts[i], ids: own[start:end:end], end: shared + end}
		start = end
	}
	r.n = shared + n
	if addGenerationPrompt {
		r.gen = own[n:len(own):len(own)]
	}
	if k == 0 {
		r.flat = own
	}
	if sessionID != "" {
		c.store(&sessionEntry{id: sessionID, r: r, size: entrySize(sessionID, r)})
	}
	return r, base, shared, nil
}

// scratchPool holds buffers for the new part of a rendering; buffers above
// maxScratch tokens are not kept.
var scratchPool = sync.Pool{New: func() any { return new([]uint32) }}

const maxScratch = 1 << 16

func putScratch(p *[]uint32) {
	if cap(*p) <= maxScratch {
		scratchPool.Put(p)
	}
}

func (c *SessionCache) lookup(id string) *Rendering {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.sessions[id]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(el)
	return el.Value.(*sessionEntry).r
}

func (c *SessionCache) store(e *sessionEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.sessions[e.id]
	if e.size > c.maxBytes {
		// Too large to cache: drop the stale entry rather than flush others.
		if ok {
			c.removeLocked(el)
		}
		return
	}
	if ok {
		old := el.Value.(*sessionEntry)
		c.tokens -= old.r.n
		c.bytes -= old.size
		el.Value = e
		c.lru.MoveToFront(el)
	} else {
		c.sessions[e.id] = c.lru.PushFront(e)
	}
	c.tokens += e.r.n
	c.bytes += e.size
	for c.lru.Len() > c.maxSessions || c.bytes > c.maxBytes {
		c.removeLocked(c.lru.Back())
	}
}

func (c *SessionCache) removeLocked(el *list.Element) {
	e := c.lru.Remove(el).(*sessionEntry)
	delete(c.sessions, e.id)
	c.tokens -= e.r.n
	c.bytes -= e.size
}

// Forget drops a session's entry, if any.
func (c *SessionCache) Forget(sessionID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.sessions[sessionID]; ok {
		c.removeLocked(el)
	}
}

// Len returns the number of cached sessions.
func (c *SessionCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Bytes returns the bytes charged over all cached sessions, at most the
// cache's byte bound.
func (c *SessionCache) Bytes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Tokens returns the number of cached tokens over all sessions.
func (c *SessionCache) Tokens() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens
}
