package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/workload"
)

func newGenSessions() *cobra.Command {
	var preset, out string
	cfg := workload.SessionPresets["agent"]
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "Agent or chat sessions: shared system prompts, documents, tool outputs, answers resent as context",
		Long: `Generates multi-turn sessions as a Mooncake-format trace with a "session_id" field.

Turn 1 of a session sends its tenant's system prompt, a document and a first user message;
every later turn resends the whole conversation (including the earlier assistant answers)
plus an optional tool output and a new user message, after an exponential think time.
Lengths are means in tokens, drawn uniformly within ±jitter. Hash ids name 512-token
blocks; equal prefixes get equal ids.

Presets (--preset) set every parameter; flags given explicitly override them:
  agent         ` + describe(workload.SessionPresets["agent"]) + `
  chat          ` + describe(workload.SessionPresets["chat"]) + `
  system-heavy  many short sessions behind long shared system prompts, so nearly every
                token of a request is its tenant's prefix:
                ` + describe(workload.SessionPresets["system-heavy"]) + `
  long-agent    few huge agent sessions with tool outputs of about 3,000-8,000 tokens, each
                ending before a turn exceeds ` + fmt.Sprint(workload.SessionPresets["long-agent"].MaxInputTokens) + ` tokens:
                ` + describe(workload.SessionPresets["long-agent"]) + `
  seed-example  the seed document's two-turn example: 1,200-token system prompt + 3,000-token
                document (turn 1: 4,200 tokens), 700-token answer, 200-token follow-up
                (turn 2: 5,100 tokens, 4,900 reusable)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ok := workload.SessionPresets[preset]
			if !ok {
				return cli.Usagef("unknown preset %q (known: %s)", preset, strings.Join(slices.Sorted(maps.Keys(workload.SessionPresets)), ", "))
			}
			overrideSessions(cmd, &c, &cfg)
			recs, err := workload.GenerateSessions(c)
			if err != nil {
				return err
			}
			return writeTrace(out, recs)
		},
	}
	f := cmd.Flags()
	f.StringVar(&preset, "preset", "agent", "parameter preset: agent, chat, system-heavy, long-agent or seed-example")
	f.StringVarP(&out, "out", "o", "-", "output file (- for standard output)")
	f.IntVar(&cfg.Sessions, "sessions", cfg.Sessions, "sessions to generate")
	f.IntVar(&cfg.Tenants, "tenants", cfg.Tenants, "tenants; a tenant's sessions share its system prompt")
	f.IntVar(&cfg.SystemTokens, "system-tokens", cfg.SystemTokens, "system prompt length per tenant")
	f.IntVar(&cfg.DocumentTokens, "document-tokens", cfg.DocumentTokens, "document length per session, sent in turn 1 (0: none)")
	f.IntVar(&cfg.FirstUserTokens, "first-user-tokens", cfg.FirstUserTokens, "user message of turn 1")
	f.IntVar(&cfg.UserTokens, "user-tokens", cfg.UserTokens, "user message of each later turn")
	f.Float64Var(&cfg.ToolProb, "tool-prob", cfg.ToolProb, "probability that a later turn carries a tool output")
	f.IntVar(&cfg.ToolTokens, "tool-tokens", cfg.ToolTokens, "tool output length")
	f.IntVar(&cfg.OutputTokens, "output-tokens", cfg.OutputTokens, "assistant answer per turn (resent in the next turn)")
	f.IntVar(&cfg.MinTurns, "min-turns", cfg.MinTurns, "fewest turns per session")
	f.IntVar(&cfg.MaxTurns, "max-turns", cfg.MaxTurns, "most turns per session")
	f.Float64Var(&cfg.ThinkTimeSec, "think-time", cfg.ThinkTimeSec, "mean seconds between a session's turns (exponential)")
	f.Float64Var(&cfg.SessionRate, "session-rate", cfg.SessionRate, "sessions started per second (Poisson)")
	f.Float64Var(&cfg.Jitter, "jitter", cfg.Jitter, "relative spread of every length, 0 <= jitter < 1")
	f.IntVar(&cfg.MaxInputTokens, "max-input-tokens", cfg.MaxInputTokens, "end a session before a turn longer than this (0: no limit)")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per hash id")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	return cmd
}

// overrideSessions copies into c the flags set explicitly on cmd.
func overrideSessions(cmd *cobra.Command, c, flags *workload.SessionsConfig) {
	set := func(name string, dst, src any) {
		if !cmd.Flags().Changed(name) {
			return
		}
		switch d := dst.(type) {
		case *int:
			*d = *src.(*int)
		case *float64:
			*d = *src.(*float64)
		case *uint64:
			*d = *src.(*uint64)
		}
	}
	set("sessions", &c.Sessions, &flags.Sessions)
	set("tenants", &c.Tenants, &flags.Tenants)
	set("system-tokens", &c.SystemTokens, &flags.SystemTokens)
	set("document-tokens", &c.DocumentTokens, &flags.DocumentTokens)
	set("first-user-tokens", &c.FirstUserTokens, &flags.FirstUserTokens)
	set("user-tokens", &c.UserTokens, &flags.UserTokens)
	set("tool-prob", &c.ToolProb, &flags.ToolProb)
	set("tool-tokens", &c.ToolTokens, &flags.ToolTokens)
	set("output-tokens", &c.OutputTokens, &flags.OutputTokens)
	set("min-turns", &c.MinTurns, &flags.MinTurns)
	set("max-turns", &c.MaxTurns, &flags.MaxTurns)
	set("think-time", &c.ThinkTimeSec, &flags.ThinkTimeSec)
	set("session-rate", &c.SessionRate, &flags.SessionRate)
	set("jitter", &c.Jitter, &flags.Jitter)
	set("max-input-tokens", &c.MaxInputTokens, &flags.MaxInputTokens)
	set("block-size", &c.BlockSize, &flags.BlockSize)
	set("seed", &c.Seed, &flags.Seed)
}

func describe(c workload.SessionsConfig) string {
	return fmt.Sprintf("%d sessions, %d tenants, system %d, document %d, user %d/%d, tool %d (p=%.1f), answer %d, %d-%d turns, think %gs, %g sessions/s",
		c.Sessions, c.Tenants, c.SystemTokens, c.DocumentTokens, c.FirstUserTokens, c.UserTokens, c.ToolTokens, c.ToolProb,
		c.OutputTokens, c.MinTurns, c.MaxTurns, c.ThinkTimeSec, c.SessionRate)
}

func newGenSharedPrefix() *cobra.Command {
	var out string
	cfg := workload.SharedPrefixConfig{Groups: 16, PromptsPerGroup: 32, SystemTokens: 4096, QuestionTokens: 256,
		OutputTokens: 128, Rate: 4, BlockSize: workload.DefaultBlockSize, Seed: 1}
	cmd := &cobra.Command{
		Use:   "shared-prefix",
		Short: "Groups of prompts sharing a long system prompt (inference-perf's shared_prefix shape)",
		Long: `Generates groups × prompts-per-group distinct prompts, each its group's system prompt
followed by its own question, sent in random order at a Poisson rate (every prompt once,
then again in a new order while --requests asks for more). Records have no session id.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			recs, err := workload.GenerateSharedPrefix(cfg)
			if err != nil {
				return err
			}
			return writeTrace(out, recs)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "-", "output file (- for standard output)")
	f.IntVar(&cfg.Groups, "groups", cfg.Groups, "groups, one system prompt each")
	f.IntVar(&cfg.PromptsPerGroup, "prompts-per-group", cfg.PromptsPerGroup, "distinct questions per group")
	f.IntVar(&cfg.SystemTokens, "system-prompt-len", cfg.SystemTokens, "system prompt length in tokens")
	f.IntVar(&cfg.QuestionTokens, "question-len", cfg.QuestionTokens, "question length in tokens")
	f.IntVar(&cfg.OutputTokens, "output-len", cfg.OutputTokens, "tokens generated per request")
	f.IntVar(&cfg.Requests, "requests", 0, "requests to send (0: groups × prompts-per-group)")
	f.Float64Var(&cfg.Rate, "rate", cfg.Rate, "requests per second (Poisson)")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per hash id")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	return cmd
}

func writeTrace(path string, recs []workload.Record) error {
	var w io.Writer = os.Stdout
	if path != "-" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := workload.Write(w, recs); err != nil {
		return err
	}
	if f, ok := w.(*os.File); ok && path != "-" {
		return f.Close()
	}
	return nil
}
