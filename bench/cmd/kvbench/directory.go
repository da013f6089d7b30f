package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/bench/dirbench"
	"github.com/kvdir/kvdir/internal/benchjson"
)

func newDirectory(log *slog.Logger) *cobra.Command {
	var (
		o         = dirbench.Defaults
		nodeFlags string
		raftTLS   bool
		quota     bool
		qo        = dirbench.QuotaDefaults
		pools     []int
		groups    int
	)
	cmd := measureCommand(&cobra.Command{
		Use:   "directory",
		Short: "Measure a 3-process directory cluster under 64 publishing workers (make bench-directory)",
		Long: `Starts three directory processes on loopback (BoltDB on disk), publishes the index
benchmark's shape through them as 64 workers, and measures commit throughput and latency,
match latency against a follower, snapshot time and size, and a follower's restart
catch-up. Writes the figures as JSON.

With --raft-tls it measures only the commit throughput, with Raft over mutual TLS and
on plain TCP (--insecure-raft), both with the API over TLS, on a fresh cluster per
transport and round in alternating order, and writes the comparison
(bench/results/directory-raft-tls.json unless --out says otherwise).

With --block-quota it measures the per-worker block quota instead: one worker fills
--quota blocks (the RSS growth per block is the bytes per entry), then stores --flood
times as many again past it; the nodes' RSS growth over quota x bytes/entry must stay
under 1.2 (bench/results/directory-quota.json unless --out says otherwise).

With --worker-pools it measures only the commit throughput of the same workload
published by pools of different sizes (the same batches, the same batches in
flight in all), each on a fresh cluster, the pools alternating their order by
round; the target is the largest pool at 0.8x the smallest or better
(bench/results/directory-workers.json unless --out says otherwise).

With --groups N it measures 1 to N independent 3-process groups (their own Raft
clusters and data directories, all on this machine) published to at once, each
the same workload: all the groups' events/s, its ratio to one group's, and the
events per CPU second of the nodes (bench/results/directory-groups.json unless
--out says otherwise).`,
		Example: `  kvbench directory --out bench/results/directory.json
  kvbench directory --scale 0.5 --latency-rate 500000 --out -
  kvbench directory --raft-tls --scale 0.2
  kvbench directory --block-quota --quota 1048576 --flood 2
  kvbench directory --worker-pools 64,1024 --scale 0.5 --batch-blocks 256 --rounds 3
  kvbench directory --groups 3 --scale 0.2 --rounds 3`,
	}, dirbench.Tool, log, func(ctx context.Context) (*benchjson.Results, error) {
		o.Log, o.NodeFlags = log, strings.Fields(nodeFlags)
		if len(pools) > 0 {
			return dirbench.RunWorkers(ctx, o, pools)
		}
		if groups > 0 {
			return dirbench.RunGroups(ctx, o, groups)
		}
		if quota {
			qo.Log, qo.Dir, qo.Logs, qo.BatchBlocks, qo.Inflight = log, o.Dir, o.Logs, o.BatchBlocks, o.Inflight
			return dirbench.RunQuota(ctx, qo)
		}
		if raftTLS {
			return dirbench.RunRaftTLS(ctx, o)
		}
		return dirbench.Run(ctx, o)
	})
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		modes := 0
		for _, on := range []bool{raftTLS, quota, len(pools) > 0, groups > 0} {
			if on {
				modes++
			}
		}
		if modes > 1 {
			return fmt.Errorf("--raft-tls, --block-quota, --worker-pools and --groups are different runs: give one")
		}
		if modes == 1 && !c.Flags().Changed("out") {
			tool := dirbench.RaftTLSTool
			switch {
			case quota:
				tool = dirbench.QuotaTool
			case len(pools) > 0:
				tool = dirbench.WorkersTool
			case groups > 0:
				tool = dirbench.GroupsTool
			}
			if err := c.Flags().Set("out", "bench/results/"+tool+".json"); err != nil {
				return err
			}
		}
		return run(c, args)
	}
	fl := cmd.Flags()
	fl.Float64Var(&o.Scale, "scale", o.Scale, "fraction of the full shape's 10 M entries to publish")
	fl.IntVar(&o.BatchBlocks, "batch-blocks", o.BatchBlocks, "blocks per published batch (at most)")
	fl.IntVar(&o.Inflight, "inflight", o.Inflight, "batches in flight per worker stream")
	fl.BoolVar(&o.ConnPerWorker, "conn-per-worker", false, "with --worker-pools: give each worker its own connection to the leader, as each agent has one (default: one connection carries every worker's stream)")
	fl.IntVar(&o.Matches, "matches", o.Matches, "match queries to time against a follower")
	fl.IntVar(&o.ChainBlocks, "chain", o.ChainBlocks, "blocks per matched chain")
	fl.IntVar(&o.LatencyRate, "latency-rate", o.LatencyRate, "block events per second offered while commit latency is measured")
	fl.DurationVar(&o.LatencyFor, "latency-for", o.LatencyFor, "how long commit latency is measured")
	fl.StringVar(&nodeFlags, "node-flags", "", "extra flags for every directory process, space-separated")
	fl.StringVar(&o.ProfileDir, "node-profiles", "", "with --worker-pools: `DIR` for a CPU profile of every node while each pool publishes (the nodes run with --pprof; go tool pprof reads them)")
	fl.DurationVar(&o.ProfileFor, "node-profile-for", dirbench.Defaults.ProfileFor, "with --node-profiles: how long each profile runs from the publish's start (whole seconds; keep it under the publish's time)")
	fl.StringVar(&o.Dir, "dir", "", "directory for the binary and data (default: a temporary one, removed after)")
	fl.BoolVar(&o.Logs, "logs", false, "print the nodes' logs at the end")
	fl.BoolVar(&raftTLS, "raft-tls", false, "compare commit throughput with Raft over mutual TLS and on plain TCP instead")
	fl.IntVar(&o.Rounds, "rounds", dirbench.DefaultRounds, "with --raft-tls, --worker-pools or --groups: rounds per transport, pool or group count (the figures are the medians)")
	fl.IntSliceVar(&pools, "worker-pools", nil, "compare commit throughput of the same workload published by these pool sizes instead (increasing, e.g. 64,1024)")
	fl.IntVar(&groups, "groups", 0, "compare 1 to this many independent directory groups published to at once instead (at least 2)")
	fl.BoolVar(&quota, "block-quota", false, "measure the per-worker block quota instead: RSS growth of a worker flooded past it")
	fl.IntVar(&qo.Quota, "quota", qo.Quota, "with --block-quota: the directory's --worker-block-quota")
	fl.Float64Var(&qo.Flood, "flood", qo.Flood, "with --block-quota: blocks stored past the quota, as a multiple of it")
	return cmd
}
