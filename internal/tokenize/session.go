package tokenize

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
)

// SessionCache renders chat conversations incrementally: it remembers, per
// session, the messages last rendered and their token ids, and on the next
// turn tokenizes only the messages after the longest common prefix of
// messages (compared by role and rendered text, exactly). Because the
// template is message-separable the result always equals
// Template.RenderChat.
//
// The cache is an LRU bounded by the number of sessions and by the total
// number of cached tokens; a session whose rendering alone exceeds the token
// bound is not cached. Besides 4 bytes per cached token, an entry keeps its
// messages' text (about as much again for English). It is safe for concurrent use; tokenization runs
// outside its lock. When two turns of one session render concurrently, the
// one that finishes last is the one remembered.
type SessionCache struct {
	tmpl        Template
	maxSessions int
	maxTokens   int

	mu       sync.Mutex
	lru      list.List // of *sessionEntry, most recently used first
	sessions map[string]*list.Element
	tokens   int
}

// sessionEntry is immutable once stored.
type sessionEntry struct {
	id   string
	msgs []cachedMessage
	ids  []uint32 // rendering of msgs, without the generation prompt; cap == len
}

type cachedMessage struct {
	role, text string
	end        int // end of the message's ids in sessionEntry.ids
}

// NewSessionCache returns a cache over tmpl holding at most maxSessions
// sessions and maxTokens tokens in total (both must be positive).
func NewSessionCache(tmpl Template, maxSessions, maxTokens int) (*SessionCache, error) {
	if tmpl == nil {
		return nil, errors.New("tokenize: session cache: nil template")
	}
	if maxSessions <= 0 || maxTokens <= 0 {
		return nil, fmt.Errorf("tokenize: session cache: bounds must be positive (sessions %d, tokens %d)", maxSessions, maxTokens)
	}
	return &SessionCache{
		tmpl:        tmpl,
		maxSessions: maxSessions,
		maxTokens:   maxTokens,
		sessions:    make(map[string]*list.Element),
	}, nil
}

// Render returns tmpl.RenderChat(msgs, addGenerationPrompt), reusing the
// cached ids of the session's longest common message prefix, and how many
// ids it reused. The messages (not the generation prompt) then replace the
// session's entry. An empty sessionID bypasses the cache. On error the cache
// is unchanged.
//
// The returned slice shares memory with the cache and must not be modified.
func (c *SessionCache) Render(sessionID string, msgs []Message, addGenerationPrompt bool) (ids []uint32, reusedTokens int, err error) {
	texts := make([]string, len(msgs))
	for i, m := range msgs {
		if texts[i], err = m.Content.PlainText(); err != nil {
			return nil, 0, fmt.Errorf("tokenize: session %q: message %d: %w", sessionID, i, err)
		}
	}
	if sessionID == "" {
		ids, err = c.tmpl.RenderChat(msgs, addGenerationPrompt)
		return ids, 0, err
	}

	prev := c.lookup(sessionID)
	k := 0 // messages reused
	if prev != nil {
		for k < len(prev.msgs) && k < len(msgs) && prev.msgs[k].role == msgs[k].Role && prev.msgs[k].text == texts[k] {
			k++
		}
	}
	cached := make([]cachedMessage, len(msgs))
	if k > 0 {
		copy(cached, prev.msgs[:k])
		reusedTokens = prev.msgs[k-1].end
	}
	// Render the new messages into scratch space, then allocate the result
	// at its exact size: it is what the cache keeps.
	sp := scratchPool.Get().(*[]uint32)
	defer putScratch(sp)
	tail := (*sp)[:0]
	for i := k; i < len(msgs); i++ {
		tail, err = c.tmpl.AppendMessage(tail, Message{Role: msgs[i].Role, Content: TextContent(texts[i])})
		if err != nil {
			*sp = tail
			return nil, 0, fmt.Errorf("tokenize: session %q: message %d: %w", sessionID, i, err)
		}
		cached[i] = cachedMessage{role: msgs[i].Role, text: texts[i], end: reusedTokens + len(tail)}
	}
	n := reusedTokens + len(tail)
	if addGenerationPrompt {
		tail = c.tmpl.AppendGenerationPrompt(tail)
	}
	*sp = tail
	ids = make([]uint32, reusedTokens+len(tail))
	if k > 0 {
		copy(ids, prev.ids[:reusedTokens])
	}
	copy(ids[reusedTokens:], tail)
	c.store(&sessionEntry{id: sessionID, msgs: cached, ids: ids[:n:n]})
	return ids, reusedTokens, nil
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

func (c *SessionCache) lookup(id string) *sessionEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.sessions[id]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(el)
	return el.Value.(*sessionEntry)
}

func (c *SessionCache) store(e *sessionEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.sessions[e.id]
	if len(e.ids) > c.maxTokens {
		// Too large to cache: drop the stale entry rather than flush others.
		if ok {
			c.removeLocked(el)
		}
		return
	}
	if ok {
		c.tokens -= len(el.Value.(*sessionEntry).ids)
		el.Value = e
		c.lru.MoveToFront(el)
	} else {
		c.sessions[e.id] = c.lru.PushFront(e)
	}
	c.tokens += len(e.ids)
	for c.lru.Len() > c.maxSessions || c.tokens > c.maxTokens {
		c.removeLocked(c.lru.Back())
	}
}

func (c *SessionCache) removeLocked(el *list.Element) {
	e := c.lru.Remove(el).(*sessionEntry)
	delete(c.sessions, e.id)
	c.tokens -= len(e.ids)
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

// Tokens returns the number of cached tokens over all sessions.
func (c *SessionCache) Tokens() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens
}
