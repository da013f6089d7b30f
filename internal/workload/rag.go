package workload

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
)

// RAGConfig describes retrieval-augmented questions over a shared corpus.
// Every length is a mean in tokens, drawn within ±Jitter as in
// SessionsConfig; a document's length is drawn once, so a document is the
// same content in every request that retrieves it.
//
// A user's first request is the system prompt (shared by every request),
// DocsPerRequest distinct documents of the corpus in the order retrieved,
// and a question. Documents are drawn by a Zipf popularity of exponent
// ZipfS over their rank (rank r has weight 1/(r+1)^s; 0 is uniform), so
// requests share the system prompt and, beyond it, only as many documents
// as they agree on from the first one. Each user then asks 0..FollowUps
// follow-up questions, each resending the whole conversation (documents,
// earlier questions and answers) after a think time.
type RAGConfig struct {
	Users          int     // user sessions, started at Rate per second (Poisson)
	Documents      int     // documents in the corpus
	ZipfS          float64 // Zipf exponent of document popularity, >= 0
	DocsPerRequest int     // documents retrieved per request, <= Documents
	SystemTokens   int     // system prompt shared by every request
	DocumentTokens int     // document length
	QuestionTokens int     // question per request
	OutputTokens   int     // answer per request, resent in follow-ups
	FollowUps      int     // most follow-up questions per user, uniform in [0, FollowUps]
	ThinkTimeSec   float64 // mean time between a user's requests (exponential)
	Rate           float64 // users per second (Poisson)
	Jitter         float64 // relative spread of every length, in [0, 1)
	BlockSize      int     // tokens per hash id (default 512)
	Seed           uint64
}

// DefaultRAGConfig is a corpus of 400 documents of about 1,500 tokens,
// 4 retrieved per request with Zipf s = 0.9, for 800 users asking up to one
// follow-up: about 1,200 requests of about 7,500 tokens.
func DefaultRAGConfig() RAGConfig {
	return RAGConfig{
		Users: 800, Documents: 400, ZipfS: 0.9, DocsPerRequest: 4, SystemTokens: 1000,
		DocumentTokens: 1500, QuestionTokens: 100, OutputTokens: 250, FollowUps: 1,
		ThinkTimeSec: 20, Rate: 2, Jitter: 0.5, BlockSize: DefaultBlockSize, Seed: 1,
	}
}

func (c *RAGConfig) validate() error {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	var b badf
	b.check(c.Users < 1, "users %d, want >= 1", c.Users)
	b.check(c.Documents < 1, "documents %d, want >= 1", c.Documents)
	b.check(!finiteNonNegative(c.ZipfS), "zipf s %v, want a finite value >= 0", c.ZipfS)
	b.check(c.DocsPerRequest < 0 || c.DocsPerRequest > c.Documents,
		"documents per request %d, want 0..%d (the corpus)", c.DocsPerRequest, c.Documents)
	b.check(c.SystemTokens < 0 || c.DocumentTokens < 0 || c.QuestionTokens < 0, "token lengths must be >= 0")
	b.check(c.DocsPerRequest > 0 && c.DocumentTokens < 1, "documents are retrieved but document tokens is %d", c.DocumentTokens)
	b.check(c.SystemTokens+c.DocsPerRequest*c.DocumentTokens+c.QuestionTokens < 1,
		"requests would be empty: system + documents + question tokens must be >= 1")
	b.check(c.OutputTokens < 1, "output tokens %d, want >= 1", c.OutputTokens)
	b.check(c.FollowUps < 0, "follow-ups %d, want >= 0", c.FollowUps)
	b.check(!finiteNonNegative(c.ThinkTimeSec), "think time %v s, want a finite value >= 0", c.ThinkTimeSec)
	b.check(!finitePositive(c.Rate), "rate %v/s, want a finite value > 0", c.Rate)
	b.check(!(c.Jitter >= 0 && c.Jitter < 1), "jitter %v, want 0 <= jitter < 1", c.Jitter)
	b.check(c.BlockSize < 1, "block size %d, want >= 1", c.BlockSize)
	// The longest request: every length at its maximum, every follow-up.
	hi := func(n int) float64 { return float64(n) * (1 + c.Jitter) }
	if longest := hi(c.SystemTokens) + float64(c.DocsPerRequest)*hi(c.DocumentTokens) +
		float64(c.FollowUps+1)*hi(c.QuestionTokens) + float64(c.FollowUps)*hi(c.OutputTokens); longest > MaxInputLength {
		b.check(true, "requests could reach %.0f tokens, more than %d", longest, MaxInputLength)
	}
	return b.err()
}

// GenerateRAG returns cfg's requests in arrival order. Records carry
// session ids "u<n>" when cfg.FollowUps > 0, none otherwise.
func GenerateRAG(cfg RAGConfig) ([]Record, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x4a6))
	draw := drawer(rng, cfg.Jitter)
	docLen := make([]int, cfg.Documents)
	for d := range docLen {
		docLen[d] = draw(cfg.DocumentTokens)
	}
	pick := newZipfPicker(cfg.Documents, cfg.ZipfS)
	var reqs []pending
	ts := 0.0
	docs := make([]int, 0, cfg.DocsPerRequest)
	for u := range cfg.Users {
		ts += rng.ExpFloat64() / cfg.Rate
		var ctx []segment
		if cfg.SystemTokens > 0 {
			ctx = append(ctx, segment{segKey(kindSystem, 0, 0, 0), cfg.SystemTokens})
		}
		docs = pick.distinct(rng, docs[:0], cfg.DocsPerRequest)
		for _, d := range docs {
			ctx = append(ctx, segment{segKey(kindCorpus, d, 0, 0), docLen[d]})
		}
		at := ts
		for t := range 1 + rng.IntN(cfg.FollowUps+1) {
			if t > 0 {
				at += rng.ExpFloat64() * cfg.ThinkTimeSec
			}
			if n := draw(cfg.QuestionTokens); n > 0 {
				ctx = append(ctx, segment{segKey(kindQuestion, u, t, 0), n})
			}
			out := draw(cfg.OutputTokens)
			reqs = append(reqs, pending{ts: at, session: u, segs: slices.Clone(ctx), output: out})
			ctx = append(ctx, segment{segKey(kindAnswer, u, t, 0), out})
		}
	}
	var name func(*pending) string
	if cfg.FollowUps > 0 {
		name = func(p *pending) string { return fmt.Sprintf("u%d", p.session) }
	}
	return assign(reqs, cfg.BlockSize, name), nil
}

// zipfPicker draws distinct ranks with weights 1/(r+1)^s, without
// replacement, from a Fenwick tree of the weights.
type zipfPicker struct {
	w    []float64 // weight of each rank
	tree []float64 // Fenwick tree over w, 1-based
	sum  float64   // total weight
}

func newZipfPicker(n int, s float64) *zipfPicker {
	z := &zipfPicker{w: make([]float64, n), tree: make([]float64, n+1)}
	for r := range n {
		z.w[r] = math.Pow(float64(r+1), -s)
		z.add(r, z.w[r])
		z.sum += z.w[r]
	}
	return z
}

func (z *zipfPicker) add(r int, v float64) {
	for i := r + 1; i < len(z.tree); i += i & -i {
		z.tree[i] += v
	}
}

// find returns the rank whose cumulative weight interval holds u.
func (z *zipfPicker) find(u float64) int {
	pos := 0
	for step := 1 << (bits.Len(uint(len(z.w))) - 1); step > 0; step >>= 1 {
		if next := pos + step; next < len(z.tree) && z.tree[next] <= u {
			pos = next
			u -= z.tree[next]
		}
	}
	return pos
}

// distinct appends k distinct ranks to dst in the order drawn: each draw
// picks among the ranks not yet drawn in proportion to their weights.
func (z *zipfPicker) distinct(rng *rand.Rand, dst []int, k int) []int {
	left := z.sum
	start := len(dst)
	for range k {
		r := z.find(rng.Float64() * left)
		// Rounding may land on a rank already drawn (weight 0 now) or past
		// the end; take the nearest rank still in the tree.
		for r >= len(z.w) || slices.Contains(dst[start:], r) {
			r = (r + 1) % len(z.w)
		}
		dst = append(dst, r)
		z.add(r, -z.w[r])
		left -= z.w[r]
	}
	for _, r := range dst[start:] {
		z.add(r, z.w[r])
	}
	return dst
}
