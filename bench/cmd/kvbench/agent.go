package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/agentbench"
	"github.com/kvdir/kvdir/internal/benchjson"
)

func newAgent(log *slog.Logger) *cobra.Command {
	o := agentbench.Defaults
	cmd := measureCommand(&cobra.Command{
		Use:   "agent",
		Short: "Measure the agent's event path and the engine model (make bench-agent)",
		Long: `Measures kvdir's engine side: how fast the agent's hot path decodes, re-hashes and maps
engine KV events on one goroutine; the lag from an engine finishing a prefill to the
prompt's blocks being visible in a directory Match (3 directory processes, an enginesim
and its agent on loopback); and the engine model's own scheduling overhead at time scale
0. Writes the figures as JSON.`,
		Example: `  kvbench agent --out bench/results/agent.json
  kvbench agent --skip-e2e --out -`,
	}, agentbench.Tool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log = log
		return agentbench.Run(ctx, o)
	})
	fl := cmd.Flags()
	fl.DurationVar(&o.DecodeFor, "decode-for", o.DecodeFor, "how long the decode+hash+map loop runs")
	fl.IntVar(&o.Requests, "requests", o.Requests, "chat requests timed end to end")
	fl.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "chat requests in flight during the end-to-end phase")
	fl.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "enginesim --time-scale during the end-to-end phase")
	fl.IntVar(&o.EngineRequests, "engine-requests", o.EngineRequests, "requests run through the engine model at time scale 0")
	fl.BoolVar(&o.SkipE2E, "skip-e2e", false, "skip the end-to-end phase (no processes started)")
	fl.StringVar(&o.Dir, "dir", "", "directory for binaries and data (default: a temporary one, removed after)")
	cmd.AddCommand(newAgentList())
	return cmd
}

func newAgentList() *cobra.Command {
	o := agentbench.ListOptions{Directory: "127.0.0.1:7011", Model: "llama3-8b", User: "What does a prefix cache save?"}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print a running directory's workers and a Match for a chat prompt",
		Long: `Prints ListWorkers of a running directory node and a Match for a chat prompt, rendered
with ChatML over cl100k as the enginesim renders it.`,
		Example: `  kvbench agent list --directory 127.0.0.1:7011 --model llama3-8b --prompt 'What does a prefix cache save?'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return agentbench.List(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Directory, "directory", o.Directory, "a directory node's gRPC address")
	fl.StringVar(&o.Model, "model", o.Model, "the served model (namespace)")
	fl.StringVar(&o.System, "system", "", "optional system message")
	fl.StringVar(&o.User, "prompt", o.User, "the user message")
	return cmd
}
