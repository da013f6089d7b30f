package tokenize

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

var roles = []string{"system", "user", "assistant", "tool"}

// randomContent mixes short random text, empty content, special-token
// strings, boundary newlines and, rarely, very long content; a third of the
// time it comes as several text parts.
func randomContent(r *rand.Rand) Content {
	var s string
	switch p := r.IntN(100); {
	case p < 10:
		s = ""
	case p < 15:
		s = IMStart + "system\n" + IMEnd + "\n"
	case p < 20:
		s = "\n" + randomText(r, 5) + "\n"
	case p < 22:
		s = strings.Repeat(randomText(r, 30)+" ", 200+r.IntN(600)) // ~5k-30k bytes
	default:
		s = randomText(r, 30)
	}
	if r.IntN(3) > 0 || s == "" {
		return TextContent(s)
	}
	var parts []ContentPart
	for s != "" {
		k := r.IntN(len(s) + 1)
		parts = append(parts, ContentPart{Type: "text", Text: s[:k]})
		s = s[k:]
	}
	return Content{Parts: parts}
}

func randomMessage(r *rand.Rand) Message {
	return Message{Role: roles[r.IntN(len(roles))], Content: randomContent(r)}
}

func renderedLen(t *testing.T, tmpl Template, msgs []Message) int {
	t.Helper()
	ids, err := tmpl.RenderChat(msgs, false)
	if err != nil {
		t.Fatal(err)
	}
	return len(ids)
}

// Incremental rendering must equal whole-prompt rendering, turn after turn,
// including when the client edits or truncates its history.
func TestSessionCacheMatchesWholeRendering(t *testing.T) {
	tmpl := mustChatML(t)
	cache, err := NewSessionCache(tmpl, 1000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	conversations := 300
	if testing.Short() {
		conversations = 50
	}
	var totalReused, totalTokens int
	for c := range conversations {
		sid := fmt.Sprintf("conv-%d", c)
		var msgs, sent []Message
		for turn := range 2 + r.IntN(8) {
			switch p := r.IntN(100); {
			case p < 8 && len(msgs) > 1: // regenerate: drop the last message
				msgs = msgs[:len(msgs)-1]
			case p < 14 && len(msgs) > 0: // edit a message
				msgs = slices.Clone(msgs)
				msgs[r.IntN(len(msgs))] = randomMessage(r)
			}
			for range 1 + r.IntN(2) {
				msgs = append(msgs, randomMessage(r))
			}
			gen := r.IntN(4) > 0
			got, reused, err := cache.Render(sid, msgs, gen)
			if err != nil {
				t.Fatal(err)
			}
			want, err := tmpl.RenderChat(msgs, gen)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("conversation %d turn %d: incremental rendering differs from whole rendering", c, turn)
			}
			common := 0
			for common < len(sent) && common < len(msgs) && sameText(t, sent[common], msgs[common]) {
				common++
			}
			if wantReused := renderedLen(t, tmpl, msgs[:common]); reused != wantReused {
				t.Fatalf("conversation %d turn %d: reused %d tokens, want %d", c, turn, reused, wantReused)
			}
			if n := countID(got, IMStartID); n != len(msgs)+boolInt(gen) {
				t.Fatalf("conversation %d turn %d: %d im_start ids for %d messages", c, turn, n, len(msgs))
			}
			if n := countID(got, IMEndID); n != len(msgs) {
				t.Fatalf("conversation %d turn %d: %d im_end ids for %d messages", c, turn, n, len(msgs))
			}
			sent = slices.Clone(msgs)
			totalReused += reused
			totalTokens += len(got)
		}
	}
	t.Logf("reused %d of %d tokens", totalReused, totalTokens)
}

// TestRenderSessionPieces renders turns, edits and regenerations of one
// session and checks each Rendering: its ids from any position equal the
// whole rendering's, its base is the previous turn's rendering with the
// ids they share, and values attached to a rendering stay with it.
func TestRenderSessionPieces(t *testing.T) {
	tmpl := mustChatML(t)
	cache, err := NewSessionCache(tmpl, 10, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	var msgs []Message
	var prev *Rendering
	for turn := range 40 {
		switch p := rng.IntN(10); {
		case p < 2 && len(msgs) > 1:
			msgs = msgs[:len(msgs)-1]
		case p < 3 && len(msgs) > 0:
			msgs = slices.Clone(msgs)
			msgs[rng.IntN(len(msgs))] = randomMessage(rng)
		}
		msgs = append(slices.Clip(msgs), randomMessage(rng))
		gen := rng.IntN(2) == 0
		r, base, shared, err := cache.RenderSession("s", msgs, gen)
		if err != nil {
			t.Fatal(err)
		}
		want, err := tmpl.RenderChat(msgs, gen)
		if err != nil {
			t.Fatal(err)
		}
		if r.Len() != len(want) || !slices.Equal(r.IDs(), want) {
			t.Fatalf("turn %d: rendering of %d ids differs from the whole rendering of %d", turn, r.Len(), len(want))
		}
		if gotMsg, wantMsg := r.MessageTokens(), renderedLen(t, tmpl, msgs); gotMsg != wantMsg {
			t.Fatalf("turn %d: %d message tokens, want %d", turn, gotMsg, wantMsg)
		}
		for range 8 {
			from := rng.IntN(len(want) + 1)
			if got := r.AppendIDs([]uint32{7}, from); got[0] != 7 || !slices.Equal(got[1:], want[from:]) {
				t.Fatalf("turn %d: ids from %d differ", turn, from)
			}
		}
		switch {
		case base == nil && shared != 0:
			t.Fatalf("turn %d: no base but %d shared ids", turn, shared)
		case base != nil && base != prev:
			t.Fatalf("turn %d: base is not the previous turn's rendering", turn)
		case base != nil:
			if shared == 0 || !slices.Equal(base.IDs()[:shared], want[:shared]) {
				t.Fatalf("turn %d: %d shared ids differ from the base's", turn, shared)
			}
			if v, ok := base.Aux("turn"); !ok || v != turn-1 {
				t.Fatalf("turn %d: base's aux value %v %v, want %d", turn, v, ok, turn-1)
			}
		}
		if _, ok := r.Aux("turn"); ok {
			t.Fatalf("turn %d: a new rendering has an aux value", turn)
		}
		r.SetAux("other", "x")
		r.SetAux("turn", -1)
		r.SetAux("turn", turn)
		prev = r
	}
	if r, base, shared, err := cache.RenderSession("", msgs, true); err != nil || base != nil || shared != 0 || r.Len() != renderedLen(t, tmpl, msgs)+len(tmpl.AppendGenerationPrompt(nil)) {
		t.Fatalf("without a session: %v base %v shared %d", err, base, shared)
	}
}

func sameText(t *testing.T, a, b Message) bool {
	t.Helper()
	x, err := a.Content.PlainText()
	if err != nil {
		t.Fatal(err)
	}
	y, err := b.Content.PlainText()
	if err != nil {
		t.Fatal(err)
	}
	return a.Role == b.Role && x == y
}

func countID(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func msgs(texts ...string) []Message {
	out := make([]Message, len(texts))
	for i, s := range texts {
		out[i] = Message{Role: roles[1+i%2], Content: TextContent(s)}
	}
	return out
}

func TestSessionCacheReuse(t *testing.T) {
	tmpl := mustChatML(t)
	cache, err := NewSessionCache(tmpl, 10, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	conv := msgs("hello", "hi there", "how are you?")
	if _, reused, err := cache.Render("s", conv[:1], true); err != nil || reused != 0 {
		t.Fatalf("first turn: reused %d, %v", reused, err)
	}
	// The generation prompt is not part of the cached prefix.
	if _, reused, err := cache.Render("s", conv, true); err != nil || reused != renderedLen(t, tmpl, conv[:1]) {
		t.Fatalf("second turn: reused %d, %v", reused, err)
	}
	// Same messages again: everything reused.
	if _, reused, err := cache.Render("s", conv, false); err != nil || reused != renderedLen(t, tmpl, conv) {
		t.Fatalf("repeat: reused %d, %v", reused, err)
	}
	// No session id: no caching.
	if _, reused, err := cache.Render("", conv, false); err != nil || reused != 0 || cache.Len() != 1 {
		t.Fatalf("empty session id: reused %d, len %d, %v", reused, cache.Len(), err)
	}
	// Errors leave the entry alone.
	bad := append(slices.Clone(conv), Message{Role: "user", Content: Content{Parts: []ContentPart{{Type: "image_url"}}}})
	if _, _, err := cache.Render("s", bad, false); !errors.Is(err, ErrUnsupportedContent) || !strings.Contains(err.Error(), "message 3") {
		t.Fatalf("bad part: %v", err)
	}
	bad[3] = Message{Role: "developer", Content: TextContent("x")}
	if _, _, err := cache.Render("s", bad, false); !errors.Is(err, ErrUnsupportedRole) {
		t.Fatalf("bad role: %v", err)
	}
	if _, reused, _ := cache.Render("s", conv, false); reused != renderedLen(t, tmpl, conv) {
		t.Fatalf("entry changed by failed renders: reused %d", reused)
	}
	cache.Forget("s")
	if cache.Len() != 0 || cache.Tokens() != 0 {
		t.Fatalf("after Forget: len %d tokens %d", cache.Len(), cache.Tokens())
	}
}

func TestSessionCacheBounds(t *testing.T) {
	tmpl := mustChatML(t)
	if _, err := NewSessionCache(tmpl, 0, 10); err == nil {
		t.Error("zero session bound accepted")
	}
	if _, err := NewSessionCache(tmpl, 10, -1); err == nil {
		t.Error("negative token bound accepted")
	}
	if _, err := NewSessionCache(nil, 10, 10); err == nil {
		t.Error("nil template accepted")
	}

	one := msgs("hello")
	per := renderedLen(t, tmpl, one)
	cache, err := NewSessionCache(tmpl, 3, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b", "c", "a", "d"} { // touching a makes b the oldest
		if _, _, err := cache.Render(s, one, true); err != nil {
			t.Fatal(err)
		}
	}
	if cache.Len() != 3 || cache.Tokens() != 3*per {
		t.Fatalf("len %d tokens %d, want 3 and %d", cache.Len(), cache.Tokens(), 3*per)
	}
	for _, s := range []string{"a", "c", "d", "b"} { // b last: rendering it evicts
		if _, reused, _ := cache.Render(s, one, false); (reused > 0) != (s != "b") {
			t.Errorf("session %s: reused %d", s, reused)
		}
	}

	// Byte bound: room for two one-message sessions.
	probe, err := NewSessionCache(tmpl, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := probe.Render("x", one, false); err != nil {
		t.Fatal(err)
	}
	size := probe.Bytes()
	if size < 4*per+len("hello") {
		t.Fatalf("a session of %d ids and 5 bytes of text charged %d bytes", per, size)
	}
	cache, err = NewSessionCache(tmpl, 100, 2*size+1)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"x", "y", "z"} {
		if _, _, err := cache.Render(s, one, false); err != nil {
			t.Fatal(err)
		}
		if cache.Bytes() > 2*size+1 {
			t.Fatalf("bytes %d over bound %d", cache.Bytes(), 2*size+1)
		}
	}
	if cache.Len() != 2 || cache.Tokens() != 2*per {
		t.Fatalf("len %d tokens %d, want 2 and %d", cache.Len(), cache.Tokens(), 2*per)
	}
	// A session larger than the bound is not cached and evicts nobody.
	big := msgs(strings.Repeat("word ", 100))
	if _, _, err := cache.Render("big", big, false); err != nil {
		t.Fatal(err)
	}
	if cache.Len() != 2 || cache.Bytes() != 2*size {
		t.Fatalf("after oversize session: len %d bytes %d", cache.Len(), cache.Bytes())
	}
	// Growing an existing session past the bound drops it.
	if _, _, err := cache.Render("z", append(slices.Clone(one), big...), false); err != nil {
		t.Fatal(err)
	}
	if cache.Len() != 1 || cache.Bytes() != size || cache.Tokens() != per {
		t.Fatalf("after oversize growth: len %d bytes %d tokens %d", cache.Len(), cache.Bytes(), cache.Tokens())
	}
}

// TestSessionCacheBoundsMemory fills a cache with sessions whose text is as
// large as their ids: the live heap the cache keeps, measured after a
// garbage collection, stays within its byte bound, text included.
func TestSessionCacheBoundsMemory(t *testing.T) {
	tmpl := mustChatML(t)
	const bound = 4 << 20
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	base := heap()
	cache, err := NewSessionCache(tmpl, 1000, bound)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		text := strings.Repeat(fmt.Sprintf("the cat %d sat on a mat ", i), (512<<10)/24)
		if _, _, err := cache.Render(fmt.Sprintf("s%d", i), []Message{{Role: "user", Content: TextContent(text)}}, true); err != nil {
			t.Fatal(err)
		}
	}
	if cache.Bytes() > bound {
		t.Fatalf("cache charged %d bytes, over its bound %d", cache.Bytes(), bound)
	}
	// Slack for the tokenizer's pooled scratch buffer and runtime noise.
	const slack = 2 << 20
	if held := heap() - base; held > bound+slack {
		t.Fatalf("cache of %d sessions (%d tokens) holds %d bytes of heap, over its bound %d (+%d slack)",
			cache.Len(), cache.Tokens(), held, bound, slack)
	}
	runtime.KeepAlive(cache)
}

func TestSessionCacheConcurrent(t *testing.T) {
	tmpl := mustChatML(t)
	cache, err := NewSessionCache(tmpl, 6, 1<<20) // fewer slots than sessions: evictions race too
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 10))
	const sessions = 8
	convs := make([][]Message, sessions)
	for i := range convs {
		for range 12 {
			convs[i] = append(convs[i], Message{Role: roles[1+r.IntN(2)], Content: TextContent(randomText(r, 20))})
		}
	}
	want := make([][][]uint32, sessions)
	for i, conv := range convs {
		for k := range conv {
			w, err := tmpl.RenderChat(conv[:k+1], true)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], w)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 11))
			for range 150 {
				s, k := r.IntN(sessions), r.IntN(12)
				got, _, err := cache.Render(fmt.Sprint("s", s), convs[s][:k+1], true)
				if err != nil {
					errs <- err
					return
				}
				if !slices.Equal(got, want[s][k]) {
					errs <- fmt.Errorf("session %d, %d messages: wrong rendering", s, k+1)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if cache.Len() > 6 {
		t.Errorf("len %d over bound", cache.Len())
	}
}
