// Command kvbench compares placement policies on request traces.
//
//	kvbench gen sessions      agent/chat sessions as a Mooncake-format trace
//	kvbench gen shared-prefix groups sharing a system prompt (inference-perf's shared_prefix)
//	kvbench gen rag           questions over a shared corpus of Zipf-popular documents
//	kvbench gen rollouts      RL rollouts: bursts of siblings with one prompt, a second round each
//	kvbench gen mix           short classification prompts interleaved with long chats
//	kvbench sim               discrete-event simulation of a trace under each policy
//	kvbench sweep             each policy's capacity: the highest request rate meeting a p90 TTFT objective
//	kvbench eval              the capacity sweep over the evaluation set (bench/testdata/evalset.json)
//	kvbench replay            the same trace through real processes (directory, enginesims, agents, routers or HAProxy)
//	kvbench demo              the main job: a bundled agent-session trace under round-robin, session-hash and kvdir
//	kvbench dev               a local fleet (directory, enginesims with agents, router) until Ctrl-C
//	kvbench report            re-render the Markdown table and charts of a result JSON
//	kvbench index             the block-prefix index and content hash figures
//	kvbench directory         a 3-process directory cluster's figures
//	kvbench follow            a router's local replica of the directory: cold start, memory, view lag
//	kvbench agent             the agent's event path and the engine model's figures
//	kvbench router            the router's decision time, overhead against HAProxy, throughput
//	kvbench docs              rewrite (or --check) the figure tables in the Markdown files from bench/results
//
// sim and replay fill the same report schema (bench/report), so report and
// the charts work on either.
//
// Every flag has an environment variable KVDIR_BENCH_<FLAG> (see
// internal/cli); a flag on the command line beats it. Exit status: 0 on
// success, 1 when a run fails, 2 on a usage error; SIGINT or SIGTERM stops
// a run, a second one exits 130 at once.
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/cli"
)

func main() {
	ctx, stop := cli.SignalContext(context.Background(), "kvbench", os.Stderr)
	code := runMain(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain runs kvbench with args and returns the exit status.
func runMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	p := &cli.Program{Name: "kvbench", Env: "BENCH", Getenv: getenv, Stdout: stdout, Stderr: stderr}
	root := newRoot(p.DeferredLogger())
	cli.MarkEnvAll(root)
	_, err := p.ExecuteC(ctx, root, args)
	return p.Exit(err)
}

func newRoot(log *slog.Logger) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvbench",
		Short: "Compare kvdir's placement with the alternatives on request traces",
		Long: `kvbench generates request traces in the Mooncake format, runs them through the real
placement policies in front of simulated engines (kvbench sim), and writes the comparison
as JSON, a Markdown table and PNG charts (bench/results/ by convention).

Every flag has an environment variable: KVDIR_BENCH_ and the flag's name in capitals
with '-' as '_' (--log-level is KVDIR_BENCH_LOG_LEVEL, sim's --replicas is
KVDIR_BENCH_REPLICAS); each command's --help lists its variables. A flag on the
command line beats the environment.

Exit status: 0 on success, 1 when a run fails, 2 on a usage error.`,
		Example: `  kvbench demo
  kvbench gen sessions --preset seed-example --sessions 200 -o /tmp/sessions.jsonl
  KVDIR_BENCH_REPLICAS=8 kvbench sim --trace /tmp/sessions.jsonl --policies all --out /tmp/sim.json`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	gen := &cobra.Command{
		Use:   "gen",
		Short: "Generate a trace (Mooncake format, JSON Lines)",
	}
	gen.AddCommand(newGenSessions(), newGenSharedPrefix(), newGenRAG(), newGenRollouts(), newGenMix())
	root.AddCommand(gen, newSim(log), newSweep(log), newEval(log), newReplay(log), newDemo(log), newDev(), newReport())
	root.AddCommand(newIndex(log), newDirectory(log), newFollow(log), newAgent(log), newRouter(log), newRouterMemory(log), newLeaderKill(log), newDocs(log))
	return root
}
