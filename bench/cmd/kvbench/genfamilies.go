package main

import (
	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/workload"
)

func newGenRAG() *cobra.Command {
	var out string
	cfg := workload.DefaultRAGConfig()
	cmd := &cobra.Command{
		Use:   "rag",
		Short: "Questions over a shared corpus: system prompt + Zipf-popular documents in retrieval order + question",
		Long: `Generates retrieval-augmented requests as a Mooncake-format trace.

Users arrive at --rate per second (Poisson). A user's first request is the system prompt
(the same for every request), --docs-per-request distinct documents of a corpus of
--documents, in the order retrieved, and a question. Documents are drawn by Zipf popularity:
rank r has weight 1/(r+1)^s (--zipf-s; 0 is uniform, larger concentrates on few documents).
So every request shares the system prompt, and beyond it a request shares only as many
documents as it agrees on from the first one: two requests retrieving the same documents
in another order share nothing past the system prompt.

Each user then asks 0..--follow-ups follow-up questions (uniform), after an exponential
think time, each resending the whole conversation (documents, questions, answers). With
--follow-ups > 0 records carry a session id per user ("u<n>"), without none.

Lengths are means in tokens drawn uniformly within ±jitter; a document's length is drawn
once, so it is the same content wherever it is retrieved. Hash ids name --block-size
blocks; equal prefixes get equal ids.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			recs, err := workload.GenerateRAG(cfg)
			if err != nil {
				return err
			}
			return writeTrace(out, recs)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "-", "output file (- for standard output)")
	f.IntVar(&cfg.Users, "users", cfg.Users, "user sessions")
	f.IntVar(&cfg.Documents, "documents", cfg.Documents, "documents in the corpus")
	f.Float64Var(&cfg.ZipfS, "zipf-s", cfg.ZipfS, "Zipf exponent of document popularity (0: uniform)")
	f.IntVar(&cfg.DocsPerRequest, "docs-per-request", cfg.DocsPerRequest, "distinct documents retrieved per request")
	f.IntVar(&cfg.SystemTokens, "system-tokens", cfg.SystemTokens, "system prompt shared by every request")
	f.IntVar(&cfg.DocumentTokens, "document-tokens", cfg.DocumentTokens, "mean document length")
	f.IntVar(&cfg.QuestionTokens, "question-tokens", cfg.QuestionTokens, "mean question length")
	f.IntVar(&cfg.OutputTokens, "output-tokens", cfg.OutputTokens, "mean answer length (resent in follow-ups)")
	f.IntVar(&cfg.FollowUps, "follow-ups", cfg.FollowUps, "most follow-up questions per user (0: single requests, no session ids)")
	f.Float64Var(&cfg.ThinkTimeSec, "think-time", cfg.ThinkTimeSec, "mean seconds between a user's requests (exponential)")
	f.Float64Var(&cfg.Rate, "rate", cfg.Rate, "users arriving per second (Poisson)")
	f.Float64Var(&cfg.Jitter, "jitter", cfg.Jitter, "relative spread of every length, 0 <= jitter < 1")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per hash id")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	return cmd
}

func newGenRollouts() *cobra.Command {
	var out string
	cfg := workload.DefaultRolloutsConfig()
	cmd := &cobra.Command{
		Use:   "rollouts",
		Short: "RL rollouts: bursts of sibling requests with the same prompt, long answers, a second round per trajectory",
		Long: `Generates RL-style rollouts as a Mooncake-format trace.

Groups arrive at --group-rate per second (Poisson). A group is a burst of --siblings
requests, all within --spread seconds of the group's arrival, with the same prompt: the
system prompt (shared by every group) and the group's own problem statement. Each
sibling generates its own long answer (--output-tokens).

With --second-round (the default) each sibling then continues its own trajectory after an
exponential gap (--round-gap): its prompt, its own answer and a tool result of its own,
so siblings share the group's prompt but nothing after it. Records then carry a session
id per trajectory ("g<group>.<sibling>"); with --second-round=false, none.

Lengths are means in tokens drawn uniformly within ±jitter. Hash ids name --block-size
blocks; equal prefixes get equal ids.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			recs, err := workload.GenerateRollouts(cfg)
			if err != nil {
				return err
			}
			return writeTrace(out, recs)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "-", "output file (- for standard output)")
	f.IntVar(&cfg.Groups, "groups", cfg.Groups, "groups (problems)")
	f.IntVar(&cfg.Siblings, "siblings", cfg.Siblings, "requests per group, one per trajectory")
	f.IntVar(&cfg.SystemTokens, "system-tokens", cfg.SystemTokens, "system prompt shared by every group")
	f.IntVar(&cfg.ProblemTokens, "problem-tokens", cfg.ProblemTokens, "mean problem statement per group")
	f.IntVar(&cfg.OutputTokens, "output-tokens", cfg.OutputTokens, "mean answer per request")
	f.IntVar(&cfg.ToolTokens, "tool-tokens", cfg.ToolTokens, "mean tool result added by the second round")
	f.BoolVar(&cfg.SecondRound, "second-round", cfg.SecondRound, "each sibling sends a second request continuing its trajectory")
	f.Float64Var(&cfg.SpreadSec, "spread", cfg.SpreadSec, "seconds within which a group's siblings arrive (uniform)")
	f.Float64Var(&cfg.RoundGapSec, "round-gap", cfg.RoundGapSec, "mean seconds from a sibling's first request to its second (exponential)")
	f.Float64Var(&cfg.GroupRate, "group-rate", cfg.GroupRate, "groups arriving per second (Poisson)")
	f.Float64Var(&cfg.Jitter, "jitter", cfg.Jitter, "relative spread of every length, 0 <= jitter < 1")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per hash id")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	return cmd
}

func newGenMix() *cobra.Command {
	var out string
	cfg := workload.DefaultMixConfig()
	cmd := &cobra.Command{
		Use:   "mix",
		Short: "Short classification prompts at a high rate interleaved with long multi-turn chats",
		Long: `Generates two interleaved streams as one Mooncake-format trace.

Chats: sessions of the "chat" preset of kvbench gen sessions, here
  ` + describe(workload.DefaultMixConfig().Chat) + `
with --chat-sessions and --chat-rate overriding its size and rate; their records carry
session ids "s<n>".

Classification: --classify-fraction of the trace's requests, each one of --instructions
shared task instructions (--instruction-tokens, the same for every request of a task)
followed by a unique input (--input-tokens, within ±50%), generating --min-output to
--max-output tokens (uniform). They arrive as a Poisson stream over the chats' time span,
so at the default fraction they come faster than the chat turns, and carry no session id.

Hash ids name 512-token blocks; equal prefixes get equal ids.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg.Chat.Seed = cfg.Seed
			recs, err := workload.GenerateMix(cfg)
			if err != nil {
				return err
			}
			return writeTrace(out, recs)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "-", "output file (- for standard output)")
	f.IntVar(&cfg.Chat.Sessions, "chat-sessions", cfg.Chat.Sessions, "chat sessions")
	f.Float64Var(&cfg.Chat.SessionRate, "chat-rate", cfg.Chat.SessionRate, "chat sessions started per second (Poisson)")
	f.Float64Var(&cfg.ClassifyFraction, "classify-fraction", cfg.ClassifyFraction, "share of classification requests in the trace, 0 <= fraction < 1")
	f.IntVar(&cfg.Instructions, "instructions", cfg.Instructions, "distinct classification task instructions")
	f.IntVar(&cfg.InstructionTokens, "instruction-tokens", cfg.InstructionTokens, "instruction length, shared by a task's requests")
	f.IntVar(&cfg.InputTokens, "input-tokens", cfg.InputTokens, "mean unique input per classification request")
	f.IntVar(&cfg.MinOutput, "min-output", cfg.MinOutput, "fewest tokens a classification request generates")
	f.IntVar(&cfg.MaxOutput, "max-output", cfg.MaxOutput, "most tokens a classification request generates")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (both streams)")
	return cmd
}
