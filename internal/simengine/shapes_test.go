package simengine

import (
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// The engine shapes of shapes.go, each run through the engine, encoded,
// decoded by internal/kvevents and translated by internal/agent's
// Translator, as the agent beside a real engine of that shape would.

// shapeRun runs one request of prompt on an engine of shape sh and returns
// the events of its steps.
func shapeRun(t *testing.T, sh Shape, bs, capacity int, salt string, prompt []uint32, maxTokens int) []kvevents.Event {
	t.Helper()
	rec := &recorder{}
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: capacity, Shape: sh}, rec)
	ns := "m"
	if salt != "" {
		ns += "\x00" + salt
	}
	mustSubmit(t, e, 0, Request{ID: "r", Tokens: prompt, MaxTokens: maxTokens, Namespace: ns, CacheSalt: salt})
	drain(t, e, 0)
	return rec.take()
}

// wireTrip encodes evs as the dialect does in form and decodes them.
func wireTrip(t *testing.T, d Dialect, form kvevents.Form, evs []kvevents.Event) kvevents.Batch {
	t.Helper()
	b := kvevents.Batch{TS: 1, Events: evs, DPRank: ptrInt(0)}
	var data []byte
	if d == DialectSGLang {
		var err error
		if data, err = EncodeSGLangBatch(b, form); err != nil {
			t.Fatal(err)
		}
	} else {
		data = kvevents.EncodeBatch(b, form)
	}
	out, st, err := kvevents.DecodeBatch(data)
	if err != nil || st.Malformed != 0 || st.Unknown != 0 {
		t.Fatalf("%v %v: decode: %v %+v", d, form, err, st)
	}
	return out
}

func translate(t *testing.T, b kvevents.Batch) (stored, removed []uint64, tr *agent.Translator) {
	t.Helper()
	tr = agent.NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	evs, _ := tr.Translate(nil, b)
	for _, e := range evs {
		if s := e.GetStored(); s != nil {
			stored = append(stored, s.Hashes...)
		}
		if r := e.GetRemoved(); r != nil {
			removed = append(removed, r.Hashes...)
		}
	}
	return stored, removed, tr
}

func contentChain(t *testing.T, salt string, bs int, toks []uint32) []uint64 {
	t.Helper()
	h, err := blockhash.New(blockhash.Namespace{Model: "m", CacheSalt: salt, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return h.Chain(nil, toks, nil)
}

func seqTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)*3
	}
	return out
}

func storedEvents(evs []kvevents.Event) []*kvevents.BlockStored {
	var out []*kvevents.BlockStored
	for _, ev := range evs {
		if s, ok := ev.(*kvevents.BlockStored); ok {
			out = append(out, s)
		}
	}
	return out
}

func TestShapeMLABlock64(t *testing.T) {
	const bs = 64
	prompt := seqTokens(3*bs+10, 1000)
	sh := Shape{Groups: []KVGroup{{Kind: kvevents.SpecKindMLAAttention}}}
	evs := shapeRun(t, sh, bs, 64, "", prompt, 2)
	for _, s := range storedEvents(evs) {
		if s.GroupIdx == nil || *s.GroupIdx != 0 || s.SpecKind != kvevents.SpecKindMLAAttention || s.SlidingWindow != nil || s.BlockSize != bs {
			t.Fatalf("MLA store %+v", s)
		}
	}
	exp := contentChain(t, "", bs, prompt[:3*bs])
	for _, form := range []kvevents.Form{kvevents.FormArray, kvevents.FormMap} {
		stored, _, tr := translate(t, wireTrip(t, DialectVLLM, form, evs))
		if !slices.Equal(stored, exp) {
			t.Fatalf("%v: indexed %x, want the prompt's chain %x", form, stored, exp)
		}
		if l := tr.Layout(); len(l.Groups) != 1 || l.Groups[0].Kind != kvevents.SpecKindMLAAttention || !l.Groups[0].Indexed {
			t.Fatalf("%v: layout %+v", form, l)
		}
	}
}

func TestShapeHybridBlock528(t *testing.T) {
	const bs, window = 528, 1024
	prompt := seqTokens(6*bs+100, 7)
	sh := Shape{Groups: []KVGroup{{Kind: kvevents.SpecKindSlidingWindow, SlidingWindow: window}, {Kind: kvevents.SpecKindFullAttention}}}
	evs := shapeRun(t, sh, bs, 16, "", prompt, 3)
	var swStored, swRemoved, fullStored int
	for _, ev := range evs {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			switch *e.GroupIdx {
			case 0:
				if e.SpecKind != kvevents.SpecKindSlidingWindow || e.SlidingWindow == nil || *e.SlidingWindow != window {
					t.Fatalf("sliding-window store %+v", e)
				}
				swStored += len(e.BlockHashes)
			case 1:
				if e.SpecKind != kvevents.SpecKindFullAttention || e.SlidingWindow != nil {
					t.Fatalf("full-attention store %+v", e)
				}
				fullStored += len(e.BlockHashes)
			}
		case *kvevents.BlockRemoved:
			if e.GroupIdx == nil || *e.GroupIdx != 0 {
				t.Fatalf("removal from group %v; only the sliding window frees blocks here", e.GroupIdx)
			}
			swRemoved += len(e.BlockHashes)
		}
	}
	// 6 full blocks; with 3270 tokens computed in the end, the window of
	// 1024 skips the first 2247, blocks 0..3 wholly.
	if fullStored != 6 || swStored != 6 || swRemoved != (len(prompt)+2-window+1)/bs {
		t.Fatalf("stored %d full, %d sliding; %d sliding removed", fullStored, swStored, swRemoved)
	}
	exp := contentChain(t, "", bs, prompt[:6*bs])
	for _, form := range []kvevents.Form{kvevents.FormArray, kvevents.FormMap} {
		stored, removed, tr := translate(t, wireTrip(t, DialectVLLM, form, evs))
		if !slices.Equal(stored, exp) || len(removed) != 0 {
			t.Fatalf("%v: indexed %x removed %x, want %x and no removal (the full-attention group keeps them)", form, stored, removed, exp)
		}
		if p := tr.Stats().Problems[agent.ProblemOtherGroup]; p != uint64(swStored+swRemoved) {
			t.Fatalf("%v: sliding-window blocks counted %d, want %d", form, p, swStored+swRemoved)
		}
	}
}

func TestShapeGroupEvictions(t *testing.T) {
	// A cache of 4 blocks: the second request evicts the first one's; the
	// eviction is the full-attention group's (index 1), not the window's.
	const bs = 16
	sh := Shape{Groups: []KVGroup{{Kind: kvevents.SpecKindSlidingWindow, SlidingWindow: 4 * bs}, {Kind: kvevents.SpecKindFullAttention}}}
	rec := &recorder{}
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 4, Shape: sh}, rec)
	mustSubmit(t, e, 0, Request{ID: "a", Tokens: seqTokens(3*bs, 1), MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	mustSubmit(t, e, 0, Request{ID: "b", Tokens: seqTokens(3*bs, 5000), MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	evs := rec.take()
	evicted := 0
	for _, ev := range evs {
		if rm, ok := ev.(*kvevents.BlockRemoved); ok && *rm.GroupIdx == 1 {
			evicted += len(rm.BlockHashes)
		}
	}
	if evicted == 0 {
		t.Fatalf("no full-attention eviction in %s", dumpEvents(evs))
	}
	_, removed, _ := translate(t, wireTrip(t, DialectVLLM, kvevents.FormMap, evs))
	if len(removed) != evicted {
		t.Fatalf("directory removals %d, want the %d evictions", len(removed), evicted)
	}
}

func TestShapeVLLMSalt(t *testing.T) {
	prompt := seqTokens(40, 9)
	evs := shapeRun(t, Shape{}, 16, 16, "tenant-a", prompt, 1)
	stored, _, _ := translate(t, wireTrip(t, DialectVLLM, kvevents.FormArray, evs))
	if exp := contentChain(t, "tenant-a", 16, prompt[:32]); !slices.Equal(stored, exp) {
		t.Fatalf("salted vLLM chain %x, want %x", stored, exp)
	}
}

func TestShapeSGLangBigramsSalted(t *testing.T) {
	const bs = 16
	prompt := seqTokens(3*bs+5, 300)
	sh := Shape{Dialect: DialectSGLang, Bigrams: true}
	evs := shapeRun(t, sh, bs, 16, "tenant-a", prompt, 2)
	ss := storedEvents(evs)
	if len(ss) != 3 {
		t.Fatalf("%d stores, want one per page: %s", len(ss), dumpEvents(evs))
	}
	for i, s := range ss {
		if len(s.BlockHashes) != 1 || !s.Bigram || s.BigramNext != prompt[(i+1)*bs] || s.CacheSalt != "tenant-a" || s.LoRAName != "" {
			t.Fatalf("page %d: %+v", i, s)
		}
	}
	exp := contentChain(t, "tenant-a", bs, prompt[:3*bs])
	for _, form := range []kvevents.Form{kvevents.FormArray, kvevents.FormMap} {
		b := wireTrip(t, DialectSGLang, form, evs)
		for _, ev := range b.Events {
			if s, ok := ev.(*kvevents.BlockStored); ok && (!s.Bigram || s.CacheSalt != "tenant-a") {
				t.Fatalf("%v: decoded %+v", form, s)
			}
		}
		if stored, _, _ := translate(t, b); !slices.Equal(stored, exp) {
			t.Fatalf("%v: indexed %x, want the salted chain %x", form, stored, exp)
		}
		if unsalted := contentChain(t, "", bs, prompt[:3*bs]); slices.Equal(unsalted, exp) {
			t.Fatal("salted and unsalted chains agree")
		}
	}
}

func TestShapeBigramWaitsForNextToken(t *testing.T) {
	// A two-page prompt generating one token: the second page's last pair
	// needs the token after the prompt, which is sampled but never fed
	// back, so only the first page is stored.
	const bs = 16
	evs := shapeRun(t, Shape{Dialect: DialectSGLang, Bigrams: true}, bs, 8, "", seqTokens(2*bs, 1), 1)
	if ss := storedEvents(evs); len(ss) != 1 || ss[0].BigramNext != seqTokens(2*bs, 1)[bs] {
		t.Fatalf("stores %s, want page 0 only", dumpEvents(evs))
	}
	// Without bigrams both pages are stored.
	if ss := storedEvents(shapeRun(t, Shape{Dialect: DialectSGLang}, bs, 8, "", seqTokens(2*bs, 1), 1)); len(ss) != 2 || ss[1].Bigram {
		t.Fatalf("plain SGLang stores %+v", ss)
	}
}

func TestEncodeSGLangLayouts(t *testing.T) {
	// Exact bytes of the layouts (see internal/kvevents/interop for the
	// same against Python's msgpack): a negative hash as int64, the
	// removal's medium, the cleared tag.
	neg := kvevents.HashFromInt64(-5)
	b := kvevents.Batch{TS: 0, DPRank: ptrInt(1), Events: []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{neg}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"},
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{neg}, Medium: "GPU"},
		&kvevents.AllBlocksCleared{},
	}}
	arr, err := EncodeSGLangBatch(b, kvevents.FormArray)
	if err != nil {
		t.Fatal(err)
	}
	ts := []byte{0xcb, 0, 0, 0, 0, 0, 0, 0, 0}
	want := slices.Concat([]byte{0x93}, ts, []byte{0x93,
		0x97, 0xab}, []byte("BlockStored"), []byte{0x91, 0xfb, 0xc0, 0x92, 1, 2, 2, 0xc0, 0xa3}, []byte("GPU"),
		[]byte{0x93, 0xac}, []byte("BlockRemoved"), []byte{0x91, 0xfb, 0xa3}, []byte("GPU"),
		[]byte{0x91, 0xb0}, []byte("AllBlocksCleared"), []byte{0x01})
	if !slices.Equal(arr, want) {
		t.Fatalf("array layout\n got %x\nwant %x", arr, want)
	}
	m, err := EncodeSGLangBatch(b, kvevents.FormMap)
	if err != nil {
		t.Fatal(err)
	}
	got, st, err := kvevents.DecodeBatch(m)
	if err != nil || st.Events != 3 || st.Malformed != 0 {
		t.Fatalf("map layout: %v %+v", err, st)
	}
	if s := got.Events[0].(*kvevents.BlockStored); s.BlockHashes[0] != neg || s.Medium != "GPU" || len(s.TokenIDs) != 2 {
		t.Fatalf("map layout store %+v", s)
	}
	for _, bad := range []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{neg}, TokenIDs: []uint32{1, 2}, BlockSize: 2, LoRAName: "a"},
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{neg}, TokenIDs: []uint32{1, 2}, BlockSize: 2, GroupIdx: ptrInt(0)},
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{kvevents.HashFromBytes([]byte("digest"))}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{neg}, GroupIdx: ptrInt(1)},
		nil,
	} {
		if _, err := EncodeSGLangBatch(kvevents.Batch{Events: []kvevents.Event{bad}}, kvevents.FormArray); !errors.Is(err, ErrNotSGLang) {
			t.Errorf("%+v: err %v, want ErrNotSGLang", bad, err)
		}
	}
	if _, err := EncodeSGLangBatch(b, kvevents.FormMapBatch); !errors.Is(err, ErrNotSGLang) {
		t.Errorf("map-batch form: err %v", err)
	}
}

func TestParseKVGroupsAndShape(t *testing.T) {
	gs, err := ParseKVGroups("sliding_window:1024, full_attention")
	if err != nil || len(gs) != 2 || gs[0] != (KVGroup{Kind: kvevents.SpecKindSlidingWindow, SlidingWindow: 1024}) || gs[1].Kind != kvevents.SpecKindFullAttention {
		t.Fatalf("groups %+v, %v", gs, err)
	}
	if gs, err := ParseKVGroups(""); err != nil || gs != nil {
		t.Fatalf("empty spec: %+v, %v", gs, err)
	}
	for _, bad := range []string{
		"sliding_window:1024", // nothing keeps the prefix
		"sliding_window",      // no window
		"sliding_window:x,full_attention",
		"full_attention:16",                        // a window on full attention
		"chunked_local_attention:8,full_attention", // not emulated
		"mamba", // nothing keeps the prefix
	} {
		if _, err := ParseKVGroups(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err %v, want ErrInvalidConfig", bad, err)
		}
	}
	for _, sh := range []Shape{
		{Dialect: DialectSGLang, Groups: []KVGroup{{Kind: kvevents.SpecKindFullAttention}}},
		{Bigrams: true},
		{Dialect: 9},
	} {
		if err := sh.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v", sh, err)
		}
		if _, err := New(Config{Profile: mustProfile(t, "llama3-8b"), CapacityBlocks: 4, Shape: sh}, nil); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with %+v: err %v", sh, err)
		}
	}
	if d, err := ParseDialect("sglang"); err != nil || d != DialectSGLang || d.String() != "sglang" {
		t.Fatalf("ParseDialect: %v %v", d, err)
	}
	if _, err := ParseDialect("tgi"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("ParseDialect(tgi): %v", err)
	}
}
