package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// BenchmarkDecisionWarm32k times the placement decision (render and
// tokenize the new messages, hash, match, score) for one more turn of a
// session of about 32 k tokens, with the matches answered by a local
// replica of the directory (a follow.Follower of a real one-node
// directory), over 4 workers of which one holds the session's blocks in the
// directory and speculatively. Each iteration adds a different ~60-token
// user message to the same conversation, as a client retrying or editing
// its last turn does. p50-µs and p99-µs are the decision's own timing (the
// explain endpoint's decision_us).
func BenchmarkDecisionWarm32k(b *testing.B) {
	benchDecision(b, true, true)
}

// BenchmarkDecisionWarm32k1024Workers is BenchmarkDecisionWarm32k with
// 1,024 candidate workers for the model (one of which holds the session):
// the decision's cost per candidate (score, directory lookups, sorting).
func BenchmarkDecisionWarm32k1024Workers(b *testing.B) {
	benchDecisionWorkers(b, 1024, true, true)
}

// BenchmarkDecisionWarm32kDirectory is the same turn with every match asked
// of the directory node over gRPC.
func BenchmarkDecisionWarm32kDirectory(b *testing.B) {
	benchDecision(b, false, true)
}

// BenchmarkDecisionCold32k is the whole 32 k-token prompt under a new
// session id every time (everything tokenized and hashed), matched by the
// local replica.
func BenchmarkDecisionCold32k(b *testing.B) {
	benchDecision(b, true, false)
}

// benchWords is text of about one cl100k token per word.
var benchWords = strings.Fields(`the cache prefix token block worker router engine session agent model tensor batch queue
latency memory request response stream replica cluster leader follower index chain hash snapshot lease epoch
prefill decode schedule evict store match score place route serve trace replay profile metric budget`)

func benchText(rng *rand.Rand, tokens int) string {
	var sb strings.Builder
	for i := range tokens {
		if i%12 == 11 {
			fmt.Fprintf(&sb, " %d.", rng.IntN(1000))
			continue
		}
		sb.WriteByte(' ')
		sb.WriteString(benchWords[rng.IntN(len(benchWords))])
	}
	return sb.String()
}

// benchConversation returns a conversation of about tokens tokens: a
// system prompt and user/assistant turns of about 4 k tokens.
func benchConversation(rng *rand.Rand, tokens int) []tokenize.Message {
	msgs := []tokenize.Message{{Role: "system", Content: tokenize.TextContent("You are a coding agent." + benchText(rng, 1000))}}
	for n := 1000; n < tokens-512; n += 4096 + 200 {
		msgs = append(msgs, tokenize.Message{Role: "user", Content: tokenize.TextContent(benchText(rng, 4096))},
			tokenize.Message{Role: "assistant", Content: tokenize.TextContent(benchText(rng, 200))})
	}
	return msgs
}

// decisionFixture is a router over a directory holding a 32 k-token
// session on worker w0, and that session's conversation.
type decisionFixture struct {
	s     *Server
	url   string
	base  []tokenize.Message // the session so far
	news  []tokenize.Message // candidates for its next user message
	want  string             // the match source every decision must report
	chain []uint64           // the base's chain, held by w0
}

func newDecisionFixture(b *testing.B, local bool) *decisionFixture {
	return newDecisionFixtureWorkers(b, 4, local)
}

// newDecisionFixtureWorkers is newDecisionFixture with workers candidate
// workers.
func newDecisionFixtureWorkers(b *testing.B, workers int, local bool) *decisionFixture {
	const model, blockSize = "m", 16
	c := dirtest.New(b, 1, func(_ int, cfg *node.Config) { cfg.Lease = time.Hour })
	dc := dirClientFor(b, c)
	ctx := context.Background()
	var epochs []uint64
	for i := range workers {
		up := newUpstream(b, model, okJSON(0))
		reg, err := dc.Register(ctx, &kvdirv1.WorkerSpec{Id: fmt.Sprintf("w%d", i), Address: up.URL, Model: model, BlockSize: blockSize})
		if err != nil {
			b.Fatal(err)
		}
		epochs = append(epochs, reg.GetEpoch())
	}
	var fl *follow.Follower
	if local {
		var err error
		if fl, err = follow.New(follow.Config{Addrs: c.APIAddrs(), Logger: testkit.Logger(b)}); err != nil {
			b.Fatal(err)
		}
		fctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = fl.Run(fctx) }()
		b.Cleanup(func() { stop(); <-done; _ = fl.Close() })
	}
	s, url := testRouter(b, "kvdir", nil, func(cfg *Config) {
		cfg.Directory = dc
		cfg.SpecTTL = time.Hour
		cfg.Explain = ExplainOpen // BenchmarkExplainWarm32k asks explain
		if workers > 64 {
			// The tests' 20 ms would have this one process (router and
			// every engine) serve tens of thousands of scrapes a second.
			cfg.ScrapeInterval = time.Second
			// The same process serving all those engines can keep the
			// replica's stream from a beat for over the default 2 s on a
			// busy machine; the decision's cost is what is timed here.
			cfg.LocalStaleAfter = time.Minute
		}
		if fl != nil {
			cfg.Local = fl
		}
	})
	testkit.Eventually(b, 10*time.Second, "the router to discover the workers", func() (bool, string) {
		return len(s.pool.sorted()) == workers, fmt.Sprint(len(s.pool.sorted()))
	})

	// The session, as the engine of w0 holds it: every full block of the
	// conversation in the directory, and speculatively in this router.
	rng := rand.New(rand.NewPCG(1, 2))
	base := benchConversation(rng, 32768)
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		b.Fatal(err)
	}
	ids, err := tmpl.RenderChat(base, false)
	if err != nil {
		b.Fatal(err)
	}
	h, err := blockhash.New(blockhash.Namespace{Model: model, BlockSize: blockSize})
	if err != nil {
		b.Fatal(err)
	}
	chain := h.Chain(nil, ids, nil)
	pub := dc.NewPublisher("w0", epochs[0])
	b.Cleanup(func() { pub.Close() })
	if _, err := pub.Send(ctx, []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}}); err != nil {
		b.Fatal(err)
	}
	if err := pub.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	s.pool.snapshot()["w0"].spec.add(chain, time.Now())

	news := make([]tokenize.Message, 64)
	for i := range news {
		news[i] = tokenize.Message{Role: "user", Content: tokenize.TextContent(benchText(rng, 60))}
	}
	f := &decisionFixture{s: s, url: url, base: base, news: news, want: MatchDirectory, chain: chain}
	if local {
		f.want = MatchLocal
	}
	testkit.Eventually(b, 20*time.Second, "the session's blocks matched on w0 by "+f.want, func() (bool, string) {
		d, aerr := s.decide(ctx, f.request(0, true), nil)
		if aerr != nil {
			return false, aerr.Error()
		}
		return d.matchSource == f.want && d.pick.Worker == "w0" && d.dir[0] >= len(chain)-1,
			fmt.Sprintf("source %s pick %s dir %v of %d blocks", d.matchSource, d.pick.Worker, d.dir, len(chain))
	})
	return f
}

// request is the session plus its i-th next message, under the session's
// id (warm) or a new one (cold).
func (f *decisionFixture) request(i int, warm bool) *request {
	r := &request{path: PathChat, model: "m", chat: true, addGen: true,
		messages: append(slices.Clip(f.base), f.news[i%len(f.news)])}
	if warm {
		r.session = "bench"
	} else {
		r.session = fmt.Sprintf("cold-%d", i)
	}
	return r
}

func benchDecision(b *testing.B, local, warm bool) {
	benchDecisionWorkers(b, 4, local, warm)
}

func benchDecisionWorkers(b *testing.B, workers int, local, warm bool) {
	f := newDecisionFixtureWorkers(b, workers, local)
	s, ctx := f.s, context.Background()
	times := make([]float64, 0, b.N)
	parts := map[string][]float64{}
	b.ResetTimer()
	for i := range b.N {
		d, aerr := s.decide(ctx, f.request(i+1, warm), nil)
		if aerr != nil {
			b.Fatal(aerr)
		}
		if d.matchSource != f.want || d.pick.Worker != "w0" {
			b.Fatalf("iteration %d: source %s, pick %s", i, d.matchSource, d.pick.Worker)
		}
		times = append(times, us(d.renderDur+d.hashDur+d.matchDur+d.scoreDur))
		parts["render"] = append(parts["render"], us(d.renderDur))
		parts["hash"] = append(parts["hash"], us(d.hashDur))
		parts["match"] = append(parts["match"], us(d.matchDur))
		parts["score"] = append(parts["score"], us(d.scoreDur))
		d.compact(s) // as placing it does
	}
	b.StopTimer()
	reportQuantiles(b, times, parts)
}

// reportQuantiles reports the p50 and p99 of the decision times and of
// each of their parts.
func reportQuantiles(b *testing.B, times []float64, parts map[string][]float64) {
	q := func(xs []float64, p float64) float64 {
		slices.Sort(xs)
		return xs[min(len(xs)-1, int(p*float64(len(xs))))]
	}
	b.ReportMetric(q(times, 0.50), "p50-µs")
	b.ReportMetric(q(times, 0.99), "p99-µs")
	for k, v := range parts {
		b.ReportMetric(q(v, 0.99), k+"-p99-µs")
		b.ReportMetric(q(v, 0.50), k+"-p50-µs")
	}
}

// BenchmarkExplainWarm32k is BenchmarkDecisionWarm32k through the explain
// endpoint over HTTP, as kvbench router measures it: the router reads and
// decodes the whole 32 k-token body (not timed) before the decision, whose
// own timing (decision_us) is reported.
func BenchmarkExplainWarm32k(b *testing.B) {
	f := newDecisionFixture(b, true)
	bodies := make([][]byte, len(f.news))
	for i := range bodies {
		var err error
		if bodies[i], err = json.Marshal(openai.ChatCompletionRequest{Model: "m", Messages: f.request(i, true).messages}); err != nil {
			b.Fatal(err)
		}
	}
	c := &http.Client{}
	explain := func(i int) Explanation {
		req, err := http.NewRequest(http.MethodPost, f.url+PathExplain, bytes.NewReader(bodies[i%len(bodies)]))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set(DefaultSessionHeader, "bench")
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var e Explanation
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("explain: %d %v", resp.StatusCode, err)
		}
		return e
	}
	explain(0)
	times := make([]float64, 0, b.N)
	parts := map[string][]float64{}
	b.ResetTimer()
	for i := range b.N {
		e := explain(i + 1)
		if e.MatchSource != f.want || e.Pick != "w0" {
			b.Fatalf("iteration %d: source %s, pick %s", i, e.MatchSource, e.Pick)
		}
		times = append(times, e.DecisionMicros)
		parts["render"] = append(parts["render"], e.RenderMicros)
		parts["hash"] = append(parts["hash"], e.HashMicros)
		parts["match"] = append(parts["match"], e.MatchMicros)
		parts["score"] = append(parts["score"], e.ScoreMicros)
	}
	b.StopTimer()
	reportQuantiles(b, times, parts)
}
