package main

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/routerbench"
	"github.com/kvdir/kvdir/internal/benchjson"
)

func newRouter(log *slog.Logger) *cobra.Command {
	o := routerbench.Defaults
	cmd := measureCommand(&cobra.Command{
		Use:   "router",
		Short: "Measure the router's decision time, its overhead against HAProxy and its throughput (make bench-router)",
		Long: `Starts a fleet (3 directory nodes, 4 enginesims with agents, two kvdir routers, the second
with --follow-log) and measures the routers' placement decision for a turn of a long session,
warm and cold, as each router times it (POST /v1/kvdir/explain): decision_* on the router that
asks a directory node for every match, decision_local_* on the one that matches from its local
replica of the directory. Then the first router's proxy overhead on small requests next to
HAProxy's (Debian's package) in front of the same upstream, and requests per second through it.
Writes the figures as JSON.`,
		Example: `  kvbench router --out bench/results/router.json
  kvbench router --skip-overhead --sessions 2 --out -`,
	}, routerbench.Tool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log = log
		return routerbench.Run(ctx, o)
	})
	fl := cmd.Flags()
	fl.IntVar(&o.Sessions, "sessions", o.Sessions, "long sessions built for the decision phase")
	fl.IntVar(&o.SessionTokens, "session-tokens", o.SessionTokens, "prompt tokens of each session when the decision is timed")
	fl.IntVar(&o.TurnTokens, "turn-tokens", o.TurnTokens, "tokens added per turn while a session is built")
	fl.IntVar(&o.Warm, "warm", o.Warm, "warm decisions timed per session")
	fl.IntVar(&o.Cold, "cold", o.Cold, "cold decisions timed per session")
	fl.IntVar(&o.LatencyRequests, "latency-requests", o.LatencyRequests, "sequential small requests per path (direct, router, HAProxy) for the overhead")
	fl.DurationVar(&o.RPSDuration, "rps-duration", o.RPSDuration, "how long each throughput run lasts")
	fl.IntVar(&o.RPSClients, "rps-clients", o.RPSClients, "concurrent clients of the throughput runs")
	fl.StringVar(&o.HAProxy, "haproxy", o.HAProxy, "HAProxy binary (Debian: apt-get install haproxy)")
	fl.BoolVar(&o.SkipDecision, "skip-decision", false, "skip the decision phase")
	fl.BoolVar(&o.SkipOverhead, "skip-overhead", false, "skip the overhead and throughput phases")
	fl.StringVar(&o.Dir, "dir", "", "directory for binaries and data (default: a temporary one, removed after)")
	return cmd
}

func newRouterMemory(log *slog.Logger) *cobra.Command {
	o := routerbench.MemoryDefaults
	cmd := measureCommand(&cobra.Command{
		Use:   "router-memory",
		Short: "Measure a router's memory while slow request bodies are held and real requests flow",
		Long: `Starts enginesims (time scale 0) and a router process with its default bounds (8 MiB
bodies, 30 s body timeout), opens --slow-conns connections that each announce an 8 MiB body,
send --slow-prefix bytes of it and then one byte a second, and while they are held runs
--clients closed-loop clients sending chat requests for --duration. Samples the router's VmRSS
every 100 ms and reads its VmHWM (/proc/PID/status); the target is a peak under 300 MB.
Writes the figures as JSON. Linux only.`,
		Example: `  kvbench router-memory
  kvbench router-memory --slow-conns 50 --clients 100 --duration 5s --out -`,
	}, routerbench.MemoryTool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log = log
		return routerbench.RunMemory(ctx, o)
	})
	fl := cmd.Flags()
	fl.IntVar(&o.SlowConns, "slow-conns", o.SlowConns, "connections holding a slow body")
	fl.IntVar(&o.SlowPrefix, "slow-prefix", o.SlowPrefix, "bytes each slow connection sends before trickling")
	fl.IntVar(&o.Clients, "clients", o.Clients, "concurrent closed-loop clients sending chat requests")
	fl.IntVar(&o.PromptBytes, "prompt-bytes", o.PromptBytes, "bytes of text in each chat request")
	fl.DurationVar(&o.Duration, "duration", o.Duration, "how long the clients run (under the router's 30 s body timeout, so that the slow bodies are held throughout)")
	fl.IntVar(&o.Engines, "engines", o.Engines, "enginesims behind the router")
	fl.StringVar(&o.Dir, "dir", "", "directory for binaries and data (default: a temporary one, removed after)")
	return cmd
}
