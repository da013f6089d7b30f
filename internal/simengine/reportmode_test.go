package simengine

import (
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// directoryState feeds batches of engine events through one agent
// Translator in mode m, as the agent beside the engine would, and returns
// the content hashes the directory holds afterwards (a store adds, a
// removal drops) with the translator.
func directoryState(t *testing.T, m agent.ReportMode, batches []EventBatch) (map[uint64]bool, *agent.Translator) {
	t.Helper()
	tr := agent.NewTranslator("m", 0, slog.New(slog.DiscardHandler))
	tr.SetReportMode(m)
	held := map[uint64]bool{}
	for _, b := range batches {
		for _, form := range []kvevents.Form{kvevents.FormMap} {
			evs, _ := tr.Translate(nil, wireTrip(t, DialectVLLM, form, b.Events))
			for _, e := range evs {
				if s := e.GetStored(); s != nil {
					for _, h := range s.Hashes {
						held[h] = true
					}
				}
				if r := e.GetRemoved(); r != nil {
					for _, h := range r.Hashes {
						delete(held, h)
					}
				}
			}
		}
	}
	return held, tr
}

func TestParseReportMode(t *testing.T) {
	for s, want := range map[string]ReportMode{"": ReportIncremental, "incremental": ReportIncremental, "full": ReportFull} {
		if m, err := ParseReportMode(s); err != nil || m != want {
			t.Errorf("ParseReportMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseReportMode("Full"); err == nil {
		t.Error("ParseReportMode(Full) accepted")
	}
	if err := (Shape{Dialect: DialectSGLang, ReportMode: ReportFull}).Validate(); err == nil {
		t.Error("full report mode accepted in the sglang dialect")
	}
}

// TestReportFullStream checks the full-mode stream: a request hitting the
// prefix cache re-announces its hits as a store identical to the first,
// and translated in agent.ReportFull every held block has one reference,
// so the one eviction of each block drops it from the directory. The same
// stream translated incrementally keeps the re-announced blocks forever.
func TestReportFullStream(t *testing.T) {
	const bs = 16
	rec := &recorder{}
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 8, Shape: Shape{ReportMode: ReportFull}}, rec)
	prompt := seqTokens(4*bs+5, 100)
	mustSubmit(t, e, 0, Request{ID: "a", Tokens: prompt, MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	first := storedEvents(rec.take())
	mustSubmit(t, e, 0, Request{ID: "b", Tokens: prompt, MaxTokens: 1, Namespace: "m"})
	res := drain(t, e, 0)
	if res["b"].CachedTokens != 4*bs {
		t.Fatalf("b cached %d tokens, want %d", res["b"].CachedTokens, 4*bs)
	}
	reused := storedEvents(rec.take())
	if len(first) != 1 || len(reused) != 1 || !reflect.DeepEqual(first[0], reused[0]) {
		t.Fatalf("first store %+v, re-announcement %+v: want one identical store", first, reused)
	}
	// Seven blocks and a token need the whole cache: each of the prompt's
	// four blocks is evicted once.
	other := seqTokens(7*bs+1, 9000)
	mustSubmit(t, e, 0, Request{ID: "c", Tokens: other, MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	batches := rec.batches
	evicted := 0
	for _, b := range batches {
		for _, ev := range b.Events {
			if rm, ok := ev.(*kvevents.BlockRemoved); ok {
				evicted += len(rm.BlockHashes)
			}
		}
	}
	if evicted != 4 {
		t.Fatalf("%d evictions, want the prompt's 4", evicted)
	}
	// The whole stream, from the first store on.
	all := append([]EventBatch{{Events: eventsOf(first)}, {Events: eventsOf(reused)}}, batches...)

	want := contentChain(t, "", bs, other[:7*bs])
	full, tr := directoryState(t, agent.ReportFull, all)
	if got := slices.Sorted(maps.Keys(full)); !slices.Equal(got, sorted(want)) {
		t.Fatalf("full mode: directory holds %x, want only the last request's blocks %x", got, sorted(want))
	}
	if r := tr.Stats().Rereported; r != 4 {
		t.Fatalf("full mode: %d blocks re-reported, want 4", r)
	}
	if n := len(e.Cache().Contents()); n != len(full) {
		t.Fatalf("full mode: directory holds %d blocks, engine caches %d", len(full), n)
	}
	inc, _ := directoryState(t, agent.ReportIncremental, all)
	for _, h := range contentChain(t, "", bs, prompt[:4*bs]) {
		if !inc[h] {
			t.Fatalf("incremental translation dropped %x: the re-announcement should have kept it (the test cannot tell the modes apart)", h)
		}
	}
	if len(inc) != len(want)+4 {
		t.Fatalf("incremental: directory holds %d blocks, want %d", len(inc), len(want)+4)
	}
}

func eventsOf(s []*kvevents.BlockStored) []kvevents.Event {
	out := make([]kvevents.Event, len(s))
	for i, e := range s {
		out[i] = e
	}
	return out
}

func sorted(s []uint64) []uint64 { return slices.Sorted(slices.Values(s)) }

// TestShapeMambaHybrid checks a Mamba group 0 beside a full-attention
// group 1: each Mamba store names only its last block (the state vLLM
// keeps) with the token_ids of all, the previous state is removed when the
// next is stored, the last one when the prefix cache evicts it; the agent
// indexes the full-attention group alone and counts the Mamba blocks.
func TestShapeMambaHybrid(t *testing.T) {
	const bs = 16
	sh := Shape{Groups: []KVGroup{{Kind: kvevents.SpecKindMamba}, {Kind: kvevents.SpecKindFullAttention}}}
	rec := &recorder{}
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 8, MaxBatchedTokens: 2 * bs, Shape: sh}, rec)
	prompt := seqTokens(5*bs+3, 40)
	mustSubmit(t, e, 0, Request{ID: "a", Tokens: prompt, MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	mustSubmit(t, e, 0, Request{ID: "b", Tokens: seqTokens(7*bs+1, 7000), MaxTokens: 1, Namespace: "m"})
	drain(t, e, 0)
	evs := rec.take()

	hs := make([]BlockHash, 5)
	parent := namespaceRoot(0, "m", "")
	for i := range hs {
		hs[i] = hashBlock(parent, prompt[i*bs:(i+1)*bs])
		parent = hs[i]
	}
	var mambaStores [][]kvevents.Hash
	var mambaTokens []int
	var mambaRemoved, fullRemoved []kvevents.Hash
	fullStored := 0
	for _, ev := range evs {
		switch x := ev.(type) {
		case *kvevents.BlockStored:
			switch *x.GroupIdx {
			case 0:
				if x.SpecKind != kvevents.SpecKindMamba {
					t.Fatalf("group 0 store %+v", x)
				}
				mambaStores = append(mambaStores, x.BlockHashes)
				mambaTokens = append(mambaTokens, len(x.TokenIDs))
			case 1:
				fullStored += len(x.BlockHashes)
			}
		case *kvevents.BlockRemoved:
			switch *x.GroupIdx {
			case 0:
				mambaRemoved = append(mambaRemoved, x.BlockHashes...)
			case 1:
				fullRemoved = append(fullRemoved, x.BlockHashes...)
			}
		}
	}
	// Request a: steps of 32, 32 and 19 tokens make blocks [0,2), [2,4)
	// and [4,5) full; request b then evicts all five.
	wantStores := [][]kvevents.Hash{wire(hs[1]), wire(hs[3]), wire(hs[4])}
	if len(mambaStores) < 3 || !reflect.DeepEqual(mambaStores[:3], wantStores) || !slices.Equal(mambaTokens[:3], []int{2 * bs, 2 * bs, bs}) {
		t.Fatalf("Mamba stores %v (tokens %v), want %v (tokens 32, 32, 16)", mambaStores, mambaTokens, wantStores)
	}
	if !slices.Equal(mambaRemoved[:3], wire(hs[1], hs[3], hs[4])) {
		t.Fatalf("Mamba removals %v, want %v: each state once", mambaRemoved, wire(hs[1], hs[3], hs[4]))
	}
	if fullStored != 5+7 || len(fullRemoved) != 5 {
		t.Fatalf("full-attention group stored %d, removed %d; want 12 and 5", fullStored, len(fullRemoved))
	}
	for _, form := range []kvevents.Form{kvevents.FormArray, kvevents.FormMap} {
		stored, removed, tr := translate(t, wireTrip(t, DialectVLLM, form, evs))
		exp := append(contentChain(t, "", bs, prompt[:5*bs]), contentChain(t, "", bs, seqTokens(7*bs, 7000))...)
		if !slices.Equal(sorted(stored), sorted(exp)) || len(removed) != 5 {
			t.Fatalf("%v: indexed %d blocks, removed %d; want the full-attention group's 12 and 5", form, len(stored), len(removed))
		}
		mambaBlocks := len(mambaRemoved)
		for _, s := range mambaStores {
			mambaBlocks += len(s)
		}
		if p := tr.Stats().Problems[agent.ProblemOtherGroup]; p != uint64(mambaBlocks) {
			t.Fatalf("%v: Mamba blocks counted %d, want %d", form, p, mambaBlocks)
		}
		if l := tr.Layout(); len(l.Groups) != 2 || l.Groups[0].Kind != kvevents.SpecKindMamba || l.Groups[0].Indexed || !l.Groups[1].Indexed {
			t.Fatalf("%v: layout %+v", form, l)
		}
	}
}

func TestParseKVGroupsMamba(t *testing.T) {
	gs, err := ParseKVGroups("mamba,full_attention")
	if err != nil || len(gs) != 2 || gs[0].Kind != kvevents.SpecKindMamba || gs[0].String() != "mamba" {
		t.Fatalf("%v %v", gs, err)
	}
	for _, bad := range []string{"mamba", "mamba:4", "mamba,sliding_window:8"} {
		if _, err := ParseKVGroups(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
