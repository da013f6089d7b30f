package tokenize

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

var benchWords = strings.Fields(`the a of to and in is it that for on with as this was be by
	request cache token router worker prefix session latency model engine block hash
	throughput: scheduling, (queue) "value" 2048 3.14 x86_64 func() {} return err; // TODO
	naïve café 東京 データ — emoji 🙂 ok? yes! don't we'll they're`)

// benchText returns pseudo-English text of about n tokens.
func benchText(r *rand.Rand, tok *BPE, n int) string {
	var sb strings.Builder
	for len(tok.Encode(sb.String())) < n {
		for range 20 {
			sb.WriteString(benchWords[r.IntN(len(benchWords))])
			sb.WriteByte(' ')
		}
		if r.IntN(4) == 0 {
			sb.WriteString(".\n")
		}
	}
	return sb.String()
}

// benchConversation returns a conversation of about total tokens made of
// turns of about perTurn tokens.
func benchConversation(b *testing.B, total, perTurn int) []Message {
	tok := mustCL100K(b)
	tmpl := mustChatML(b)
	r := rand.New(rand.NewPCG(42, 42))
	conv := []Message{{Role: "system", Content: TextContent(benchText(r, tok, 500))}}
	for n := 0; n < total; {
		conv = append(conv, Message{Role: roles[1+len(conv)%2], Content: TextContent(benchText(r, tok, perTurn))})
		ids, err := tmpl.RenderChat(conv, true)
		if err != nil {
			b.Fatal(err)
		}
		n = len(ids)
	}
	return conv
}

// BenchmarkRenderChat32K tokenizes a 32k-token conversation from scratch.
func BenchmarkRenderChat32K(b *testing.B) {
	tmpl := mustChatML(b)
	conv := benchConversation(b, 32768, 400)
	b.ReportAllocs()
	var n int
	for b.Loop() {
		ids, err := tmpl.RenderChat(conv, true)
		if err != nil {
			b.Fatal(err)
		}
		n = len(ids)
	}
	b.ReportMetric(float64(n), "tokens/op")
}

// BenchmarkSessionIncremental32K renders a new turn of about 200 tokens (an
// assistant reply and a user message) onto a warm 32k-token session, into
// one slice (Render).
func BenchmarkSessionIncremental32K(b *testing.B) { benchSessionIncremental(b, false) }

// BenchmarkRenderSession32K is the same turn as pieces shared with the
// session's previous rendering (RenderSession), as the router renders.
func BenchmarkRenderSession32K(b *testing.B) { benchSessionIncremental(b, true) }

func benchSessionIncremental(b *testing.B, pieces bool) {
	tmpl := mustChatML(b)
	tok := mustCL100K(b)
	conv := benchConversation(b, 32768, 400)
	r := rand.New(rand.NewPCG(1, 1))
	var next [2][]Message
	for i := range next {
		next[i] = append(slices.Clip(conv),
			Message{Role: "assistant", Content: TextContent(benchText(r, tok, 100))},
			Message{Role: "user", Content: TextContent(benchText(r, tok, 100))})
	}
	cache, err := NewSessionCache(tmpl, 16, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := cache.Render("s", conv, true); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var n, reused, i int
	for b.Loop() {
		// Alternating turns share conv, so each call reuses conv and
		// tokenizes one new turn.
		if pieces {
			rd, _, ru, err := cache.RenderSession("s", next[i%2], true)
			if err != nil {
				b.Fatal(err)
			}
			n, reused = rd.Len(), ru
		} else {
			ids, ru, err := cache.Render("s", next[i%2], true)
			if err != nil {
				b.Fatal(err)
			}
			n, reused = len(ids), ru
		}
		i++
	}
	b.ReportMetric(float64(n), "tokens/op")
	b.ReportMetric(float64(n-reused), "new-tokens/op")
}

// BenchmarkTiktokenGo32K and BenchmarkTiktokenGo200 run tiktoken-go itself on
// the text of the same workloads, for comparison.
func BenchmarkTiktokenGo32K(b *testing.B) {
	conv := benchConversation(b, 32768, 400)
	var sb strings.Builder
	for _, m := range conv {
		sb.WriteString(m.Role + "\n" + m.Content.Text + "\n")
	}
	benchmarkTiktokenGo(b, sb.String())
}

func BenchmarkTiktokenGo200(b *testing.B) {
	benchmarkTiktokenGo(b, benchText(rand.New(rand.NewPCG(1, 1)), mustCL100K(b), 200))
}

func benchmarkTiktokenGo(b *testing.B, text string) {
	ref := reference(b)
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(ref.EncodeOrdinary(text))
	}
	b.ReportMetric(float64(n), "tokens/op")
}

// BenchmarkEncode200 encodes about 200 tokens of text.
func BenchmarkEncode200(b *testing.B) {
	tok := mustCL100K(b)
	text := benchText(rand.New(rand.NewPCG(1, 1)), tok, 200)
	b.ReportAllocs()
	for b.Loop() {
		tok.Encode(text)
	}
}

// BenchmarkEncodeLongPiece encodes one 64 KiB run of letters, which
// tiktoken-go's quadratic merge takes seconds for.
func BenchmarkEncodeLongPiece(b *testing.B) {
	tok := mustCL100K(b)
	text := strings.Repeat("abcdefgh", 8192)
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}

// BenchmarkLoadCL100K measures parsing the embedded ranks (CL100K does it
// once per process).
func BenchmarkLoadCL100K(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := loadCL100K(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderCompletion1MiB tokenizes 1 MiB of pseudo-English text and
// 1 MiB of spaces, the slowest input: what the router's --max-prompt-bytes
// bounds per request.
func BenchmarkRenderCompletion1MiB(b *testing.B) {
	tmpl := mustChatML(b)
	r := rand.New(rand.NewPCG(1, 1))
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		sb.WriteString(benchWords[r.IntN(len(benchWords))])
		sb.WriteByte(' ')
	}
	inputs := []struct{ name, s string }{
		{"text", sb.String()[:1<<20]},
		{"spaces", strings.Repeat(" ", 1<<20)},
	}
	for _, in := range inputs {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.s)))
			for b.Loop() {
				tmpl.RenderCompletion(in.s)
			}
		})
	}
}
