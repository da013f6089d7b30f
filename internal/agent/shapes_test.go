package agent

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Translation of the engine shapes of internal/kvevents/shapes_test.go; the
// upstream files each case follows are cited there.

func pint(i int) *int { return &i }

// decodeWire encodes b in form and decodes it again, so that each case goes
// through the wire decoder.
func decodeWire(t *testing.T, b kvevents.Batch, form kvevents.Form) kvevents.Batch {
	t.Helper()
	out, st, err := kvevents.DecodeBatch(kvevents.EncodeBatch(b, form))
	if err != nil || st.Malformed != 0 {
		t.Fatalf("decode: %v %+v", err, st)
	}
	return out
}

func TestTranslateHybridFullAttentionGroup(t *testing.T) {
	ns := blockhash.Namespace{Model: "m", BlockSize: testBS}
	toks := tokens(2*testBS, 3)
	exp := want(t, ns, toks)
	// vLLM numbers groups in layer order: the sliding-window group comes
	// first, the MLA group second. Both announce the same engine hashes.
	sw := stored(nil, toks, 1, 2)
	sw.GroupIdx, sw.SpecKind, sw.SlidingWindow = pint(0), kvevents.SpecKindSlidingWindow, pint(128)
	mla := stored(nil, toks, 1, 2)
	mla.GroupIdx, mla.SpecKind = pint(1), kvevents.SpecKindMLAAttention
	for _, form := range []kvevents.Form{kvevents.FormArray, kvevents.FormMap} {
		tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
		evs, n := tr.Translate(nil, decodeWire(t, batch(sw, mla), form))
		if _, hashes := storedHashes(evs); n != 2 || !slices.Equal(hashes, exp) {
			t.Fatalf("%v: hashes %x, want %x", form, hashes, exp)
		}
		if p := tr.Stats().Problems[ProblemOtherGroup]; p != 2 {
			t.Fatalf("%v: sliding-window blocks counted %d, want 2", form, p)
		}
		// The sliding window evicts block 1 from group 0: the prefix
		// stays reusable; the MLA group's removal is what counts.
		rm := func(g int) *kvevents.BlockRemoved {
			return &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(1)}, Medium: "GPU", GroupIdx: pint(g)}
		}
		if evs, _ := tr.Translate(nil, decodeWire(t, batch(rm(0)), form)); len(evs) != 0 {
			t.Fatalf("%v: sliding-window removal published %v", form, evs)
		}
		evs, _ = tr.Translate(nil, decodeWire(t, batch(rm(1)), form))
		if got := removedHashes(evs); !slices.Equal(got, exp[:1]) {
			t.Fatalf("%v: MLA removal %x, want %x", form, got, exp[:1])
		}
		l := tr.Layout()
		wantLayout := Layout{BlockSizes: []int{testBS}, Groups: []GroupLayout{
			{Group: 0, Kind: kvevents.SpecKindSlidingWindow, BlockSize: testBS, SlidingWindow: 128, Stores: 1, Skipped: 2},
			{Group: 1, Kind: kvevents.SpecKindMLAAttention, BlockSize: testBS, Indexed: true, Stores: 1},
		}}
		if !slices.Equal(l.BlockSizes, wantLayout.BlockSizes) || !slices.Equal(l.Groups, wantLayout.Groups) {
			t.Fatalf("%v: layout %+v, want %+v", form, l, wantLayout)
		}
	}
}

func TestTranslateSpecKinds(t *testing.T) {
	toks := tokens(testBS, 1)
	for kind, indexed := range map[string]bool{
		kvevents.SpecKindFullAttention: true, kvevents.SpecKindMLAAttention: true, kvevents.SpecKindSinkFullAttention: true,
		kvevents.SpecKindSlidingWindow: false, kvevents.SpecKindSlidingWindowMLA: false, kvevents.SpecKindMamba: false,
		kvevents.SpecKindChunkedLocal: false, kvevents.SpecKindCrossAttention: false,
		kvevents.SpecKindEncoderOnlyAttention: false, kvevents.SpecKindUnknown: false, "future_kind": false,
	} {
		tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
		s := stored(nil, toks, 1)
		s.GroupIdx, s.SpecKind = pint(2), kind
		if _, n := tr.Translate(nil, batch(s)); (n == 1) != indexed {
			t.Errorf("kind %q: %d blocks indexed, want indexed=%v", kind, n, indexed)
		}
	}
	// Without a kind (older vLLM) only group 0 is indexed, as before.
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	g1 := stored(nil, toks, 1)
	g1.GroupIdx = pint(1)
	if _, n := tr.Translate(nil, batch(g1)); n != 0 || tr.Stats().Problems[ProblemOtherGroup] != 1 {
		t.Fatalf("kind-less group 1 indexed: %d, %v", n, tr.Stats().Problems)
	}
	if evs, _ := tr.Translate(nil, batch(&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(1)}, GroupIdx: pint(1)})); len(evs) != 0 {
		t.Fatalf("removal from kind-less group 1 published %v", evs)
	}
}

func TestTranslateSGLangBigrams(t *testing.T) {
	// EAGLE/NEXTN/MTP: one page per event, token_ids as bigram pairs.
	toks := tokens(2*testBS+1, 40)
	exp := want(t, blockhash.Namespace{Model: "m", BlockSize: testBS}, toks[:2*testBS])
	s0 := stored(nil, toks[:testBS], 7)
	s0.Bigram, s0.BigramNext, s0.Medium = true, toks[testBS], "GPU"
	s1 := stored(ptr(eh(7)), toks[testBS:2*testBS], 8)
	s1.Bigram, s1.BigramNext = true, toks[2*testBS]
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	evs, n := tr.Translate(nil, decodeWire(t, batch(s0, s1), kvevents.FormArray))
	if _, hashes := storedHashes(evs); n != 2 || !slices.Equal(hashes, exp) {
		t.Fatalf("bigram hashes %x, want %x", hashes, exp)
	}
}

func TestTranslateSGLangCacheSalt(t *testing.T) {
	toks := tokens(2*testBS, 5)
	salted := want(t, blockhash.Namespace{Model: "m", CacheSalt: "tenant-a", BlockSize: testBS}, toks)
	// vLLM's salted store: the salt is the last string of extra_keys[0].
	v := stored(nil, toks, 1, 2)
	v.ExtraKeys = [][]any{{"tenant-a"}, nil}
	// SGLang's: BlockStoredWithMetadata, decoded from both layouts.
	sg := stored(nil, toks, 3, 4)
	sg.CacheSalt, sg.Medium = "tenant-a", "CPU_PINNED"
	for _, tc := range []struct {
		name string
		b    kvevents.Batch
	}{
		{"vllm", batch(v)},
		{"sglang array", decodeWire(t, batch(sg), kvevents.FormArray)},
		{"sglang map", decodeWire(t, batch(sg), kvevents.FormMap)},
	} {
		tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
		evs, _ := tr.Translate(nil, tc.b)
		if _, hashes := storedHashes(evs); !slices.Equal(hashes, salted) {
			t.Fatalf("%s: hashes %x, want the salted chain %x", tc.name, hashes, salted)
		}
	}
	// Unsalted, the same tokens land elsewhere.
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	evs, _ := tr.Translate(nil, batch(stored(nil, toks, 5, 6)))
	if _, hashes := storedHashes(evs); slices.Equal(hashes, salted) {
		t.Fatal("unsalted chain equals the salted one")
	}
}

func TestTranslateReportModeFull(t *testing.T) {
	toks := tokens(testBS, 1)
	exp := want(t, blockhash.Namespace{Model: "m", BlockSize: testBS}, toks)
	rm := batch(&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(7)}, Medium: "GPU"})
	// kv_cache_report_mode="full": the reused block is announced again, in
	// an identical event, and removed once.
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	tr.SetReportMode(ReportFull)
	tr.Translate(nil, batch(stored(nil, toks, 7)))
	if evs, n := tr.Translate(nil, batch(stored(nil, toks, 7))); n != 1 || len(evs) != 1 {
		t.Fatalf("re-reported store: %d blocks %v", n, evs)
	}
	evs, _ := tr.Translate(nil, rm)
	if got := removedHashes(evs); !slices.Equal(got, exp) {
		t.Fatalf("removal after a re-report = %x, want %x", got, exp)
	}
	if st := tr.Stats(); st.Rereported != 1 || st.Problems[ProblemUnknownRemoved] != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Another medium is its own copy.
	cpu := stored(nil, toks, 7)
	cpu.Medium = "CPU"
	tr.Translate(nil, batch(stored(nil, toks, 7), cpu))
	if evs, _ := tr.Translate(nil, rm); len(removedHashes(evs)) != 1 {
		t.Fatalf("GPU removal with a CPU copy: %v", evs)
	}
}

func TestParseMediumEngineNames(t *testing.T) {
	for name, m := range map[string]kvdirv1.Medium{
		"GPU": kvdirv1.Medium_MEDIUM_GPU, "": kvdirv1.Medium_MEDIUM_GPU,
		"CPU": kvdirv1.Medium_MEDIUM_CPU, "CPU_PINNED": kvdirv1.Medium_MEDIUM_CPU, "CPU_TIER1": kvdirv1.Medium_MEDIUM_CPU,
		"DISK": kvdirv1.Medium_MEDIUM_DISK, "STORAGE": kvdirv1.Medium_MEDIUM_DISK, "FS": kvdirv1.Medium_MEDIUM_DISK,
		"CPU_TIER2": kvdirv1.Medium_MEDIUM_DISK,
		"OBJ":       kvdirv1.Medium_MEDIUM_REMOTE, "EXTERNAL": kvdirv1.Medium_MEDIUM_REMOTE,
	} {
		if got, ok := parseMedium(name); !ok || got != m {
			t.Errorf("parseMedium(%q) = %v %v, want %v", name, got, ok, m)
		}
	}
	if _, ok := parseMedium("TAPE"); ok {
		t.Error("TAPE accepted")
	}
}

func TestTranslateRemoteLocality(t *testing.T) {
	toks := tokens(testBS, 1)
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	remote := stored(nil, toks, 7)
	remote.Medium, remote.Locality = "STORAGE", "REMOTE"
	local := stored(nil, toks, 8)
	local.Medium, local.Locality = "STORAGE", "LOCAL"
	evs, n := tr.Translate(nil, decodeWire(t, batch(remote, local), kvevents.FormMap))
	if n != 1 || len(evs) != 1 || evs[0].GetStored().Medium != kvdirv1.Medium_MEDIUM_DISK {
		t.Fatalf("remote and local store: %d blocks %v", n, evs)
	}
	if tr.Stats().Problems[ProblemRemoteLocality] != 1 {
		t.Fatalf("problems %v", tr.Stats().Problems)
	}
	rm := &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(8)}, Medium: "STORAGE", Locality: "REMOTE"}
	if evs, _ := tr.Translate(nil, batch(rm)); len(evs) != 0 || tr.Stats().Problems[ProblemRemoteLocality] != 2 {
		t.Fatalf("remote removal: %v %v", evs, tr.Stats().Problems)
	}
	// A local block stored under a remote one resolves its parent: it is
	// published under the remote block's content hash (which the worker
	// does not hold, so a match stops before it), not dropped.
	child := stored(&[]kvevents.Hash{eh(7)}[0], tokens(testBS, 100), 9)
	child.Medium, child.Locality = "GPU", "LOCAL"
	evs, n = tr.Translate(nil, decodeWire(t, batch(child), kvevents.FormMap))
	if n != 1 || len(evs) != 1 || evs[0].GetStored().Parent == 0 || tr.Stats().Problems[ProblemUnknownParent] != 0 {
		t.Fatalf("local child of a remote block: %d blocks %v, problems %v", n, evs, tr.Stats().Problems)
	}
	// Removing the remote parent as if it were held is an unknown removal:
	// it never gained a reference.
	rmLocal := &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(7)}, Medium: "STORAGE"}
	if evs, _ := tr.Translate(nil, batch(rmLocal)); len(evs) != 0 || tr.Stats().Problems[ProblemUnknownRemoved] != 1 {
		t.Fatalf("local removal of a remote block: %v %v", evs, tr.Stats().Problems)
	}
}

func TestTranslateBlockSizeMismatch(t *testing.T) {
	var logs bytes.Buffer
	tr := NewTranslator("m", 0, slog.New(slog.NewTextHandler(&logs, nil)))
	tr.SetBlockSize(16)
	s := stored(nil, tokens(2*testBS, 1), 1, 2)
	if _, n := tr.Translate(nil, batch(s)); n != 2 {
		t.Fatalf("mismatched store: %d blocks, want 2 (indexed under its own size)", n)
	}
	if p := tr.Stats().Problems[ProblemBlockSizeMismatch]; p != 2 {
		t.Fatalf("mismatch counted %d, want 2", p)
	}
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "engine_block_size=4") || !strings.Contains(out, "configured_block_size=16") {
		t.Fatalf("no warning: %s", out)
	}
	if l := tr.Layout(); !slices.Equal(l.BlockSizes, []int{testBS}) || len(l.Groups) != 1 || l.Groups[0].Group != -1 {
		t.Fatalf("layout %+v", l)
	}
	// A matching size is no problem; the layout survives a clear.
	ok := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	ok.SetBlockSize(testBS)
	ok.Translate(nil, batch(s, &kvevents.AllBlocksCleared{}))
	if p := ok.Stats().Problems[ProblemBlockSizeMismatch]; p != 0 || len(ok.Layout().BlockSizes) != 1 {
		t.Fatalf("matching size: %d problems, layout %+v", p, ok.Layout())
	}
}

func TestTranslateStringTokens(t *testing.T) {
	// TensorRT-LLM: a multimodal placeholder in block 1 of 3. Block 0 is
	// indexed; blocks 1 and 2 cannot be hashed (and block 2's hash names
	// block 1's content too).
	toks := tokens(3*testBS, 1)
	exp := want(t, blockhash.Namespace{Model: "m", BlockSize: testBS}, toks[:testBS])
	s := stored(nil, slices.Clone(toks), 1, 2, 3)
	s.TokenIDs[testBS+1] = 0
	s.StrTokens = []kvevents.StrToken{{Index: testBS + 1, Value: "<mm:9f2c>"}}
	tr := NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	evs, n := tr.Translate(nil, decodeWire(t, batch(s), kvevents.FormMap))
	if _, hashes := storedHashes(evs); n != 1 || !slices.Equal(hashes, exp) {
		t.Fatalf("hashes %x, want %x", hashes, exp)
	}
	if p := tr.Stats().Problems[ProblemStringToken]; p != 2 {
		t.Fatalf("string-token blocks counted %d, want 2", p)
	}
	// A child of block 1 has an unknown parent.
	if _, n := tr.Translate(nil, batch(stored(ptr(eh(2)), tokens(testBS, 9), 4))); n != 0 {
		t.Fatal("child of an unhashable block indexed")
	}
	s.StrTokens[0].Index = 0
	if _, n := tr.Translate(nil, batch(s)); n != 0 {
		t.Fatal("block 0 with a string token indexed")
	}
}

// shapeBatches seed FuzzTranslate with the shapes of this file.
func shapeBatches() []kvevents.Batch {
	toks := tokens(2*testBS, 1)
	sw := stored(nil, toks, 1, 2)
	sw.GroupIdx, sw.SpecKind, sw.SlidingWindow = pint(0), kvevents.SpecKindSlidingWindow, pint(8)
	mla := stored(nil, toks, 1, 2)
	mla.GroupIdx, mla.SpecKind = pint(1), kvevents.SpecKindMLAAttention
	big := stored(nil, toks, 3, 4)
	big.Bigram, big.BigramNext = true, 99
	salt := stored(ptr(eh(3)), toks, 5, 6)
	salt.CacheSalt, salt.Medium, salt.Locality = "s", "CPU_TIER2", "REMOTE"
	str := stored(nil, slices.Clone(toks), 7, 8)
	str.StrTokens = []kvevents.StrToken{{Index: testBS, Value: "<mm>"}}
	return []kvevents.Batch{
		batch(sw, mla, &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(2)}, GroupIdx: pint(1)}),
		batch(big, salt, str, &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{eh(6)}, Medium: "CPU_TIER2", Locality: "REMOTE"}),
	}
}
