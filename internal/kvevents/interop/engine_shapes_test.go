package interop

import (
	"bytes"
	"encoding/hex"
	"log/slog"
	"math"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/kvevents"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const shapesScript = "testdata/engine_shapes.py"

// pythonShapes runs testdata/engine_shapes.py and returns its payloads by
// name.
func pythonShapes(t *testing.T) map[string][]byte {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import msgpack").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import msgpack (%v: %s); run `apt-get install python3-msgpack`", python, err, bytes.TrimSpace(out))
	}
	cmd := exec.Command(python, shapesScript)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", python, shapesScript, err, stderr.String())
	}
	m := make(map[string][]byte)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, hx, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad line %q", line)
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m[name] = b
	}
	return m
}

// shapeCase is one payload of engine_shapes.py: the batch it must decode
// to, the form whose encoding must equal it byte for byte (noForm when
// kvdir's encoder cannot write that layout), and a check of its
// translation.
type shapeCase struct {
	want  kvevents.Batch
	form  kvevents.Form
	mode  agent.ReportMode
	check func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats)
}

const noForm kvevents.Form = -1

const shapesTS = 1700000000.25

func hs(us ...uint64) []kvevents.Hash {
	out := make([]kvevents.Hash, len(us))
	for i, u := range us {
		out[i] = kvevents.HashFromUint64(u)
	}
	return out
}

func seq(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func chain(t *testing.T, salt string, toks []uint32) []uint64 {
	t.Helper()
	h, err := blockhash.New(blockhash.Namespace{Model: "test-model", CacheSalt: salt, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	return h.Chain(nil, toks, nil)
}

type storedOut struct {
	parent uint64
	hashes []uint64
	medium kvdirv1.Medium
}

func storedOf(evs []*kvdirv1.Event) (out []storedOut, removed []uint64) {
	for _, e := range evs {
		if s := e.GetStored(); s != nil {
			out = append(out, storedOut{s.Parent, s.Hashes, s.Medium})
		}
		if r := e.GetRemoved(); r != nil {
			removed = append(removed, r.Hashes...)
		}
	}
	return out, removed
}

func expectStored(t *testing.T, evs []*kvdirv1.Event, want []storedOut, wantRemoved []uint64) {
	t.Helper()
	got, removed := storedOf(evs)
	eq := len(got) == len(want)
	for i := 0; eq && i < len(got); i++ {
		eq = got[i].parent == want[i].parent && slices.Equal(got[i].hashes, want[i].hashes) && got[i].medium == want[i].medium
	}
	if !eq || !slices.Equal(removed, wantRemoved) {
		t.Fatalf("stored %+v removed %x; want stored %+v removed %x", got, removed, want, wantRemoved)
	}
}

func shapeCases(t *testing.T) map[string]shapeCase {
	tk := seq(8, 100)
	gpu, cpu, disk, remote := kvdirv1.Medium_MEDIUM_GPU, kvdirv1.Medium_MEDIUM_CPU, kvdirv1.Medium_MEDIUM_DISK, kvdirv1.Medium_MEDIUM_REMOTE
	vllm := func(h []kvevents.Hash, toks []uint32, medium string, group *int, kind string, window *int) *kvevents.BlockStored {
		return &kvevents.BlockStored{BlockHashes: h, TokenIDs: toks, BlockSize: blockSize, Medium: medium,
			GroupIdx: group, SpecKind: kind, SlidingWindow: window}
	}
	rm := func(h []kvevents.Hash, group *int) *kvevents.BlockRemoved {
		return &kvevents.BlockRemoved{BlockHashes: h, Medium: "GPU", GroupIdx: group}
	}
	b := func(evs ...kvevents.Event) kvevents.Batch {
		return kvevents.Batch{TS: shapesTS, Events: evs, DPRank: pto(0)}
	}
	exp := chain(t, "", tk)
	salted := chain(t, "tenant-a", seq(8, 200))
	plain := chain(t, "", seq(8, 200))
	return map[string]shapeCase{
		"vllm_hybrid_mla": {
			want: b(vllm(hs(11, 12), tk, "GPU", pto(0), kvevents.SpecKindSlidingWindow, pto(128)),
				vllm(hs(11, 12), tk, "GPU", pto(1), kvevents.SpecKindMLAAttention, nil),
				rm(hs(12), pto(0)), rm(hs(12), pto(1))),
			form: kvevents.FormMapBatch,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp, gpu}}, exp[1:])
				if st.Problems[agent.ProblemOtherGroup] != 3 {
					t.Fatalf("problems %v: want 2 sliding-window blocks and 1 removal counted", st.Problems)
				}
			},
		},
		"vllm_sink": {
			want: b(vllm(hs(21), tk[:4], "GPU", pto(0), kvevents.SpecKindSinkFullAttention, nil),
				vllm(hs(22), tk[:4], "GPU", pto(1), kvevents.SpecKindMamba, nil)),
			form: kvevents.FormMapBatch,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], gpu}}, nil)
			},
		},
		"vllm_report_full": {
			want: b(vllm(hs(31, 32), tk, "GPU", pto(0), kvevents.SpecKindFullAttention, nil),
				vllm(hs(31, 32), tk, "GPU", pto(0), kvevents.SpecKindFullAttention, nil),
				rm(hs(31, 32), pto(0))),
			form: kvevents.FormMapBatch,
			mode: agent.ReportFull,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp, gpu}, {0, exp, gpu}}, exp)
				if st.Rereported != 2 {
					t.Fatalf("rereported %d, want 2", st.Rereported)
				}
			},
		},
		"vllm_offload_media": {
			want: b(vllm(hs(41), tk[:4], "STORAGE", nil, "", nil), vllm(hs(42), tk[:4], "FS", nil, "", nil),
				vllm(hs(43), tk[:4], "OBJ", nil, "", nil)),
			form: kvevents.FormMapBatch,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], disk}, {0, exp[:1], disk}, {0, exp[:1], remote}}, nil)
			},
		},
		"sglang_eagle_salted": {
			want: b(&kvevents.BlockStored{BlockHashes: hs(51), TokenIDs: seq(4, 200), BlockSize: 4, Medium: "GPU",
				CacheSalt: "tenant-a", Bigram: true, BigramNext: 204},
				&kvevents.BlockStored{BlockHashes: hs(52), Parent: &hs(51)[0], TokenIDs: seq(4, 204), BlockSize: 4,
					Medium: "CPU_PINNED", CacheSalt: "tenant-a", Bigram: true, BigramNext: 208}),
			form: kvevents.FormArray,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, salted[:1], gpu}, {salted[0], salted[1:], cpu}}, nil)
			},
		},
		"sglang_eagle": {
			want: b(&kvevents.BlockStored{BlockHashes: hs(53), TokenIDs: seq(4, 200), BlockSize: 4, Medium: "GPU",
				Bigram: true, BigramNext: 204},
				&kvevents.BlockStored{BlockHashes: hs(54), Parent: &hs(53)[0], TokenIDs: seq(4, 204), BlockSize: 4,
					Medium: "EXTERNAL", Bigram: true, BigramNext: 208}),
			form: noForm, // SGLang's BlockStored has no lora_name
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, plain[:1], gpu}, {plain[0], plain[1:], remote}}, nil)
			},
		},
		"sglang_map_salt": {
			want: b(&kvevents.BlockStored{BlockHashes: hs(55), TokenIDs: tk[:4], BlockSize: 4, Medium: "CPU_TIER1", CacheSalt: "tenant-b"}),
			form: noForm,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, chain(t, "tenant-b", tk[:4]), cpu}}, nil)
			},
		},
		"sglang_removed": {
			want: b(&kvevents.BlockStored{BlockHashes: []kvevents.Hash{kvevents.HashFromInt64(-5)}, TokenIDs: tk[:4], BlockSize: 4, Medium: "GPU"},
				&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashFromInt64(-5), kvevents.HashFromInt64(math.MaxInt64)}, Medium: "GPU"},
				&kvevents.AllBlocksCleared{}),
			form: noForm, // kvdir's encoder writes hashes unsigned
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], gpu}}, exp[:1])
			},
		},
		"sglang_map_removed": {
			want: b(&kvevents.BlockStored{BlockHashes: []kvevents.Hash{kvevents.HashFromInt64(-5)}, TokenIDs: tk[:4], BlockSize: 4},
				&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashFromInt64(-5)}, Medium: "GPU"},
				&kvevents.AllBlocksCleared{}),
			form: noForm,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], gpu}}, exp[:1])
			},
		},
		"trtllm_strings": {
			want: b(&kvevents.BlockStored{BlockHashes: hs(61, 62, 63), TokenIDs: slices.Concat(tk[:4], []uint32{104, 0, 0, 107}, tk[:4]),
				BlockSize: 4, Medium: "GPU", Locality: "LOCAL",
				StrTokens: []kvevents.StrToken{{Index: 5, Value: "<mm:9f2c>"}, {Index: 6, Value: "<mm:9f2c>"}}},
				&kvevents.BlockStored{BlockHashes: hs(64), TokenIDs: tk[:4], BlockSize: 4, Medium: "GPU", Locality: "REMOTE"},
				&kvevents.BlockRemoved{BlockHashes: hs(64), Medium: "GPU", Locality: "REMOTE"}),
			form: kvevents.FormMap,
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], gpu}}, nil)
				if st.Problems[agent.ProblemStringToken] != 2 || st.Problems[agent.ProblemRemoteLocality] != 2 {
					t.Fatalf("problems %v", st.Problems)
				}
			},
		},
		"trtllm_mm_keys": {
			want: b(&kvevents.BlockStored{BlockHashes: hs(65), TokenIDs: tk[:4], BlockSize: 4, Medium: "GPU"}),
			form: noForm, // mm_keys are not decoded
			check: func(t *testing.T, evs []*kvdirv1.Event, st agent.TranslatorStats) {
				expectStored(t, evs, []storedOut{{0, exp[:1], gpu}}, nil)
			},
		},
	}
}

// TestEngineShapes checks kvdir's decoder, encoder and translator against
// payloads Python's msgpack builds in the field order of the upstream event
// classes (see testdata/engine_shapes.py).
func TestEngineShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts /usr/bin/python3 (Debian's python3-msgpack); skipped under -short")
	}
	got := pythonShapes(t)
	cases := shapeCases(t)
	for name := range got {
		if _, ok := cases[name]; !ok {
			t.Errorf("payload %q has no case", name)
		}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			data, ok := got[name]
			if !ok {
				t.Fatalf("%s printed no %q", shapesScript, name)
			}
			b := decode(t, name, data)
			checkBatch(t, name, b, c.want)
			if c.form != noForm {
				if enc := kvevents.EncodeBatch(c.want, c.form); !bytes.Equal(enc, data) {
					t.Fatalf("%v encoding differs from Python's:\n got %x\nwant %x", c.form, enc, data)
				}
			}
			tr := agent.NewTranslator("test-model", 0, slog.New(slog.DiscardHandler))
			tr.SetReportMode(c.mode)
			evs, _ := tr.Translate(nil, b)
			c.check(t, evs, tr.Stats())
		})
	}
}
