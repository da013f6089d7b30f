package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// MixConfig interleaves two streams: long multi-turn chats and short
// classification prompts.
//
// The chats are exactly GenerateSessions(Chat)'s requests (same times,
// lengths and session ids "s<n>"). The classification requests make up
// ClassifyFraction of the trace; each is one of Instructions shared task
// instructions of InstructionTokens followed by a unique input of about
// InputTokens (within ±Chat.Jitter), and generates MinOutput..MaxOutput
// tokens (uniform). They arrive as a Poisson stream over the chats' time
// span and carry no session id.
type MixConfig struct {
	Chat              SessionsConfig // the chat stream
	ClassifyFraction  float64        // share of classification requests in the trace, in [0, 1)
	Instructions      int            // distinct task instructions
	InstructionTokens int            // instruction length, shared by a task's requests
	InputTokens       int            // mean input per classification request
	MinOutput         int            // classification output, uniform in [MinOutput, MaxOutput]
	MaxOutput         int
	Seed              uint64 // seeds the classification stream; Chat.Seed seeds the chats
}

// DefaultMixConfig is 150 sessions of the "chat" preset (about 800
// requests) and 60% classification requests over 8 tasks with 1,024-token
// instructions: about 2,000 requests.
func DefaultMixConfig() MixConfig {
	chat := SessionPresets["chat"]
	chat.Sessions = 150
	return MixConfig{
		Chat: chat, ClassifyFraction: 0.6, Instructions: 8, InstructionTokens: 1024,
		InputTokens: 150, MinOutput: 1, MaxOutput: 16, Seed: 1,
	}
}

func (c *MixConfig) validate() error {
	var b badf
	if err := c.Chat.validate(); err != nil {
		b = append(b, fmt.Errorf("chat: %w", err))
	}
	b.check(!(c.ClassifyFraction >= 0 && c.ClassifyFraction < 1), "classify fraction %v, want 0 <= fraction < 1", c.ClassifyFraction)
	b.check(c.Instructions < 1, "instructions %d, want >= 1", c.Instructions)
	b.check(c.InstructionTokens < 0 || c.InputTokens < 0, "token lengths must be >= 0")
	b.check(c.InstructionTokens+c.InputTokens < 1, "classification prompts would be empty: instruction + input tokens must be >= 1")
	b.check(float64(c.InstructionTokens)+float64(c.InputTokens)*2 > MaxInputLength, "classification prompts longer than %d tokens", MaxInputLength)
	b.check(c.MinOutput < 1 || c.MaxOutput < c.MinOutput || c.MaxOutput > MaxOutputLength,
		"classification output %d..%d, want 1 <= min <= max <= %d", c.MinOutput, c.MaxOutput, MaxOutputLength)
	return b.err()
}

// GenerateMix returns cfg's two streams merged in arrival order.
func GenerateMix(cfg MixConfig) ([]Record, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	reqs := sessionRequests(cfg.Chat)
	span := 0.0
	for _, p := range reqs {
		span = max(span, p.ts)
	}
	if span == 0 {
		span = 1
	}
	n := int(math.Round(float64(len(reqs)) * cfg.ClassifyFraction / (1 - cfg.ClassifyFraction)))
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc1a55))
	draw := drawer(rng, cfg.Chat.Jitter)
	for i := range n {
		task := rng.IntN(cfg.Instructions)
		var segs []segment
		if cfg.InstructionTokens > 0 {
			segs = append(segs, segment{segKey(kindInstruction, task, 0, 0), cfg.InstructionTokens})
		}
		if in := draw(cfg.InputTokens); in > 0 {
			segs = append(segs, segment{segKey(kindInput, i, 0, 0), in})
		}
		// n arrivals placed uniformly over the span are a Poisson stream
		// conditioned on its count; assign sorts them.
		reqs = append(reqs, pending{ts: rng.Float64() * span, session: -1, segs: segs,
			output: cfg.MinOutput + rng.IntN(cfg.MaxOutput-cfg.MinOutput+1)})
	}
	return assign(reqs, cfg.Chat.BlockSize, sessionName), nil
}
