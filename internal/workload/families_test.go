package workload

import (
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// commonPrefix is the number of leading hash ids a and b share.
func commonPrefix(a, b []int64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// checkTrace fails unless every record is valid and the trace is in
// arrival order.
func checkTrace(t *testing.T, recs []Record) {
	t.Helper()
	if len(recs) == 0 {
		t.Fatal("no records")
	}
	for i := range recs {
		if err := recs[i].Validate(DefaultBlockSize); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if i > 0 && recs[i].Timestamp < recs[i-1].Timestamp {
			t.Fatalf("record %d at %v ms before record %d at %v ms", i, recs[i].Timestamp, i-1, recs[i-1].Timestamp)
		}
	}
}

// bySession groups records by session id, in trace order.
func bySession(recs []Record) map[string][]Record {
	m := make(map[string][]Record)
	for _, r := range recs {
		m[r.SessionID] = append(m[r.SessionID], r)
	}
	return m
}

func TestZipfPickerDrawsDistinctByWeight(t *testing.T) {
	z := newZipfPicker(5, 1)
	rng := rand.New(rand.NewPCG(7, 7))
	for range 1000 {
		got := z.distinct(rng, nil, 5)
		sorted := slices.Sorted(slices.Values(got))
		if !slices.Equal(sorted, []int{0, 1, 2, 3, 4}) {
			t.Fatalf("5 of 5 ranks drawn as %v, want a permutation", got)
		}
	}
	// First draws follow the weights 1/(r+1); after rank 0 is drawn, the
	// second draw follows the rest renormalised.
	const n = 40000
	first := make([]int, 5)
	secondAfter0, after0 := 0, 0
	for range n {
		got := z.distinct(rng, nil, 2)
		first[got[0]]++
		if got[0] == 0 {
			after0++
			if got[1] == 1 {
				secondAfter0++
			}
		}
	}
	h := 1 + 1.0/2 + 1.0/3 + 1.0/4 + 1.0/5
	for r, c := range first {
		want := 1 / float64(r+1) / h
		if got := float64(c) / n; math.Abs(got-want) > 0.01 {
			t.Fatalf("rank %d drawn first %.3f of the time, want %.3f", r, got, want)
		}
	}
	want := (1.0 / 2) / (h - 1)
	if got := float64(secondAfter0) / float64(after0); math.Abs(got-want) > 0.015 {
		t.Fatalf("rank 1 drawn second after rank 0 %.3f of the time, want %.3f", got, want)
	}
}

func TestGenerateRAGSharesOnlyAgreeingLeadingDocuments(t *testing.T) {
	cfg := RAGConfig{Users: 400, Documents: 20, ZipfS: 1.2, DocsPerRequest: 3, SystemTokens: 1000,
		DocumentTokens: 700, QuestionTokens: 100, OutputTokens: 50, ThinkTimeSec: 5, Rate: 5, Seed: 3}
	recs, err := GenerateRAG(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	if len(recs) != cfg.Users {
		t.Fatalf("%d records, want one per user without follow-ups", len(recs))
	}
	// Two requests agreeing on their first m documents share the system
	// prompt and m documents, ⌊(1000 + 700m)/512⌋ full blocks, and no more:
	// the questions are all different.
	allowed := map[int]int{1: 0, 3: 1, 4: 2, 6: 3} // shared blocks -> m
	seen := make(map[int]int)
	for i := range recs {
		if recs[i].InputLength != 3200 || recs[i].SessionID != "" {
			t.Fatalf("record %+v, want 3,200 tokens and no session", recs[i])
		}
		for j := range i {
			c := commonPrefix(recs[i].HashIDs, recs[j].HashIDs)
			if _, ok := allowed[c]; !ok {
				t.Fatalf("records %d and %d share %d leading blocks, want one of 1, 3, 4 or 6", j, i, c)
			}
			seen[allowed[c]]++
		}
	}
	for m := range 4 {
		if seen[m] == 0 {
			t.Fatalf("no pair agrees on exactly %d leading documents: %v", m, seen)
		}
	}
	// Block 2 is all first document: the most retrieved first document is
	// rank 0's share, 1/H(20, 1.2) ≈ 0.35, far above a uniform 0.05.
	top := func(recs []Record) float64 {
		c := make(map[int64]int)
		for _, r := range recs {
			c[r.HashIDs[2]]++
		}
		return float64(slices.Max(slices.Collect(maps.Values(c)))) / float64(len(recs))
	}
	if got := top(recs); got < 0.28 || got > 0.42 {
		t.Fatalf("top first document in %.2f of requests, want about 0.35", got)
	}
	cfg.ZipfS = 0
	uniform, err := GenerateRAG(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := top(uniform); got > 0.12 {
		t.Fatalf("uniform popularity: top first document in %.2f of requests, want about 0.05-0.1", got)
	}
}

func TestGenerateRAGFollowUpsResendTheContext(t *testing.T) {
	cfg := DefaultRAGConfig()
	cfg.Users, cfg.FollowUps = 100, 3
	recs, err := GenerateRAG(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	sessions := bySession(recs)
	if len(sessions) != cfg.Users || sessions[""] != nil {
		t.Fatalf("%d sessions, want %d named ones", len(sessions), cfg.Users)
	}
	longest := 0
	for id, turns := range sessions {
		if !strings.HasPrefix(id, "u") || len(turns) > 1+cfg.FollowUps {
			t.Fatalf("session %q has %d turns, want 1..%d", id, len(turns), 1+cfg.FollowUps)
		}
		longest = max(longest, len(turns))
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			full := prev.InputLength / DefaultBlockSize
			if cur.InputLength <= prev.InputLength+prev.OutputLength || commonPrefix(prev.HashIDs, cur.HashIDs) < full {
				t.Fatalf("session %s turn %d does not resend turn %d (%d tokens) and its answer", id, k, k-1, prev.InputLength)
			}
		}
	}
	if longest != 1+cfg.FollowUps {
		t.Fatalf("longest session %d turns, want %d", longest, 1+cfg.FollowUps)
	}
}

func TestGenerateRolloutsBurstsAndTrajectories(t *testing.T) {
	cfg := DefaultRolloutsConfig()
	cfg.Groups, cfg.Siblings = 12, 6
	recs, err := GenerateRollouts(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	if len(recs) != 12*6*2 {
		t.Fatalf("%d records, want 12 groups × 6 siblings × 2 rounds", len(recs))
	}
	sessions := bySession(recs)
	if len(sessions) != 12*6 {
		t.Fatalf("%d trajectories, want 72", len(sessions))
	}
	firsts := make(map[string][]Record) // group -> first rounds
	for id, turns := range sessions {
		if len(turns) != 2 {
			t.Fatalf("trajectory %s has %d requests, want 2", id, len(turns))
		}
		a, b := turns[0], turns[1]
		// The second round is the prompt, the sibling's own answer and a tool result.
		if b.InputLength < a.InputLength+a.OutputLength || commonPrefix(a.HashIDs, b.HashIDs) < a.InputLength/DefaultBlockSize {
			t.Fatalf("trajectory %s: second round (%d tokens) does not continue the first (%d + %d)", id, b.InputLength, a.InputLength, a.OutputLength)
		}
		if lo, hi := 1500, 4500; a.OutputLength < lo || a.OutputLength > hi {
			t.Fatalf("trajectory %s: answer of %d tokens, want %d..%d", id, a.OutputLength, lo, hi)
		}
		g, _, _ := strings.Cut(id, ".")
		firsts[g] = append(firsts[g], a)
	}
	sys := cfg.SystemTokens / DefaultBlockSize
	var leads [][]int64
	for g, sibs := range firsts {
		lo, hi := sibs[0].Timestamp, sibs[0].Timestamp
		for _, s := range sibs {
			if !slices.Equal(s.HashIDs, sibs[0].HashIDs) {
				t.Fatalf("group %s: siblings' prompts differ", g)
			}
			lo, hi = min(lo, s.Timestamp), max(hi, s.Timestamp)
		}
		if hi-lo > cfg.SpreadSec*1000+1 {
			t.Fatalf("group %s arrives over %v ms, want within %v s", g, hi-lo, cfg.SpreadSec)
		}
		for _, other := range leads {
			if c := commonPrefix(other, sibs[0].HashIDs); c != sys {
				t.Fatalf("groups share %d leading blocks, want the system prompt's %d", c, sys)
			}
		}
		leads = append(leads, sibs[0].HashIDs)
	}
	// Two siblings' second rounds share the group's prompt and nothing more.
	for id, turns := range sessions {
		for id2, turns2 := range sessions {
			g, _, _ := strings.Cut(id, ".")
			g2, _, _ := strings.Cut(id2, ".")
			if id == id2 || g != g2 {
				continue
			}
			if c, want := commonPrefix(turns[1].HashIDs, turns2[1].HashIDs), turns[0].InputLength/DefaultBlockSize; c != want {
				t.Fatalf("siblings %s and %s share %d blocks in round 2, want the prompt's %d", id, id2, c, want)
			}
		}
	}

	cfg.SecondRound = false
	one, err := GenerateRollouts(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, one)
	if len(one) != 72 || one[0].SessionID != "" {
		t.Fatalf("one round: %d records (session %q), want 72 without sessions", len(one), one[0].SessionID)
	}
}

func TestGenerateMixInterleavesChatsAndClassification(t *testing.T) {
	cfg := DefaultMixConfig()
	cfg.Chat.Sessions = 60
	recs, err := GenerateMix(cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	chat, err := GenerateSessions(cfg.Chat)
	if err != nil {
		t.Fatal(err)
	}
	var mixed, classify []Record
	for _, r := range recs {
		if r.SessionID == "" {
			classify = append(classify, r)
		} else {
			mixed = append(mixed, r)
		}
	}
	if len(mixed) != len(chat) {
		t.Fatalf("%d chat records in the mix, want the chat preset's %d", len(mixed), len(chat))
	}
	for i := range chat {
		a, b := chat[i], mixed[i]
		if a.Timestamp != b.Timestamp || a.InputLength != b.InputLength || a.OutputLength != b.OutputLength || a.SessionID != b.SessionID {
			t.Fatalf("chat record %d: %+v in the mix, %+v alone", i, b, a)
		}
	}
	want := int(math.Round(float64(len(chat)) * cfg.ClassifyFraction / (1 - cfg.ClassifyFraction)))
	if len(classify) != want {
		t.Fatalf("%d classification records, want %d (fraction %v)", len(classify), want, cfg.ClassifyFraction)
	}
	chatIDs := make(map[int64]bool)
	for _, r := range mixed {
		for _, h := range r.HashIDs {
			chatIDs[h] = true
		}
	}
	shared := cfg.InstructionTokens / DefaultBlockSize
	tasks := make(map[int64]bool)
	for i, r := range classify {
		if r.OutputLength < cfg.MinOutput || r.OutputLength > cfg.MaxOutput {
			t.Fatalf("classification output %d, want %d..%d", r.OutputLength, cfg.MinOutput, cfg.MaxOutput)
		}
		if r.Timestamp > chat[len(chat)-1].Timestamp+1 {
			t.Fatalf("classification at %v ms after the last chat turn", r.Timestamp)
		}
		for _, h := range r.HashIDs {
			if chatIDs[h] {
				t.Fatal("a classification prompt shares a block with a chat")
			}
		}
		tasks[r.HashIDs[0]] = true
		for _, o := range classify[:i] {
			c := commonPrefix(r.HashIDs, o.HashIDs)
			if c != 0 && c != shared {
				t.Fatalf("classification prompts share %d leading blocks, want 0 or the instruction's %d", c, shared)
			}
		}
	}
	if len(tasks) != cfg.Instructions {
		t.Fatalf("%d distinct instructions, want %d", len(tasks), cfg.Instructions)
	}
	// Interleaved: classification requests fall both in the first and the
	// last quarter of the chats' span.
	span := chat[len(chat)-1].Timestamp
	if classify[0].Timestamp > span/4 || classify[len(classify)-1].Timestamp < span*3/4 {
		t.Fatalf("classification from %v to %v ms over a %v ms chat span", classify[0].Timestamp, classify[len(classify)-1].Timestamp, span)
	}
}

func TestSessionPresetsSystemHeavyAndLongAgent(t *testing.T) {
	heavy := SessionPresets["system-heavy"]
	recs, err := GenerateSessions(heavy)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	prefixes := make(map[[11]int64]bool) // 6,000 tokens: 11 full blocks
	for id, turns := range bySession(recs) {
		if len(turns) < 1 || len(turns) > 3 {
			t.Fatalf("system-heavy session %s has %d turns, want 1..3", id, len(turns))
		}
		prefixes[[11]int64(turns[0].HashIDs[:11])] = true
	}
	if len(prefixes) != heavy.Tenants {
		t.Fatalf("%d distinct system prompts, want %d tenants", len(prefixes), heavy.Tenants)
	}

	agent := SessionPresets["long-agent"]
	recs, err = GenerateSessions(agent)
	if err != nil {
		t.Fatal(err)
	}
	checkTrace(t, recs)
	sessions := bySession(recs)
	if len(sessions) != agent.Sessions {
		t.Fatalf("%d long-agent sessions, want %d", len(sessions), agent.Sessions)
	}
	for id, turns := range sessions {
		if len(turns) < 10 || len(turns) > agent.MaxTurns {
			t.Fatalf("long-agent session %s has %d turns, want 10..%d", id, len(turns), agent.MaxTurns)
		}
		if last := turns[len(turns)-1].InputLength; last > agent.MaxInputTokens || last < agent.MaxInputTokens/2 {
			t.Fatalf("long-agent session %s ends at %d tokens, want %d..%d", id, last, agent.MaxInputTokens/2, agent.MaxInputTokens)
		}
	}
}

func TestFamilyGeneratorsAreDeterministic(t *testing.T) {
	gens := map[string]func(seed uint64) ([]Record, error){
		"rag": func(seed uint64) ([]Record, error) {
			c := DefaultRAGConfig()
			c.Users, c.Seed = 100, seed
			return GenerateRAG(c)
		},
		"rollouts": func(seed uint64) ([]Record, error) {
			c := DefaultRolloutsConfig()
			c.Groups, c.Seed = 10, seed
			return GenerateRollouts(c)
		},
		"mix": func(seed uint64) ([]Record, error) {
			c := DefaultMixConfig()
			c.Chat.Sessions, c.Seed = 20, seed
			return GenerateMix(c)
		},
	}
	for name, gen := range gens {
		a, err := gen(1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := gen(1)
		c, _ := gen(2)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: the same seed gave different traces", name)
		}
		if reflect.DeepEqual(a, c) {
			t.Fatalf("%s: a different seed gave the same trace", name)
		}
	}
}

func TestFamilyConfigErrors(t *testing.T) {
	rag := DefaultRAGConfig()
	rag.DocsPerRequest = rag.Documents + 1
	rollouts := DefaultRolloutsConfig()
	rollouts.Siblings = 0
	mix := DefaultMixConfig()
	mix.ClassifyFraction = 1
	badChat := DefaultMixConfig()
	badChat.Chat.MinTurns = 0
	outputs := DefaultMixConfig()
	outputs.MinOutput, outputs.MaxOutput = 8, 4
	zipf := DefaultRAGConfig()
	zipf.ZipfS = math.NaN()
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"rag docs", func() error { _, err := GenerateRAG(rag); return err }(), "documents per request 401"},
		{"rag zipf", func() error { _, err := GenerateRAG(zipf); return err }(), "zipf s NaN"},
		{"rollouts", func() error { _, err := GenerateRollouts(rollouts); return err }(), "siblings 0"},
		{"mix fraction", func() error { _, err := GenerateMix(mix); return err }(), "classify fraction 1"},
		{"mix chat", func() error { _, err := GenerateMix(badChat); return err }(), "chat: "},
		{"mix outputs", func() error { _, err := GenerateMix(outputs); return err }(), "output 8..4"},
	} {
		if !errors.Is(c.err, ErrBadConfig) || !strings.Contains(c.err.Error(), c.want) {
			t.Fatalf("%s: err %v, want ErrBadConfig saying %q", c.name, c.err, c.want)
		}
	}
}
