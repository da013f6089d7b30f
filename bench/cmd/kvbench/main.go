// Command kvbench compares placement policies on request traces.
//
//	kvbench gen sessions      agent/chat sessions as a Mooncake-format trace
//	kvbench gen shared-prefix groups sharing a system prompt (inference-perf's shared_prefix)
//	kvbench sim               discrete-event simulation of a trace under each policy
//	kvbench replay            the same trace through real processes (directory, enginesims, agents, routers or HAProxy)
//	kvbench demo              the main job: a bundled agent-session trace under round-robin, session-hash and kvdir
//	kvbench dev               a local fleet (directory, enginesims with agents, router) until Ctrl-C
//	kvbench report            re-render the Markdown table and charts of a result JSON
//
// sim and replay fill the same report schema (bench/report), so report and
// the charts work on either.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	root := newRoot(log)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}

func newRoot(log *slog.Logger) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvbench",
		Short: "Compare kvdir's placement with the alternatives on request traces",
		Long: `kvbench generates request traces in the Mooncake format, runs them through the real
placement policies in front of simulated engines (kvbench sim), and writes the comparison
as JSON, a Markdown table and PNG charts (bench/results/ by convention).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	gen := &cobra.Command{
		Use:   "gen",
		Short: "Generate a trace (Mooncake format, JSON Lines)",
	}
	gen.AddCommand(newGenSessions(), newGenSharedPrefix())
	root.AddCommand(gen, newSim(log), newReplay(log), newDemo(log), newDev(), newReport())
	return root
}
