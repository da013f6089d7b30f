package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func (a *app) workerView(w *kvdirv1.Worker) ctlview.Worker {
	s := w.GetSpec()
	l := w.GetLoad()
	v := ctlview.Worker{
		ID: s.GetId(), Address: s.GetAddress(), Model: s.GetModel(), BlockSize: s.GetBlockSize(),
		Engine: enumName(s.GetEngine().String(), "ENGINE_KIND_"), State: stateName(w.State),
		Epoch: w.Epoch, AppliedSeq: w.AppliedSeq,
		Blocks: w.Blocks, GPUBlocks: w.GpuBlocks, CPUBlocks: w.CpuBlocks, DiskBlocks: w.DiskBlocks, RemoteBlocks: w.RemoteBlocks,
		KVUsage: clitable.Float(l.GetKvUsage()), KVBlocks: l.GetKvBlocks(), Running: l.GetRunning(), Waiting: l.GetWaiting(),
		PrefixQueries: l.GetPrefixQueries(), PrefixHits: l.GetPrefixHits(), Labels: s.GetLabels(),
		ViewPartial: l.GetViewPartial(),
		Owner:       w.Owner, BlockQuota: w.BlockQuota, DroppedBlocks: w.DroppedBlocks,
	}
	if r := s.DataParallelRank; r != nil {
		rank := *r
		v.DataParallelRank = &rank
	}
	if w.LoadTimeUnixNano > 0 {
		age := clitable.Float(a.now().Sub(time.Unix(0, w.LoadTimeUnixNano)).Seconds())
		v.HeartbeatAge = &age
	}
	layoutView(&v, w)
	return v
}

// rankedAddress is v's address, with "#rank" for a worker that is one
// data-parallel rank behind a shared API server (the router's
// --workers id=url#rank form).
func rankedAddress(v ctlview.Worker) string {
	if v.DataParallelRank == nil {
		return v.Address
	}
	return fmt.Sprintf("%s#%d", v.Address, *v.DataParallelRank)
}

func stateName(s kvdirv1.WorkerState) string { return enumName(s.String(), "WORKER_STATE_") }

func enumName(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" {
		return "-"
	}
	return s
}

// stateText is v's state for the table, "(partial)" appended while its
// agent reports a view that may miss blocks the engine holds, and
// "(over-quota)" once its events stored more blocks than its quota.
func stateText(v ctlview.Worker) string {
	s := v.State
	if v.ViewPartial {
		s += "(partial)"
	}
	if v.DroppedBlocks > 0 {
		s += "(over-quota)"
	}
	return s
}

func heartbeat(v ctlview.Worker) string {
	if v.HeartbeatAge == nil {
		return "never"
	}
	return clitable.Age(time.Duration(float64(*v.HeartbeatAge) * float64(time.Second)))
}

func (a *app) workersCommand() *cobra.Command {
	var (
		w       watchOpts
		model   string
		all     bool
		topN    uint32
		withSes bool
	)
	cmd := &cobra.Command{
		Use:     "workers",
		Aliases: []string{"worker"},
		Short:   "Workers: state, epoch, blocks held, KV usage, running and waiting requests, heartbeat age, block sizes",
		Long: `workers lists the workers (engine replicas) the directory knows: their id,
address, model, state (ACTIVE, DRAINING; with --all also EXPIRED and
DEREGISTERED), epoch (bumped at every registration), blocks held in the
index, and their load as their agent last reported it: KV-cache usage,
running and waiting requests, the engine's prefix-cache hit rate (in tokens,
since the engine started) and how long ago the load was recorded.
A state such as ACTIVE(partial) means the worker's agent could not rebuild
its view from the engine's replay at its latest registration: the index may
miss blocks the engine holds until the engine stores them again;
ACTIVE(over-quota) that its events stored more blocks than the directory's
--worker-block-quota, and the rest were not kept. -o json shows the owning
agent credential (owner), the quota and the blocks dropped.
BLOCK-SIZE is the block size(s) learned from the worker's KV events, which
routers hash prompts with; "16?" is a registered size no event confirmed yet.

"workers get ID" shows one worker and its longest held chains.`,
		Example: `  kvdirctl workers
  kvdirctl workers --model llama3-8b -o json
  kvdirctl workers --watch
  kvdirctl workers get enginesim-0 --top 5`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.watchLoop(cmd, w, func(ctx context.Context, out io.Writer) error {
				doc := ctlview.WorkerList{Workers: []ctlview.Worker{}}
				err := a.eachGroup(func(g *dirGroup) error {
					c, err := a.dir()
					if err != nil {
						return err
					}
					resp, err := c.ListWorkers(ctx, model, all)
					if err != nil {
						return err
					}
					if doc.Read.Node == "" {
						doc.Read = readOf(resp.Read) // the first group's
					}
					for _, wk := range resp.Workers {
						v := a.workerView(wk)
						if a.multiGroup() {
							v.Group = g.name
						}
						doc.Workers = append(doc.Workers, v)
					}
					return nil
				})
				if err != nil {
					return err
				}
				return a.write(out, doc, func(out io.Writer) error {
					if len(doc.Workers) == 0 {
						fmt.Fprintln(out, "No workers registered"+modelSuffix(model)+". Agents register their engine when they start (cmd/agent).")
						return nil
					}
					cols := []string{"ID", "ADDRESS", "MODEL", "STATE", "EPOCH", "BLOCKS", "KV-USAGE", "RUNNING", "WAITING", "PREFIX-HIT", "HEARTBEAT", "BLOCK-SIZE"}
					if a.multiGroup() {
						cols = append([]string{"GROUP"}, cols...)
					}
					t := clitable.NewTab(cols...)
					for _, v := range doc.Workers {
						row := []any{v.ID, rankedAddress(v), v.Model, stateText(v), v.Epoch, v.Blocks, clitable.Percent(float64(v.KVUsage), 1),
							v.Running, v.Waiting, clitable.Percent(float64(v.PrefixHits), float64(v.PrefixQueries)), heartbeat(v),
							blockSizesText(v)}
						if a.multiGroup() {
							row = append([]any{v.Group}, row...)
						}
						t.Add(row...)
					}
					_, err := t.WriteTo(out)
					return err
				})
			})
		},
	}
	w.addFlags(cmd)
	cmd.Flags().StringVar(&model, "model", "", "only workers of this model")
	cmd.Flags().BoolVar(&all, "all", false, "include expired and deregistered workers")

	get := &cobra.Command{
		Use:   "get WORKER",
		Short: "One worker in detail, with its longest held chains",
		Long: `get shows one worker: its registration, load and blocks per medium, and its
--top longest chains of blocks (a chain is a prefix: its tail block's hash and
its length), with the recorded sessions whose latest turn's prompt ends
exactly at that chain's tail (a chain often goes on past a session's prompt
with the blocks of its generated tokens).`,
		Example:           `  kvdirctl workers get enginesim-0 --top 5 -o yaml`,
		Args:              exactArgs("WORKER"),
		ValidArgsFunction: a.completeWorkers,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.workerGet(cmd.Context(), args[0], topN, withSes)
		},
	}
	get.Flags().Uint32Var(&topN, "top", 10, "how many of its longest chains to show (0: none, at most 1000)")
	get.Flags().BoolVar(&withSes, "sessions", true, "name the recorded sessions that end on each chain")
	cmd.AddCommand(get)
	return cmd
}

func modelSuffix(model string) string {
	if model == "" {
		return ""
	}
	return " for model " + model
}

func (a *app) workerGet(ctx context.Context, id string, top uint32, withSessions bool) error {
	if err := a.groupOfWorker(ctx, id); err != nil {
		return err
	}
	c, err := a.dir()
	if err != nil {
		return err
	}
	resp, err := c.GetWorker(ctx, id, top)
	if err != nil {
		return err
	}
	v := a.workerView(resp.Worker)
	if a.multiGroup() {
		v.Group = a.groups[a.cur].name
	}
	byTail := map[uint64][]string{}
	if withSessions && len(resp.Chains) > 0 {
		ss, err := c.ListSessions(ctx, "", id, 10_000)
		if err != nil {
			return err
		}
		for _, s := range ss.Sessions {
			byTail[s.Tail] = append(byTail[s.Tail], s.SessionId)
		}
	}
	doc := ctlview.WorkerDetail{Worker: v, Chains: []ctlview.Chain{}, Read: readOf(resp.Read)}
	for _, ch := range resp.Chains {
		doc.Chains = append(doc.Chains, ctlview.Chain{
			Tail: fmt.Sprintf("%016x", ch.Tail), Blocks: ch.Blocks,
			Tokens: uint64(ch.Blocks) * uint64(viewBlockSize(v)), Sessions: byTail[ch.Tail],
		})
	}
	return a.write(a.out, doc, func(out io.Writer) error {
		kv := clitable.NewTab()
		kv.Add("id:", v.ID)
		if v.Group != "" {
			kv.Add("directory group:", v.Group)
		}
		kv.Add("address:", v.Address)
		if v.DataParallelRank != nil {
			kv.Add("data-parallel rank:", fmt.Sprintf("%d (requests carry X-data-parallel-rank: %d)", *v.DataParallelRank, *v.DataParallelRank))
		}
		kv.Add("model:", fmt.Sprintf("%s (engine %s)", v.Model, v.Engine))
		kv.Add("block size:", blockSizeLine(v))
		kv.Add("kv groups:", groupsText(v))
		kv.Add("state:", fmt.Sprintf("%s, epoch %d, last applied event batch seq %d", v.State, v.Epoch, v.AppliedSeq))
		kv.Add("blocks:", fmt.Sprintf("%d held (gpu %d, cpu %d, disk %d, remote %d) = %d tokens",
			v.Blocks, v.GPUBlocks, v.CPUBlocks, v.DiskBlocks, v.RemoteBlocks, v.Blocks*uint64(viewBlockSize(v))))
		if v.DroppedBlocks > 0 {
			kv.Add("over quota:", fmt.Sprintf("%d stored blocks past its quota of %d were not kept", v.DroppedBlocks, v.BlockQuota))
		}
		if v.Owner != "" {
			kv.Add("owner:", "agent credential "+v.Owner)
		}
		capacity := ""
		if v.KVBlocks > 0 {
			capacity = fmt.Sprintf(" of %d blocks", v.KVBlocks)
		}
		kv.Add("load:", fmt.Sprintf("%d running, %d waiting, KV usage %s%s", v.Running, v.Waiting, clitable.Percent(float64(v.KVUsage), 1), capacity))
		kv.Add("prefix cache:", fmt.Sprintf("%d of %d prompt tokens hit (%s) since the engine started",
			v.PrefixHits, v.PrefixQueries, clitable.Percent(float64(v.PrefixHits), float64(v.PrefixQueries))))
		kv.Add("heartbeat:", heartbeat(v)+" ago")
		if len(v.Labels) > 0 {
			kv.Add("labels:", labelsString(v.Labels))
		}
		if _, err := kv.WriteTo(out); err != nil {
			return err
		}
		if top == 0 {
			return nil
		}
		fmt.Fprintf(out, "\nLongest chains (top %d):\n", top)
		if len(doc.Chains) == 0 {
			fmt.Fprintln(out, "  none: the worker holds no blocks")
			return nil
		}
		t := clitable.NewTab("#", "TAIL", "BLOCKS", "TOKENS", "SESSIONS")
		for i, ch := range doc.Chains {
			t.Add(i+1, ch.Tail, ch.Blocks, ch.Tokens, listOrDash(ch.Sessions, 3))
		}
		_, err := t.WriteTo(out)
		return err
	})
}

func labelsString(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func listOrDash(xs []string, max int) string {
	switch {
	case len(xs) == 0:
		return "-"
	case len(xs) <= max:
		return strings.Join(xs, ",")
	}
	return fmt.Sprintf("%s,... (%d)", strings.Join(xs[:max], ","), len(xs))
}

func readOf(r *kvdirv1.ReadInfo) ctlview.Read {
	return ctlview.Read{Node: r.GetNodeId(), AppliedIndex: r.GetAppliedIndex(),
		StalenessMs: clitable.Float(r.GetStaleness().AsDuration()) / 1e6, FromLeader: r.GetFromLeader()}
}
