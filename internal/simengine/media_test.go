package simengine

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/kvevents"
)

// The offload tier and TensorRT-LLM's ZMQ dialect (offload.go,
// trtllm_wire.go), each run through the engine, encoded in its dialect,
// decoded by internal/kvevents and translated by internal/agent's
// Translator, as the agent beside such an engine would.

// mediaPipe feeds an engine's batches, one by one, through the wire and a
// Translator, and keeps what the directory would hold per medium.
type mediaPipe struct {
	t       *testing.T
	dialect Dialect
	form    kvevents.Form
	tr      *agent.Translator
	held    map[kvdirv1.Medium]map[uint64]int // content hash → references
}

func newMediaPipe(t *testing.T, d Dialect, form kvevents.Form) *mediaPipe {
	return &mediaPipe{t: t, dialect: d, form: form, tr: agent.NewTranslator("m", 0, slog.New(slog.DiscardHandler)),
		held: map[kvdirv1.Medium]map[uint64]int{}}
}

// Publish implements EventSink.
func (p *mediaPipe) Publish(b EventBatch) {
	t := p.t
	wb := kvevents.Batch{TS: 1, Events: b.Events, DPRank: ptrInt(0)}
	var data []byte
	var err error
	switch p.dialect {
	case DialectSGLang:
		data, err = EncodeSGLangBatch(wb, p.form)
	case DialectTRTLLM:
		data, err = EncodeTRTLLMBatch(wb)
	default:
		data = kvevents.EncodeBatch(wb, p.form)
	}
	if err != nil {
		t.Fatalf("%v: encode: %v", p.dialect, err)
	}
	got, st, err := kvevents.DecodeBatch(data)
	if err != nil || st.Malformed != 0 || st.Unknown != 0 {
		t.Fatalf("%v: decode: %v %+v", p.dialect, err, st)
	}
	evs, _ := p.tr.Translate(nil, got)
	for _, e := range evs {
		if s := e.GetStored(); s != nil {
			m := p.held[s.Medium]
			if m == nil {
				m = map[uint64]int{}
				p.held[s.Medium] = m
			}
			for _, h := range s.Hashes {
				m[h]++
			}
		}
		if r := e.GetRemoved(); r != nil {
			for _, h := range r.Hashes {
				if p.held[r.Medium][h] <= 0 {
					t.Fatalf("removal of %x on %v, not held", h, r.Medium)
				}
				if p.held[r.Medium][h]--; p.held[r.Medium][h] == 0 {
					delete(p.held[r.Medium], h)
				}
			}
		}
		if e.GetCleared() != nil {
			clear(p.held)
		}
	}
}

func (p *mediaPipe) problems() map[string]uint64 { return p.tr.Stats().Problems }

// run submits one request and drains the engine.
func runOne(t *testing.T, e *Engine, id, salt string, prompt []uint32) Result {
	t.Helper()
	ns := "m"
	if salt != "" {
		ns += "\x00" + salt
	}
	mustSubmit(t, e, e.Now(), Request{ID: id, Tokens: prompt, MaxTokens: 1, Namespace: ns, CacheSalt: salt})
	return drain(t, e, e.Now())[id]
}

func TestOffloadTierLandsOnDirectoryMedium(t *testing.T) {
	const bs = 4
	for _, tc := range []struct {
		dialect Dialect
		form    kvevents.Form
		medium  string
		want    kvdirv1.Medium
		salt    string
	}{
		{DialectVLLM, kvevents.FormArray, "CPU", kvdirv1.Medium_MEDIUM_CPU, ""},
		{DialectVLLM, kvevents.FormMap, "CPU", kvdirv1.Medium_MEDIUM_CPU, "tenant"},
		{DialectVLLM, kvevents.FormMap, "STORAGE", kvdirv1.Medium_MEDIUM_DISK, ""},
		{DialectVLLM, kvevents.FormArray, "Disk", kvdirv1.Medium_MEDIUM_DISK, ""},
		{DialectSGLang, kvevents.FormArray, "CPU_TIER1", kvdirv1.Medium_MEDIUM_CPU, "tenant"},
		{DialectSGLang, kvevents.FormMap, "CPU_PINNED", kvdirv1.Medium_MEDIUM_CPU, ""},
		{DialectSGLang, kvevents.FormMap, "CPU_TIER2", kvdirv1.Medium_MEDIUM_DISK, ""},
	} {
		t.Run(tc.dialect.String()+"/"+tc.medium, func(t *testing.T) {
			p := newMediaPipe(t, tc.dialect, tc.form)
			// Three GPU blocks: request b's three blocks evict a's.
			e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 3, Shape: Shape{Dialect: tc.dialect},
				OffloadMedium: tc.medium, OffloadBlocks: 16}, p)
			a, b := seqTokens(12, 1), seqTokens(12, 1000)
			runOne(t, e, "a1", tc.salt, a)
			aChain := contentChain(t, tc.salt, bs, a)
			gpu := p.held[kvdirv1.Medium_MEDIUM_GPU]
			if len(gpu) != 3 || gpu[aChain[0]] != 1 || gpu[aChain[2]] != 1 {
				t.Fatalf("after a: GPU %v, want a's chain %x", gpu, aChain)
			}
			runOne(t, e, "b", tc.salt, b)
			tier := p.held[tc.want]
			for _, h := range aChain {
				if tier[h] != 1 {
					t.Fatalf("after b: %v holds %v, want a's blocks %x", tc.want, tier, aChain)
				}
			}
			if e.OffloadedBlocks() == 0 || p.held[kvdirv1.Medium_MEDIUM_GPU][aChain[0]] != 0 {
				t.Fatalf("a's first block still on the GPU: %v (tier %d blocks)", p.held, e.OffloadedBlocks())
			}
			// a again: the GPU misses, the tier holds a's prefix: cached,
			// and loaded back onto the GPU.
			r := runOne(t, e, "a2", tc.salt, a)
			if r.CachedTokens != 8 {
				t.Fatalf("a from the tier: %d cached tokens, want 8", r.CachedTokens)
			}
			if p.held[kvdirv1.Medium_MEDIUM_GPU][aChain[0]] != 1 || p.held[tc.want][aChain[0]] != 1 {
				t.Fatalf("a's first block after the load: %v", p.held)
			}
			if pr := p.problems(); len(pr) != 0 {
				t.Fatalf("translator problems: %v", pr)
			}
			// A reset forgets the tier too (AllBlocksCleared covers it).
			if err := e.Reset(e.Now()); err != nil {
				t.Fatal(err)
			}
			if r := runOne(t, e, "a3", tc.salt, a); r.CachedTokens != 0 || e.OffloadedBlocks() != 0 {
				t.Fatalf("after reset: %d cached, tier %d blocks", r.CachedTokens, e.OffloadedBlocks())
			}
		})
	}
}

func TestOffloadTierIsBounded(t *testing.T) {
	p := newMediaPipe(t, DialectVLLM, kvevents.FormArray)
	e := mustEngine(t, Config{BlockSize: 4, CapacityBlocks: 4, OffloadMedium: "CPU", OffloadBlocks: 2}, p)
	for i := range 6 {
		runOne(t, e, string(rune('a'+i)), "", seqTokens(12, uint32(1000*i+1)))
	}
	if e.OffloadedBlocks() != 2 || len(p.held[kvdirv1.Medium_MEDIUM_CPU]) != 2 {
		t.Fatalf("tier %d blocks, directory CPU %v: want 2", e.OffloadedBlocks(), p.held[kvdirv1.Medium_MEDIUM_CPU])
	}
	if pr := p.problems(); len(pr) != 0 {
		t.Fatalf("translator problems: %v", pr)
	}
}

func TestTRTLLMRemoteStoresAreNotCredited(t *testing.T) {
	const bs = 4
	p := newMediaPipe(t, DialectTRTLLM, kvevents.FormMap)
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 3, Shape: Shape{Dialect: DialectTRTLLM, RemoteEvery: 2}}, p)
	a, b := seqTokens(12, 1), seqTokens(12, 1000)
	runOne(t, e, "a", "", a) // request 1: local
	if gpu := p.held[kvdirv1.Medium_MEDIUM_GPU]; len(gpu) != 3 {
		t.Fatalf("after a: GPU %v, want a's 3 blocks", gpu)
	}
	runOne(t, e, "b", "", b) // request 2: remote; evicts a's blocks
	if gpu := p.held[kvdirv1.Medium_MEDIUM_GPU]; len(gpu) != 0 {
		t.Fatalf("after b: GPU %v, want nothing (a evicted, b remote)", gpu)
	}
	pr := p.problems()
	if pr[agent.ProblemRemoteLocality] != 3 || len(pr) != 1 {
		t.Fatalf("problems %v, want b's 3 blocks as %s", pr, agent.ProblemRemoteLocality)
	}
	// The engine still serves b's prefix: remote blocks are cached. The
	// agent maps remote blocks without crediting them, so the local block
	// request 3 stores after them resolves its parent and is published
	// (under a prefix the worker does not hold, so it matches nothing).
	if r := runOne(t, e, "b2", "", b); r.CachedTokens != 8 {
		t.Fatalf("b again: %d cached, want 8", r.CachedTokens)
	}
	if pr := p.problems(); pr[agent.ProblemUnknownParent] != 0 || pr[agent.ProblemRemoteLocality] != 4 {
		t.Fatalf("problems %v after b2: want no %s and b's block 2's remote removal", pr, agent.ProblemUnknownParent)
	}
	if gpu := p.held[kvdirv1.Medium_MEDIUM_GPU]; len(gpu) != 1 {
		t.Fatalf("after b2: GPU %v, want its one local block", gpu)
	}
}

func TestTRTLLMRemoteRemovalsMatchStores(t *testing.T) {
	p := newMediaPipe(t, DialectTRTLLM, kvevents.FormMap)
	e := mustEngine(t, Config{BlockSize: 4, CapacityBlocks: 3, Shape: Shape{Dialect: DialectTRTLLM, RemoteEvery: 1}}, p)
	runOne(t, e, "a", "", seqTokens(12, 1))
	runOne(t, e, "b", "", seqTokens(12, 1000)) // evicts a's remote blocks
	pr := p.problems()
	if pr[agent.ProblemRemoteLocality] != 3+3+3 || len(pr) != 1 || len(p.held) != 0 {
		t.Fatalf("problems %v, held %v: want a's stores and removals and b's stores skipped as remote, nothing held", pr, p.held)
	}
}

func TestTRTLLMStringTokensAreNotIndexed(t *testing.T) {
	const bs = 4
	p := newMediaPipe(t, DialectTRTLLM, kvevents.FormMap)
	var seen []*kvevents.BlockStored
	sink := SinkFunc(func(b EventBatch) {
		for _, ev := range b.Events {
			if s, ok := ev.(*kvevents.BlockStored); ok {
				seen = append(seen, s)
			}
		}
		p.Publish(b)
	})
	e := mustEngine(t, Config{BlockSize: bs, CapacityBlocks: 16, Shape: Shape{Dialect: DialectTRTLLM, MMEvery: 2}}, sink)
	a, b := seqTokens(12, 1), seqTokens(12, 1000)
	runOne(t, e, "a", "", a) // request 1: text only
	runOne(t, e, "b", "", b) // request 2: multimodal, placeholder at token 4
	if len(seen) != 2 || len(seen[0].StrTokens) != 0 || len(seen[1].StrTokens) != 1 || seen[1].StrTokens[0].Index != bs ||
		!strings.HasPrefix(seen[1].StrTokens[0].Value, mmPrefix) {
		t.Fatalf("stores %+v", seen)
	}
	gpu := p.held[kvdirv1.Medium_MEDIUM_GPU]
	bChain := contentChain(t, "", bs, b)
	if len(gpu) != 4 || gpu[bChain[0]] != 1 || gpu[bChain[1]] != 0 {
		t.Fatalf("GPU %v: want a's 3 blocks and b's first (b chain %x)", gpu, bChain)
	}
	if pr := p.problems(); pr[agent.ProblemStringToken] != 2 || len(pr) != 1 {
		t.Fatalf("problems %v, want b's blocks 1 and 2 as %s", pr, agent.ProblemStringToken)
	}
	// The wire event carries mm_keys aligned with the blocks: decoding
	// keeps the string token where it was.
	data, err := EncodeTRTLLMBatch(kvevents.Batch{TS: 1, Events: []kvevents.Event{seen[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "mm_keys") || !strings.Contains(string(data), "start_offset") {
		t.Fatalf("no mm_keys in %q", data)
	}
	got, _, err := kvevents.DecodeBatch(data)
	if err != nil || got.Events[0].(*kvevents.BlockStored).StrTokens[0] != seen[1].StrTokens[0] || got.DPRank != nil {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestMediaConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{OffloadMedium: "GPU", OffloadBlocks: 4}, "offload medium \"GPU\""},
		{Config{OffloadMedium: "CPU_TIER1", OffloadBlocks: 4}, "the vllm dialect's are CPU"},
		{Config{OffloadMedium: "CPU"}, "OffloadBlocks 0"},
		{Config{OffloadBlocks: 4}, "without an offload medium"},
		{Config{OffloadMedium: "CPU", OffloadBlocks: 4, Shape: Shape{Groups: []KVGroup{{Kind: kvevents.SpecKindFullAttention}}}}, "not emulated"},
		{Config{OffloadMedium: "CPU", OffloadBlocks: 4, Shape: Shape{Dialect: DialectTRTLLM}}, "not emulated in the trtllm dialect"},
		{Config{Shape: Shape{RemoteEvery: 2}}, "set the trtllm dialect"},
		{Config{Shape: Shape{Dialect: DialectSGLang, MMEvery: 1}}, "set the trtllm dialect"},
		{Config{Shape: Shape{Dialect: DialectTRTLLM, RemoteEvery: -1}}, "want >= 0"},
	} {
		tc.cfg.CapacityBlocks, tc.cfg.Profile = 8, mustProfile(t, "llama3-8b")
		_, err := New(tc.cfg, nil)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg.Shape, err, tc.want)
		}
	}
	if d, err := ParseDialect("trtllm"); err != nil || d != DialectTRTLLM || d.String() != "trtllm" {
		t.Fatalf("ParseDialect(trtllm) = %v, %v", d, err)
	}
}

func TestEncodeTRTLLMRefuses(t *testing.T) {
	for _, ev := range []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{kvevents.HashFromUint64(1)}, TokenIDs: []uint32{1}, BlockSize: 1, CacheSalt: "s"},
		&kvevents.BlockStored{BlockHashes: []kvevents.Hash{kvevents.HashFromBytes([]byte("0123456789abcdef"))}, TokenIDs: []uint32{1}, BlockSize: 1},
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashFromBytes([]byte("0123456789abcdef"))}},
	} {
		if _, err := EncodeTRTLLMBatch(kvevents.Batch{Events: []kvevents.Event{ev}}); !errors.Is(err, ErrNotTRTLLM) {
			t.Errorf("%+v: %v, want ErrNotTRTLLM", ev, err)
		}
	}
}
