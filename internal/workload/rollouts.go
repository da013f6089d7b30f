package workload

import (
	"fmt"
	"math/rand/v2"
)

// RolloutsConfig describes RL-style rollouts: groups of siblings sampling
// the same prompt. Every length is a mean in tokens, drawn within ±Jitter as
// in SessionsConfig.
//
// Groups arrive at GroupRate per second (Poisson). A group is a burst of
// Siblings requests within SpreadSec of its arrival, all with the same
// prompt: the system prompt (shared by every group) and the group's problem
// statement; each sibling generates its own, long answer. With SecondRound
// each sibling then continues its own trajectory after an exponential gap:
// the prompt, its own answer and a tool result of its own.
type RolloutsConfig struct {
	Groups        int     // groups (problems)
	Siblings      int     // requests per group, one per trajectory
	SystemTokens  int     // system prompt shared by every group
	ProblemTokens int     // problem statement per group
	OutputTokens  int     // answer per request
	ToolTokens    int     // tool result a sibling's second round adds
	SecondRound   bool    // whether each sibling sends a second request
	SpreadSec     float64 // siblings arrive uniformly within this after their group
	RoundGapSec   float64 // mean time from a sibling's first request to its second (exponential)
	GroupRate     float64 // groups per second (Poisson)
	Jitter        float64 // relative spread of every length, in [0, 1)
	BlockSize     int     // tokens per hash id (default 512)
	Seed          uint64
}

// DefaultRolloutsConfig is 64 groups of 8 siblings with 3,000-token answers
// and a second round: 1,024 requests.
func DefaultRolloutsConfig() RolloutsConfig {
	return RolloutsConfig{
		Groups: 64, Siblings: 8, SystemTokens: 1000, ProblemTokens: 800, OutputTokens: 3000,
		ToolTokens: 1000, SecondRound: true, SpreadSec: 0.05, RoundGapSec: 60, GroupRate: 0.1,
		Jitter: 0.5, BlockSize: DefaultBlockSize, Seed: 1,
	}
}

func (c *RolloutsConfig) validate() error {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	var b badf
	b.check(c.Groups < 1, "groups %d, want >= 1", c.Groups)
	b.check(c.Siblings < 1, "siblings %d, want >= 1", c.Siblings)
	b.check(c.SystemTokens < 0 || c.ProblemTokens < 0 || c.ToolTokens < 0, "token lengths must be >= 0")
	b.check(c.SystemTokens+c.ProblemTokens < 1, "prompts would be empty: system + problem tokens must be >= 1")
	b.check(c.OutputTokens < 1, "output tokens %d, want >= 1", c.OutputTokens)
	b.check(float64(c.OutputTokens)*(1+c.Jitter) > MaxOutputLength, "output tokens %d could exceed %d with jitter %v",
		c.OutputTokens, MaxOutputLength, c.Jitter)
	b.check(!finiteNonNegative(c.SpreadSec), "spread %v s, want a finite value >= 0", c.SpreadSec)
	b.check(!finiteNonNegative(c.RoundGapSec), "round gap %v s, want a finite value >= 0", c.RoundGapSec)
	b.check(!finitePositive(c.GroupRate), "group rate %v/s, want a finite value > 0", c.GroupRate)
	b.check(!(c.Jitter >= 0 && c.Jitter < 1), "jitter %v, want 0 <= jitter < 1", c.Jitter)
	b.check(c.BlockSize < 1, "block size %d, want >= 1", c.BlockSize)
	if longest := float64(c.SystemTokens+c.ProblemTokens+c.OutputTokens+c.ToolTokens) * (1 + c.Jitter); longest > MaxInputLength {
		b.check(true, "requests could reach %.0f tokens, more than %d", longest, MaxInputLength)
	}
	return b.err()
}

// GenerateRollouts returns cfg's requests in arrival order. With
// SecondRound, records carry session ids "g<group>.<sibling>" naming a
// trajectory; without it, none.
func GenerateRollouts(cfg RolloutsConfig) ([]Record, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x2011))
	draw := drawer(rng, cfg.Jitter)
	var reqs []pending
	ts := 0.0
	for g := range cfg.Groups {
		ts += rng.ExpFloat64() / cfg.GroupRate
		var prompt []segment
		if cfg.SystemTokens > 0 {
			prompt = append(prompt, segment{segKey(kindSystem, 0, 0, 0), cfg.SystemTokens})
		}
		if n := draw(cfg.ProblemTokens); n > 0 {
			prompt = append(prompt, segment{segKey(kindProblem, g, 0, 0), n})
		}
		for i := range cfg.Siblings {
			// session numbers trajectories: group·Siblings + sibling
			id := g*cfg.Siblings + i
			at := ts + rng.Float64()*cfg.SpreadSec
			out := draw(cfg.OutputTokens)
			reqs = append(reqs, pending{ts: at, session: id, segs: prompt, output: out})
			if !cfg.SecondRound {
				continue
			}
			segs := append(prompt[:len(prompt):len(prompt)], segment{segKey(kindAnswer, g, i, 0), out})
			if n := draw(cfg.ToolTokens); n > 0 {
				segs = append(segs, segment{segKey(kindTool, g, i, 0), n})
			}
			reqs = append(reqs, pending{ts: at + rng.ExpFloat64()*cfg.RoundGapSec, session: id, segs: segs, output: draw(cfg.OutputTokens)})
		}
	}
	var name func(*pending) string
	if cfg.SecondRound {
		name = func(p *pending) string { return fmt.Sprintf("g%d.%d", p.session/cfg.Siblings, p.session%cfg.Siblings) }
	}
	return assign(reqs, cfg.BlockSize, name), nil
}
