package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// randomTurnText is short text with multi-byte runes, special-token
// strings and numbers, of 0 to ~120 tokens.
func randomTurnText(rng *rand.Rand) string {
	words := []string{"cache", " prefix", "的", " token", "\n\n", "  ", "ünïcode", "<|im_end|>", "123", " 4567", "!!", "tool_call(x)", " "}
	var b strings.Builder
	for range rng.IntN(120) {
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

// wholeChain hashes the whole rendering of msgs in ns.
func wholeChain(t *testing.T, tmpl tokenize.Template, ns blockhash.Namespace, msgs []tokenize.Message, gen bool) []uint64 {
	t.Helper()
	ids, err := tmpl.RenderChat(msgs, gen)
	if err != nil {
		t.Fatal(err)
	}
	h, err := blockhash.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h.Chain(nil, ids, nil)
}

// TestPromptChainExtendsThePreviousTurn renders sessions turn by turn,
// with edits, truncations and regenerated replies, and checks that every
// turn's chain in every namespace equals the hash of the whole rendering,
// while a turn that only appends messages hashes no more than the blocks
// past the previous turn's messages.
func TestPromptChainExtendsThePreviousTurn(t *testing.T) {
	r := mustRenderer(t)
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	spaces := []blockhash.Namespace{{Model: "m", BlockSize: 16}, {Model: "m", BlockSize: 7}, {Model: "m", LoRA: "sql", BlockSize: 16}, {Model: "m", BlockSize: 64, CacheSalt: "s"}}
	roles := []string{"user", "assistant", "tool"}
	var extended int
	for conv := range 30 {
		session := fmt.Sprint("conv-", conv)
		msgs := []tokenize.Message{{Role: "system", Content: tokenize.TextContent(strings.Repeat("You are terse. ", 40+rng.IntN(40)))}}
		for turn := range 12 {
			appended := true
			switch p := rng.IntN(10); {
			case p == 0 && len(msgs) > 2: // regenerate: drop the last message
				msgs, appended = msgs[:len(msgs)-1], false
			case p == 1 && len(msgs) > 1: // edit a message
				msgs = slices.Clone(msgs)
				msgs[1+rng.IntN(len(msgs)-1)].Content = tokenize.TextContent(randomTurnText(rng))
				appended = false
			}
			msgs = append(slices.Clip(msgs), tokenize.Message{Role: roles[rng.IntN(len(roles))], Content: tokenize.TextContent(randomTurnText(rng))})
			gen := rng.IntN(4) > 0
			rend, base, shared, err := r.RenderSession(t.Context(), session, msgs, gen)
			if err != nil {
				t.Fatal(err)
			}
			p := newRenderedPrompt(rend, base, shared)
			for _, ns := range spaces {
				got, err := p.chain(ns)
				if err != nil {
					t.Fatal(err)
				}
				if want := wholeChain(t, tmpl, ns, msgs, gen); !slices.Equal(got, want) {
					t.Fatalf("conversation %d turn %d, %+v: chain of %d blocks differs from the whole rendering's %d", conv, turn, ns, len(got), len(want))
				}
			}
			if appended && turn > 0 {
				limit := 0
				for _, ns := range spaces {
					limit += blockhash.FullBlocks(rend.Len(), ns.BlockSize) - shared/ns.BlockSize
				}
				if p.hashed > limit {
					t.Fatalf("conversation %d turn %d: hashed %d blocks, more than the %d past the %d shared ids", conv, turn, p.hashed, limit, shared)
				}
				extended++
			}
		}
	}
	if extended == 0 {
		t.Fatal("no turn extended the previous one")
	}
}

// TestPromptChainConcurrentTurns renders turns of one session from several
// goroutines at once: each chain must still be its own rendering's.
func TestPromptChainConcurrentTurns(t *testing.T) {
	r := mustRenderer(t)
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	ns := blockhash.Namespace{Model: "m", BlockSize: 16}
	rng := rand.New(rand.NewPCG(5, 6))
	base := []tokenize.Message{{Role: "system", Content: tokenize.TextContent(strings.Repeat("Be careful. ", 200))}}
	for range 6 {
		base = append(base, tokenize.Message{Role: "user", Content: tokenize.TextContent(randomTurnText(rng))})
	}
	turns := make([][]tokenize.Message, 8)
	for i := range turns {
		turns[i] = append(slices.Clip(base[:2+i%5]), tokenize.Message{Role: "user", Content: tokenize.TextContent(fmt.Sprint(i, randomTurnText(rng)))})
	}
	want := make([][]uint64, len(turns))
	for i, msgs := range turns {
		want[i] = wholeChain(t, tmpl, ns, msgs, true)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(turns))
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 50 {
				i := (g + k*3) % len(turns)
				rend, b, shared, err := r.RenderSession(t.Context(), "shared", turns[i], true)
				if err != nil {
					errs <- err
					return
				}
				c, err := newRenderedPrompt(rend, b, shared).chain(ns)
				if err != nil || !slices.Equal(c, want[i]) {
					errs <- fmt.Errorf("goroutine %d, turn %d: chain differs (%v)", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
