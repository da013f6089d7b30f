package agent

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const testBS = 4

func tokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)*7
	}
	return out
}

// want computes the content-hash chain of a prompt directly.
func want(t *testing.T, ns blockhash.Namespace, toks []uint32) []uint64 {
	t.Helper()
	h, err := blockhash.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h.Chain(nil, toks, nil)
}

func eh(u uint64) kvevents.Hash { return kvevents.HashFromUint64(u) }

func stored(parent *kvevents.Hash, toks []uint32, hashes ...uint64) *kvevents.BlockStored {
	s := &kvevents.BlockStored{Parent: parent, TokenIDs: toks, BlockSize: testBS, Medium: "GPU"}
	for _, h := range hashes {
		s.BlockHashes = append(s.BlockHashes, eh(h))
	}
	return s
}

func batch(evs ...kvevents.Event) kvevents.Batch { return kvevents.Batch{Events: evs} }

func ptr(h kvevents.Hash) *kvevents.Hash { return &h }

// storedHashes returns the hashes of all StoredBlocks events in order.
func storedHashes(evs []*kvdirv1.Event) (parents, hashes []uint64) {
	for _, e := range evs {
		if s := e.GetStored(); s != nil {
			parents = append(parents, s.Parent)
			hashes = append(hashes, s.Hashes...)
		}
	}
	return
}

func removedHashes(evs []*kvdirv1.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		if r := e.GetRemoved(); r != nil {
			out = append(out, r.Hashes...)
		}
	}
	return out
}

func TestTranslateChainsAcrossEvents(t *testing.T) {
	ns := blockhash.Namespace{Model: "m", BlockSize: testBS}
	toks := tokens(5*testBS, 100)
	exp := want(t, ns, toks)
	tr := NewTranslator("m", 0, testkit.Logger(t))
	evs, n := tr.Translate(nil, batch(stored(nil, toks[:2*testBS], 11, 12)))
	evs, n2 := tr.Translate(evs, batch(stored(ptr(eh(12)), toks[2*testBS:], 13, 14, 15)))
	if n+n2 != 5 {
		t.Fatalf("blocks = %d, want 5", n+n2)
	}
	parents, hashes := storedHashes(evs)
	if !slices.Equal(hashes, exp) {
		t.Fatalf("hashes %x, want %x", hashes, exp)
	}
	if !slices.Equal(parents, []uint64{0, exp[1]}) {
		t.Fatalf("parents %x, want %x", parents, []uint64{0, exp[1]})
	}
	if c, ok := tr.Lookup(eh(15)); !ok || c != exp[4] {
		t.Fatalf("Lookup(15) = %x %v", c, ok)
	}
}

func TestTranslateNamespaceLoRAAndSalt(t *testing.T) {
	toks := tokens(2*testBS, 5)
	ns := blockhash.Namespace{Model: "m", LoRA: "ad", CacheSalt: "tenant-a", BlockSize: testBS}
	exp := want(t, ns, toks)
	tr := NewTranslator("m", 0, testkit.Logger(t))
	s := stored(nil, toks, 1, 2)
	s.LoRAName = "ad"
	s.ExtraKeys = [][]any{{"ad", "tenant-a"}, {"ad"}}
	evs, _ := tr.Translate(nil, batch(s))
	if _, hashes := storedHashes(evs); !slices.Equal(hashes, exp) {
		t.Fatalf("salted hashes %x, want %x", hashes, exp)
	}
	// The same tokens unsalted land elsewhere.
	evs, _ = tr.Translate(nil, batch(stored(nil, toks, 3, 4)))
	if _, hashes := storedHashes(evs); slices.Equal(hashes, exp) {
		t.Fatal("unsalted chain equals the salted one")
	}
}

func TestTranslateMultimodalExtraKeys(t *testing.T) {
	toks := tokens(2*testBS, 9)
	items := []blockhash.MMItem{{ID: "img", Offset: 2, Length: 4}}
	h, _ := blockhash.New(blockhash.Namespace{Model: "m", BlockSize: testBS})
	exp := h.Chain(nil, toks, items)
	tr := NewTranslator("m", 0, testkit.Logger(t))
	s := stored(nil, toks, 1, 2)
	s.ExtraKeys = [][]any{{[]any{"img", int64(2)}}, {[]any{"img", int64(-2)}}}
	evs, _ := tr.Translate(nil, batch(s))
	if _, hashes := storedHashes(evs); !slices.Equal(hashes, exp) {
		t.Fatalf("mm hashes %x, want %x", hashes, exp)
	}
	s = stored(nil, toks, 3, 4)
	s.ExtraKeys = [][]any{{[]byte{1, 2}}, nil}
	if evs, n := tr.Translate(nil, batch(s)); n != 0 || len(evs) != 0 {
		t.Fatalf("prompt-embeds event translated: %v", evs)
	}
	if tr.Stats().Problems[ProblemUnsupportedExtra] == 0 {
		t.Fatal("unsupported extra keys not counted")
	}
}

func TestTranslateDuplicatesAndRemovals(t *testing.T) {
	toks := tokens(testBS, 1)
	exp := want(t, blockhash.Namespace{Model: "m", BlockSize: testBS}, toks)
	tr := NewTranslator("m", 0, testkit.Logger(t))
	tr.Translate(nil, batch(stored(nil, toks, 7)))
	tr.Translate(nil, batch(stored(nil, toks, 7)))
	rm := &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(7)}, Medium: "GPU"}
	if evs, _ := tr.Translate(nil, batch(rm)); len(removedHashes(evs)) != 0 {
		t.Fatalf("first of two removals published: %v", evs)
	}
	evs, n := tr.Translate(nil, batch(rm))
	if got := removedHashes(evs); n != 1 || !slices.Equal(got, exp) {
		t.Fatalf("second removal = %x, want %x", got, exp)
	}
	// A third removal is unknown.
	if evs, _ := tr.Translate(nil, batch(rm)); len(evs) != 0 {
		t.Fatalf("third removal published: %v", evs)
	}
	if tr.Stats().Problems[ProblemUnknownRemoved] != 1 {
		t.Fatalf("problems %v", tr.Stats().Problems)
	}
	// Media are counted separately.
	cpu := stored(nil, toks, 7)
	cpu.Medium = "CPU"
	tr.Translate(nil, batch(stored(nil, toks, 7), cpu))
	evs, _ = tr.Translate(nil, batch(&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(7)}, Medium: "CPU"}))
	if len(evs) != 1 || evs[0].GetRemoved().Medium != kvdirv1.Medium_MEDIUM_CPU {
		t.Fatalf("cpu removal = %v", evs)
	}
	// A child of a block whose references went to zero still translates.
	evs, _ = tr.Translate(nil, batch(stored(ptr(eh(7)), tokens(testBS, 50), 8)))
	if len(evs) != 1 {
		t.Fatalf("child of unheld parent: %v", evs)
	}
}

func TestTranslateClear(t *testing.T) {
	tr := NewTranslator("m", 0, testkit.Logger(t))
	tr.Translate(nil, batch(stored(nil, tokens(testBS, 1), 7)))
	evs, _ := tr.Translate(nil, batch(&kvevents.AllBlocksCleared{}))
	if len(evs) != 1 || evs[0].GetCleared() == nil || tr.Len() != 0 {
		t.Fatalf("clear: %v, map %d", evs, tr.Len())
	}
	evs, _ = tr.Translate(nil, batch(stored(ptr(eh(7)), tokens(testBS, 2), 8)))
	if len(evs) != 0 || tr.Stats().Problems[ProblemUnknownParent] != 1 {
		t.Fatalf("store under a cleared parent: %v %v", evs, tr.Stats().Problems)
	}
}

func TestTranslateBadInput(t *testing.T) {
	tr := NewTranslator("m", 0, testkit.Logger(t))
	short := stored(nil, tokens(testBS-1, 1), 1)
	badMedium := stored(nil, tokens(testBS, 1), 2)
	badMedium.Medium = "TAPE"
	badBS := stored(nil, tokens(testBS, 1), 3)
	badBS.BlockSize = 0
	mamba := stored(nil, tokens(testBS, 1), 4)
	mamba.SpecKind = "mamba"
	extraLen := stored(nil, tokens(testBS, 1), 5)
	extraLen.ExtraKeys = [][]any{nil, nil}
	var nilStored *kvevents.BlockStored
	evs, n := tr.Translate(nil, batch(short, badMedium, badBS, mamba, extraLen, nilStored, nil,
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(99)}, Medium: "GPU"},
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(99)}, Medium: "weird"},
		stored(nil, nil)))
	if n != 0 || len(evs) != 0 {
		t.Fatalf("bad input produced %v", evs)
	}
	p := tr.Stats().Problems
	for _, k := range []string{ProblemTokenMismatch, ProblemUnknownMedium, ProblemBadBlockSize, ProblemOtherGroup,
		ProblemUnsupportedExtra, ProblemNilEvent, ProblemUnknownRemoved} {
		if p[k] == 0 {
			t.Errorf("problem %s not counted: %v", k, p)
		}
	}
	// Negative, huge and raw-digest engine hashes are opaque ids: accepted.
	neg := stored(nil, tokens(testBS, 1))
	neg.BlockHashes = []kvevents.Hash{kvevents.HashFromInt64(-5)}
	raw := stored(ptr(kvevents.HashFromInt64(-5)), tokens(testBS, 2))
	raw.BlockHashes = []kvevents.Hash{kvevents.HashFromBytes(make([]byte, 32))}
	huge := stored(ptr(kvevents.HashFromBytes(make([]byte, 32))), tokens(testBS, 3), 1<<63+5)
	if _, n := tr.Translate(nil, batch(neg, raw, huge)); n != 3 {
		t.Fatalf("opaque hashes: %d blocks, want 3", n)
	}
}

func TestTranslateMapBounded(t *testing.T) {
	tr := NewTranslator("m", 2, testkit.Logger(t))
	var all []*kvdirv1.Event
	for i := range 3 {
		all, _ = tr.Translate(all, batch(stored(nil, tokens(testBS, uint32(i*100)), uint64(i+1))))
	}
	if tr.Len() != 2 {
		t.Fatalf("map len %d, want 2", tr.Len())
	}
	exp := want(t, blockhash.Namespace{Model: "m", BlockSize: testBS}, tokens(testBS, 0))
	if got := removedHashes(all); !slices.Equal(got, exp) {
		t.Fatalf("evicted removal %x, want %x", got, exp)
	}
	if tr.Stats().Problems[ProblemMapEvicted] != 1 {
		t.Fatalf("problems %v", tr.Stats().Problems)
	}
}

func TestParseLoad(t *testing.T) {
	const text = `# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="m",engine="0"} 3
vllm:num_requests_running{model_name="m",engine="1"} 2
vllm:num_requests_waiting{model_name="m"} 4.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:prefix_cache_queries_total{model_name="m"} 1000
vllm:prefix_cache_queries_created{model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{model_name="m"} 600
garbage line
vllm:num_requests_waiting{bad} NaN
`
	l := ParseLoad(stringsReader(text))
	if l.Running != 5 || l.Waiting != 4 || l.KvUsage != 0.25 || l.PrefixQueries != 1000 || l.PrefixHits != 600 {
		t.Fatalf("load %+v", l)
	}
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }
