package workload

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestReadValid(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}

{"timestamp": 40.5, "input_length": 512, "output_length": 3, "hash_ids": [0], "session_id": "s1"}
`
	recs, err := Read(strings.NewReader(in), 512)
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Timestamp: 0, InputLength: 1000, OutputLength: 6, HashIDs: []int64{0, 1}},
		{Timestamp: 40.5, InputLength: 512, OutputLength: 3, HashIDs: []int64{0}, SessionID: "s1"},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got %+v, want %+v", recs, want)
	}
}

func TestReadBadLinesNameTheLine(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [7]}` + "\n"
	cases := map[string]string{
		"not json":         `{"timestamp": 0,`,
		"missing hash_ids": `{"timestamp": 0, "input_length": 10, "output_length": 1}`,
		"missing ts":       `{"input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		"too few ids":      `{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}`,
		"too many ids":     `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}`,
		"zero input":       `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`,
		"zero output":      `{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}`,
		"negative ts":      `{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		"string id":        `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}`,
		"array line":       `[1, 2, 3]`,
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Read(strings.NewReader(good+good+bad+"\n"+good), 512)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), "line 3") {
				t.Fatalf("error %q does not name line 3", err)
			}
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %q does not wrap ErrBadRecord", err)
			}
		})
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	recs, err := GenerateSessions(SessionPresets["agent"])
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Write(&buf, recs); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf, DefaultBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, recs) {
		t.Fatal("records changed in a write/read round trip")
	}
}

func TestBlockTokens(t *testing.T) {
	a := BlockTokens(nil, 42, 512)
	b := BlockTokens(nil, 42, 512)
	if !slices.Equal(a, b) {
		t.Fatal("equal ids gave different tokens")
	}
	if short := BlockTokens(nil, 42, 100); !slices.Equal(short, a[:100]) {
		t.Fatal("a partial block is not a prefix of the full block")
	}
	c := BlockTokens(nil, 43, 512)
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
		if a[i] >= VocabSize {
			t.Fatalf("token %d out of the vocabulary", a[i])
		}
	}
	if same > 5 {
		t.Fatalf("ids 42 and 43 share %d of 512 token positions", same)
	}
	r := Record{InputLength: 700, OutputLength: 1, HashIDs: []int64{42, 9}}
	p := Prompt(nil, &r, 512)
	if len(p) != 700 || !slices.Equal(p[:512], a) || !slices.Equal(p[512:], BlockTokens(nil, 9, 188)) {
		t.Fatal("Prompt is not the ids' tokens in order, the last one cut")
	}
}

func TestIdealHits(t *testing.T) {
	recs := []Record{
		{InputLength: 1000, OutputLength: 1, HashIDs: []int64{0, 1}}, // 512 + 488 (partial: 480 cached)
		{InputLength: 1024, OutputLength: 1, HashIDs: []int64{0, 1}}, // 512 + 480 of id 1 seen, then the rest missing
		{InputLength: 1100, OutputLength: 1, HashIDs: []int64{0, 1, 2}},
		{InputLength: 512, OutputLength: 1, HashIDs: []int64{0}},    // all seen: capped at 496
		{InputLength: 600, OutputLength: 1, HashIDs: []int64{5, 6}}, // new
	}
	got := IdealHits(recs, 512, 16)
	want := []int{0, 992, 1024, 496, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("IdealHits = %v, want %v", got, want)
	}
}

func TestSummarizeWorkingSet(t *testing.T) {
	recs := []Record{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []int64{0, 1}},
		{Timestamp: 500, InputLength: 512, OutputLength: 1, HashIDs: []int64{7}},
		{Timestamp: 1000, InputLength: 1536, OutputLength: 1, HashIDs: []int64{0, 1, 2}},
		{Timestamp: 3000, InputLength: 512, OutputLength: 1, HashIDs: []int64{0}},
	}
	s := Summarize(recs, 512)
	if s.HotWorkingSetTokens != 2*512 || s.UniqueBlocks != 4 || s.DurationSec != 3 || s.InputTokens != 3584 {
		t.Fatalf("Summarize = %+v", s)
	}
}

func TestGenerateSessionsSeedExample(t *testing.T) {
	recs, err := GenerateSessions(SessionPresets["seed-example"])
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 200 {
		t.Fatalf("%d records, want 100 sessions × 2 turns", len(recs))
	}
	turns := make(map[string][]Record)
	for _, r := range recs {
		if err := r.Validate(DefaultBlockSize); err != nil {
			t.Fatal(err)
		}
		turns[r.SessionID] = append(turns[r.SessionID], r)
	}
	var sys []int64
	for id, ts := range turns {
		if len(ts) != 2 || ts[0].InputLength != 4200 || ts[1].InputLength != 5100 || ts[0].OutputLength != 700 {
			t.Fatalf("session %s: %+v, want turns of 4,200 and 5,100 tokens", id, ts)
		}
		if ts[1].Timestamp < ts[0].Timestamp {
			t.Fatalf("session %s: turn 2 before turn 1", id)
		}
		// Turn 1's 8 full blocks are turn 2's first 8; its partial 9th is not.
		if !slices.Equal(ts[0].HashIDs[:8], ts[1].HashIDs[:8]) || ts[0].HashIDs[8] == ts[1].HashIDs[8] {
			t.Fatalf("session %s: ids %v then %v", id, ts[0].HashIDs, ts[1].HashIDs)
		}
		// The 1,200-token system prompt fills the first two blocks of every
		// session, and only those.
		if sys == nil {
			sys = ts[0].HashIDs[:2]
		} else if !slices.Equal(sys, ts[0].HashIDs[:2]) {
			t.Fatalf("session %s does not share the system prompt's blocks", id)
		}
	}
	if !slices.IsSortedFunc(recs, func(a, b Record) int { return int(a.Timestamp - b.Timestamp) }) {
		t.Fatal("records not in arrival order")
	}
}

func TestGeneratorsAreDeterministic(t *testing.T) {
	a, err := GenerateSessions(SessionPresets["agent"])
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateSessions(SessionPresets["agent"])
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same config and seed gave different sessions")
	}
	c := SessionPresets["agent"]
	c.Seed = 2
	d, _ := GenerateSessions(c)
	if reflect.DeepEqual(a, d) {
		t.Fatal("a different seed gave the same sessions")
	}
	sp := SharedPrefixConfig{Groups: 3, PromptsPerGroup: 4, SystemTokens: 2000, QuestionTokens: 100, OutputTokens: 10, Rate: 2, Seed: 1}
	e, err := GenerateSharedPrefix(sp)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := GenerateSharedPrefix(sp)
	if !reflect.DeepEqual(e, f) {
		t.Fatal("same config and seed gave different shared-prefix traces")
	}
}

func TestGenerateSharedPrefixShape(t *testing.T) {
	cfg := SharedPrefixConfig{Groups: 3, PromptsPerGroup: 4, SystemTokens: 2000, QuestionTokens: 100, OutputTokens: 10,
		Requests: 20, Rate: 2, Seed: 1}
	recs, err := GenerateSharedPrefix(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 20 {
		t.Fatalf("%d records, want 20", len(recs))
	}
	groups := make(map[int64]map[int64]bool) // first id -> distinct last ids
	for _, r := range recs {
		if err := r.Validate(DefaultBlockSize); err != nil {
			t.Fatal(err)
		}
		if r.InputLength != 2100 || len(r.HashIDs) != 5 || r.OutputLength != 10 {
			t.Fatalf("record %+v, want 2,100 tokens in 5 blocks", r)
		}
		if groups[r.HashIDs[0]] == nil {
			groups[r.HashIDs[0]] = make(map[int64]bool)
		}
		groups[r.HashIDs[0]][r.HashIDs[4]] = true
	}
	if len(groups) != 3 {
		t.Fatalf("%d distinct system prompts, want 3", len(groups))
	}
	for g, qs := range groups {
		if len(qs) != 4 {
			t.Fatalf("group %d has %d distinct prompts, want 4", g, len(qs))
		}
	}
}

func TestGeneratorConfigErrors(t *testing.T) {
	c := SessionPresets["agent"]
	c.MinTurns, c.MaxTurns = 3, 2
	if _, err := GenerateSessions(c); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("min > max turns: err %v", err)
	}
	if _, err := GenerateSharedPrefix(SharedPrefixConfig{Groups: 1, PromptsPerGroup: 1, SystemTokens: 10, OutputTokens: 1}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("zero rate: err %v", err)
	}
}
