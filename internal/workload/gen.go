package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// SessionsConfig describes agent or chat sessions. Every length is a mean in
// tokens; with Jitter j each draw is uniform in [(1−j)·mean, (1+j)·mean].
//
// Turn 1 of a session sends the tenant's system prompt, the session's
// document and a first user message; every later turn resends the whole
// conversation so far (system prompt, document, earlier user messages, tool
// outputs and assistant answers, each answer OutputTokens long) and adds a
// tool output (with probability ToolProb) and a user message.
type SessionsConfig struct {
	Sessions        int     // sessions to generate
	Tenants         int     // tenants; the sessions of one tenant share its system prompt
	SystemTokens    int     // system prompt, per tenant
	DocumentTokens  int     // document sent in turn 1, per session (0: none)
	FirstUserTokens int     // user message of turn 1
	UserTokens      int     // user message of each later turn
	ToolProb        float64 // probability that a later turn carries a tool output
	ToolTokens      int     // tool output length
	OutputTokens    int     // assistant answer per turn, resent as context in the next turn
	MinTurns        int     // turns per session, uniform in [MinTurns, MaxTurns]
	MaxTurns        int
	ThinkTimeSec    float64 // mean time between a session's turns (exponential), answer included
	SessionRate     float64 // sessions started per second (Poisson)
	Jitter          float64 // relative spread of every length, in [0, 1)
	MaxInputTokens  int     // a session stops before a turn longer than this (0: no limit)
	BlockSize       int     // tokens per hash id (default 512)
	Seed            uint64
}

// SessionPresets are named SessionsConfigs. "system-heavy" is many short
// sessions (1-3 turns, short user messages) behind 6,000-token system
// prompts of 3 tenants, so nearly all of a request is its tenant's prefix;
// "long-agent" is 30 huge agent sessions of 20-40 turns with tool outputs of
// about 3,000-8,000 tokens, each ending before a turn exceeds 120,000
// tokens. "seed-example" is the seed
// document's two-turn example: a 1,200-token system prompt and a 3,000-token
// document (turn 1: 4,200 tokens), a 700-token answer, then a 200-token
// follow-up (turn 2: 5,100 tokens, 4,900 of them reusable).
var SessionPresets = map[string]SessionsConfig{
	"agent": {
		Sessions: 200, Tenants: 4, SystemTokens: 2000, DocumentTokens: 4000, FirstUserTokens: 200,
		UserTokens: 150, ToolProb: 0.6, ToolTokens: 1500, OutputTokens: 300, MinTurns: 3, MaxTurns: 12,
		ThinkTimeSec: 20, SessionRate: 0.5, Jitter: 0.5, MaxInputTokens: 100000, BlockSize: DefaultBlockSize, Seed: 1,
	},
	"chat": {
		Sessions: 300, Tenants: 8, SystemTokens: 800, DocumentTokens: 0, FirstUserTokens: 300,
		UserTokens: 200, ToolProb: 0, ToolTokens: 0, OutputTokens: 400, MinTurns: 2, MaxTurns: 8,
		ThinkTimeSec: 30, SessionRate: 1, Jitter: 0.5, MaxInputTokens: 32000, BlockSize: DefaultBlockSize, Seed: 1,
	},
	"system-heavy": {
		Sessions: 600, Tenants: 3, SystemTokens: 6000, DocumentTokens: 0, FirstUserTokens: 150,
		UserTokens: 100, ToolProb: 0, ToolTokens: 0, OutputTokens: 200, MinTurns: 1, MaxTurns: 3,
		ThinkTimeSec: 15, SessionRate: 4, Jitter: 0.5, MaxInputTokens: 32000, BlockSize: DefaultBlockSize, Seed: 1,
	},
	"long-agent": {
		Sessions: 30, Tenants: 2, SystemTokens: 3000, DocumentTokens: 6000, FirstUserTokens: 300,
		UserTokens: 150, ToolProb: 0.9, ToolTokens: 5500, OutputTokens: 400, MinTurns: 20, MaxTurns: 40,
		ThinkTimeSec: 60, SessionRate: 0.05, Jitter: 0.45, MaxInputTokens: 120000, BlockSize: DefaultBlockSize, Seed: 1,
	},
	"seed-example": {
		Sessions: 100, Tenants: 1, SystemTokens: 1200, DocumentTokens: 3000, FirstUserTokens: 0,
		UserTokens: 200, ToolProb: 0, ToolTokens: 0, OutputTokens: 700, MinTurns: 2, MaxTurns: 2,
		ThinkTimeSec: 10, SessionRate: 1, Jitter: 0, BlockSize: DefaultBlockSize, Seed: 1,
	},
}

// ErrBadConfig is wrapped by generator configuration errors.
var ErrBadConfig = errors.New("workload: invalid generator config")

func (c *SessionsConfig) validate() error {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	var errs []error
	bad := func(cond bool, format string, a ...any) {
		if cond {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, a...)...))
		}
	}
	bad(c.Sessions < 1, "sessions %d, want >= 1", c.Sessions)
	bad(c.Tenants < 1, "tenants %d, want >= 1", c.Tenants)
	bad(c.SystemTokens < 0 || c.DocumentTokens < 0 || c.FirstUserTokens < 0 || c.UserTokens < 0 || c.ToolTokens < 0,
		"token lengths must be >= 0")
	bad(c.SystemTokens+c.DocumentTokens+c.FirstUserTokens < 1, "turn 1 would be empty: system + document + first user tokens must be >= 1")
	bad(c.OutputTokens < 1, "output tokens %d, want >= 1", c.OutputTokens)
	bad(!(c.ToolProb >= 0 && c.ToolProb <= 1), "tool probability %v, want 0..1", c.ToolProb)
	bad(c.MinTurns < 1 || c.MaxTurns < c.MinTurns, "turns %d..%d, want 1 <= min <= max", c.MinTurns, c.MaxTurns)
	bad(!(c.ThinkTimeSec >= 0) || math.IsInf(c.ThinkTimeSec, 0), "think time %v s, want a finite value >= 0", c.ThinkTimeSec)
	bad(!(c.SessionRate > 0) || math.IsInf(c.SessionRate, 0), "session rate %v/s, want a finite value > 0", c.SessionRate)
	bad(!(c.Jitter >= 0 && c.Jitter < 1), "jitter %v, want 0 <= jitter < 1", c.Jitter)
	bad(c.MaxInputTokens < 0 || c.MaxInputTokens > MaxInputLength, "max input tokens %d, want 0..%d", c.MaxInputTokens, MaxInputLength)
	bad(c.BlockSize < 1, "block size %d, want >= 1", c.BlockSize)
	return errors.Join(errs...)
}

// segment is a stretch of prompt content: a key naming it and its length.
type segment struct {
	key uint64
	n   int
}

// pending is a request before hash ids are assigned.
type pending struct {
	ts      float64
	session int
	segs    []segment
	output  int
}

// Segment kinds, mixed into segment keys.
const (
	kindSystem = iota + 1
	kindDocument
	kindUser
	kindTool
	kindAnswer
	kindQuestion
	kindCorpus      // a corpus document (rag)
	kindProblem     // a problem statement (rollouts)
	kindInstruction // a task instruction (mix)
	kindInput       // a classification input (mix)
)

func segKey(kind, a, b, c int) uint64 {
	h := uint64(fnvOffset)
	for _, v := range [...]int{kind, a, b, c} {
		h = fnvMix(h, uint64(v))
	}
	return h
}

// GenerateSessions returns the records of cfg's sessions in arrival order,
// with session ids "s<n>".
func GenerateSessions(cfg SessionsConfig) ([]Record, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return assign(sessionRequests(cfg), cfg.BlockSize, sessionName), nil
}

// sessionName names a request's session "s<n>"; requests of no session
// (session < 0) get none.
func sessionName(p *pending) string {
	if p.session < 0 {
		return ""
	}
	return fmt.Sprintf("s%d", p.session)
}

// drawer returns a function drawing a length uniformly within ±jitter of a
// mean (at least 1 unless the mean is 0).
func drawer(rng *rand.Rand, jitter float64) func(mean int) int {
	return func(mean int) int {
		if mean == 0 || jitter == 0 {
			return mean
		}
		lo := float64(mean) * (1 - jitter)
		hi := float64(mean) * (1 + jitter)
		return max(1, int(math.Round(lo+rng.Float64()*(hi-lo))))
	}
}

// sessionRequests generates the requests of a validated cfg, unsorted.
func sessionRequests(cfg SessionsConfig) []pending {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5e5510a5))
	draw := drawer(rng, cfg.Jitter)
	var reqs []pending
	start := 0.0
	for s := range cfg.Sessions {
		start += rng.ExpFloat64() / cfg.SessionRate
		tenant := rng.IntN(cfg.Tenants)
		turns := cfg.MinTurns + rng.IntN(cfg.MaxTurns-cfg.MinTurns+1)
		var ctx []segment
		if cfg.SystemTokens > 0 {
			ctx = append(ctx, segment{segKey(kindSystem, tenant, 0, 0), cfg.SystemTokens})
		}
		if n := draw(cfg.DocumentTokens); n > 0 {
			ctx = append(ctx, segment{segKey(kindDocument, s, 0, 0), n})
		}
		if n := draw(cfg.FirstUserTokens); n > 0 {
			ctx = append(ctx, segment{segKey(kindUser, s, 0, 0), n})
		}
		ts := start
		for t := range turns {
			if t > 0 {
				if cfg.ToolProb > 0 && rng.Float64() < cfg.ToolProb {
					if n := draw(cfg.ToolTokens); n > 0 {
						ctx = append(ctx, segment{segKey(kindTool, s, t, 0), n})
					}
				}
				if n := draw(cfg.UserTokens); n > 0 {
					ctx = append(ctx, segment{segKey(kindUser, s, t, 0), n})
				}
				ts += rng.ExpFloat64() * cfg.ThinkTimeSec
			}
			if cfg.MaxInputTokens > 0 && total(ctx) > cfg.MaxInputTokens {
				break
			}
			out := draw(cfg.OutputTokens)
			reqs = append(reqs, pending{ts: ts, session: s, segs: slices.Clone(ctx), output: out})
			ctx = append(ctx, segment{segKey(kindAnswer, s, t, 0), out})
		}
	}
	return reqs
}

// SharedPrefixConfig is inference-perf's shared_prefix shape: Groups groups
// of PromptsPerGroup prompts, each a group's system prompt of SystemTokens
// followed by its own question of QuestionTokens.
type SharedPrefixConfig struct {
	Groups          int     // groups, one system prompt each
	PromptsPerGroup int     // distinct questions per group
	SystemTokens    int     // shared system prompt per group
	QuestionTokens  int     // question per prompt
	OutputTokens    int     // tokens generated per request
	Requests        int     // requests to send (default Groups·PromptsPerGroup; more repeat prompts)
	Rate            float64 // requests per second (Poisson)
	BlockSize       int     // tokens per hash id (default 512)
	Seed            uint64
}

func (c *SharedPrefixConfig) validate() error {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.Requests == 0 {
		c.Requests = c.Groups * c.PromptsPerGroup
	}
	var errs []error
	bad := func(cond bool, format string, a ...any) {
		if cond {
			errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, a...)...))
		}
	}
	bad(c.Groups < 1, "groups %d, want >= 1", c.Groups)
	bad(c.PromptsPerGroup < 1, "prompts per group %d, want >= 1", c.PromptsPerGroup)
	bad(c.SystemTokens < 0 || c.QuestionTokens < 0 || c.SystemTokens+c.QuestionTokens < 1,
		"system %d + question %d tokens, want lengths >= 0 and a total >= 1", c.SystemTokens, c.QuestionTokens)
	bad(c.SystemTokens+c.QuestionTokens > MaxInputLength, "prompt longer than %d tokens", MaxInputLength)
	bad(c.OutputTokens < 1, "output tokens %d, want >= 1", c.OutputTokens)
	bad(c.Requests < 1, "requests %d, want >= 1", c.Requests)
	bad(!(c.Rate > 0) || math.IsInf(c.Rate, 0), "rate %v/s, want a finite value > 0", c.Rate)
	bad(c.BlockSize < 1, "block size %d, want >= 1", c.BlockSize)
	return errors.Join(errs...)
}

// GenerateSharedPrefix returns cfg's requests in arrival order: every
// prompt once in a random order, then again in a new order, until Requests
// are sent. Records carry no session id.
func GenerateSharedPrefix(cfg SharedPrefixConfig) ([]Record, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5a4ed))
	n := cfg.Groups * cfg.PromptsPerGroup
	order := make([]int, n)
	reqs := make([]pending, 0, cfg.Requests)
	ts := 0.0
	for len(reqs) < cfg.Requests {
		for i := range order {
			order[i] = i
		}
		rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, p := range order {
			if len(reqs) == cfg.Requests {
				break
			}
			g, q := p/cfg.PromptsPerGroup, p%cfg.PromptsPerGroup
			var segs []segment
			if cfg.SystemTokens > 0 {
				segs = append(segs, segment{segKey(kindSystem, g, 0, 0), cfg.SystemTokens})
			}
			if cfg.QuestionTokens > 0 {
				segs = append(segs, segment{segKey(kindQuestion, g, q, 0), cfg.QuestionTokens})
			}
			reqs = append(reqs, pending{ts: ts, segs: segs, output: cfg.OutputTokens})
			ts += rng.ExpFloat64() / cfg.Rate
		}
	}
	return assign(reqs, cfg.BlockSize, nil), nil
}

// badf collects configuration errors, each wrapping ErrBadConfig.
type badf []error

func (b *badf) check(cond bool, format string, a ...any) {
	if cond {
		*b = append(*b, fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, a...)...))
	}
}

func (b badf) err() error { return errors.Join(b...) }

// finitePositive reports whether v is a finite number > 0.
func finitePositive(v float64) bool { return v > 0 && !math.IsInf(v, 0) }

// finiteNonNegative reports whether v is a finite number >= 0.
func finiteNonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }

func total(segs []segment) int {
	n := 0
	for _, s := range segs {
		n += s.n
	}
	return n
}

// assign sorts the requests by time and names their blocks: a block's
// identity is its parent's id plus the pieces of segments it covers, so equal
// prefixes get equal ids; ids are numbered from 0 in order of first use.
func assign(reqs []pending, blockSize int, session func(*pending) string) []Record {
	slices.SortStableFunc(reqs, func(a, b pending) int {
		switch {
		case a.ts < b.ts:
			return -1
		case a.ts > b.ts:
			return 1
		}
		return 0
	})
	ids := make(map[uint64]int64)
	out := make([]Record, len(reqs))
	for i := range reqs {
		p := &reqs[i]
		n := total(p.segs)
		rec := Record{
			Timestamp:    math.Round(p.ts * 1000),
			InputLength:  n,
			OutputLength: p.output,
			HashIDs:      make([]int64, 0, (n+blockSize-1)/blockSize),
		}
		if session != nil {
			rec.SessionID = session(p)
		}
		parent := int64(-1)
		si, off := 0, 0 // current segment and offset in it
		for pos := 0; pos < n; pos += blockSize {
			h := fnvMix(fnvOffset, uint64(parent))
			left := min(blockSize, n-pos)
			h = fnvMix(h, uint64(left))
			for left > 0 {
				s := p.segs[si]
				take := min(s.n-off, left)
				h = fnvMix(fnvMix(fnvMix(h, s.key), uint64(off)), uint64(take))
				left -= take
				off += take
				if off == s.n {
					si, off = si+1, 0
				}
			}
			id, ok := ids[h]
			if !ok {
				id = int64(len(ids))
				ids[h] = id
			}
			rec.HashIDs = append(rec.HashIDs, id)
			parent = id
		}
		out[i] = rec
	}
	return out
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvMix absorbs v's 8 bytes into an FNV-1a state.
func fnvMix(h, v uint64) uint64 {
	for range 8 {
		h = (h ^ (v & 0xff)) * fnvPrime
		v >>= 8
	}
	return h
}
