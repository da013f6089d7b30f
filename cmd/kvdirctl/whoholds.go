package main

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func (a *app) whoHoldsCommand() *cobra.Command {
	var (
		prefix       bool
		limit        uint32
		profileName  string
		promptTokens int
	)
	cmd := &cobra.Command{
		Use:   "who-holds SESSION",
		Short: "Which workers hold a session's prefix, how much, where the router would send it now, and the cost of moving it",
		Long: `who-holds looks up a session the router recorded and shows every worker that
holds part of its latest turn's prefix (blocks, tokens, and percent of the
turn's chain), then places the session's next turn with the router's kvdir
cost model: for every ACTIVE worker of the session's model, the expected time
to first token (TTFT) = wait (queued prefill and decode interference) +
prefill of the tokens it does not hold, using the load its agent last
reported. The worker with the lowest TTFT is the pick; VS-PICK is what
sending the session anywhere else would cost in expected TTFT.

The prompt is taken to be as long as the session's latest turn (use
--prompt-tokens for a longer next turn). The model cannot see the router's
own queue (requests routed and not yet started), so with busy routers it
favours warm workers slightly more than the router does; "kvdirctl explain"
asks the router itself.`,
		Example: `  kvdirctl who-holds chat-7f3a
  kvdirctl who-holds chat-7f3a -o json
  kvdirctl who-holds --prefix user-42- --limit 5
  kvdirctl who-holds chat-7f3a --profile llama3-70b --prompt-tokens 12000`,
		Args:              exactArgs("SESSION"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if promptTokens < 0 {
				return usageErrorf("--prompt-tokens must not be negative")
			}
			prof, err := costmodel.ResolveProfile(profileName)
			if err != nil {
				return cli.Usage(fmt.Errorf("--profile: %w", err))
			}
			return a.whoHolds(cmd.Context(), args[0], prefix, limit, prof, promptTokens)
		},
	}
	cmd.Flags().BoolVar(&prefix, "prefix", false, "treat SESSION as a session-id prefix and show every matching session")
	cmd.Flags().Uint32Var(&limit, "limit", 20, "with --prefix: at most this many sessions")
	cmd.Flags().StringVar(&profileName, "profile", costmodel.DefaultProfileName, "timing profile of the cost model: "+strings.Join(costmodel.ProfileNames(), ", ")+", or a JSON profile file")
	cmd.Flags().IntVar(&promptTokens, "prompt-tokens", 0, "prompt length of the turn to place (default: the latest turn's)")
	markEnv(cmd.Flags(), "profile")
	return cmd
}

func (a *app) whoHolds(ctx context.Context, target string, prefix bool, limit uint32, prof costmodel.Profile, promptTokens int) error {
	var views []ctlview.WhoHolds
	var read *kvdirv1.ReadInfo
	found := false
	// A session is recorded in the group of its model: with several
	// groups, a session's holders come from the group that knows it, a
	// prefix's from every group.
	err := a.eachGroup(func(g *dirGroup) error {
		if found && !prefix {
			return nil
		}
		c, err := a.dir()
		if err != nil {
			return err
		}
		var resp *kvdirv1.WhoHoldsResponse
		if prefix {
			resp, err = c.WhoHoldsPrefix(ctx, target, limit)
		} else {
			resp, err = c.WhoHolds(ctx, target)
		}
		if err != nil {
			if a.multiGroup() && status.Code(err) == codes.NotFound {
				return nil
			}
			return err
		}
		found = true
		if read == nil {
			read = resp.Read
		}
		lw, err := c.ListWorkers(ctx, "", false)
		if err != nil {
			return err
		}
		for _, sh := range resp.Sessions {
			v, err := a.placeSession(sh, lw.Workers, prof, promptTokens)
			if err != nil {
				return err
			}
			views = append(views, v)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !found && !prefix {
		return fmt.Errorf("session %q is not recorded in any directory group (%s): never routed, or expired", target, a.groupNames())
	}
	if prefix {
		doc := ctlview.WhoHoldsList{Sessions: views, Read: readOf(read)}
		if doc.Sessions == nil {
			doc.Sessions = []ctlview.WhoHolds{}
		}
		return a.write(a.out, doc, func(out io.Writer) error {
			if len(views) == 0 {
				fmt.Fprintf(out, "No recorded session starts with %q.\n", target)
			}
			for i := range views {
				if i > 0 {
					fmt.Fprintln(out)
				}
				if err := writeWhoHolds(out, &views[i]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if len(views) != 1 {
		return fmt.Errorf("who-holds %s: the directory answered %d sessions", target, len(views))
	}
	return a.write(a.out, views[0], func(out io.Writer) error { return writeWhoHolds(out, &views[0]) })
}

// placeSession builds the holders and the cost-model placement of one
// session.
func (a *app) placeSession(sh *kvdirv1.SessionHolders, workers []*kvdirv1.Worker, prof costmodel.Profile, promptTokens int) (ctlview.WhoHolds, error) {
	r := sh.Session
	v := ctlview.WhoHolds{Session: a.sessionView(r), ChainTokens: uint64(r.Blocks) * uint64(r.BlockSize),
		Connected: len(sh.Holders) > 0, Profile: prof.Name, Holders: []ctlview.Holder{}, Placement: []ctlview.Placement{}}
	byID := map[string]*kvdirv1.Worker{}
	for _, w := range workers {
		byID[w.GetSpec().GetId()] = w
	}
	matched := map[string]int{}
	for _, h := range sh.Holders {
		hv := ctlview.Holder{Worker: h.WorkerId, State: "GONE", Blocks: h.Blocks, Tokens: h.Tokens,
			GPUBlocks: h.GpuBlocks, CPUBlocks: h.CpuBlocks, DiskBlocks: h.DiskBlocks, RemoteBlocks: h.RemoteBlocks}
		if r.Blocks > 0 {
			hv.Percent = clitable.Float(100 * float64(h.Blocks) / float64(r.Blocks))
		}
		if w, ok := byID[h.WorkerId]; ok {
			hv.State = stateName(w.State)
		}
		v.Holders = append(v.Holders, hv)
		matched[h.WorkerId] = int(h.Blocks)
	}
	slices.SortStableFunc(v.Holders, func(x, y ctlview.Holder) int { return int(y.Blocks) - int(x.Blocks) })

	// The session's model: its worker's, else its largest holder's.
	for _, id := range append([]string{r.WorkerId}, holderIDs(v.Holders)...) {
		if w, ok := byID[id]; ok {
			v.Model = w.GetSpec().GetModel()
			break
		}
	}
	if v.Model == "" {
		v.Note = "no registered worker serves this session's model any more (its worker and holders are gone)"
		return v, nil
	}
	var cands []placement.Candidate
	for _, w := range workers {
		s := w.GetSpec()
		if s.GetModel() != v.Model || w.State != kvdirv1.WorkerState_WORKER_STATE_ACTIVE ||
			(r.BlockSize != 0 && !holdsBlockSize(w, r.BlockSize)) {
			continue
		}
		l := w.GetLoad()
		cands = append(cands, placement.Candidate{
			Worker: s.GetId(), MatchedBlocks: matched[s.GetId()],
			Load: placement.Load{Running: int(l.GetRunning()), Waiting: int(l.GetWaiting()), KVUsage: l.GetKvUsage()},
		})
	}
	if len(cands) == 0 {
		v.Note = fmt.Sprintf("no ACTIVE worker of model %s can take the session", v.Model)
		return v, nil
	}
	v.PromptTokens = promptTokens
	if v.PromptTokens == 0 {
		v.PromptTokens = int(r.PromptTokens)
	}
	if v.PromptTokens == 0 {
		v.PromptTokens = int(v.ChainTokens)
	}
	bs := int(r.BlockSize)
	if bs == 0 {
		bs = 16
	}
	if v.PromptTokens < 1 {
		v.Note = "the session's latest turn has no tokens: nothing to place"
		return v, nil
	}
	pol, err := placement.NewKVDir(placement.Options{Profile: prof})
	if err != nil {
		return v, fmt.Errorf("cost model: %w", err)
	}
	d, err := pol.Pick(placement.Request{SessionKey: r.SessionId, PromptTokens: v.PromptTokens, BlockSize: bs}, cands)
	if err != nil {
		return v, fmt.Errorf("cost model: %w", err)
	}
	v.Pick = d.Worker
	best := d.Scores[d.Index].TotalMs
	for i, s := range d.Scores {
		c := cands[i]
		v.Placement = append(v.Placement, ctlview.Placement{
			Worker: s.Worker, MatchedTokens: s.MatchedTokens, Retain: clitable.Float(s.Retain), CachedTokens: clitable.Float(s.CachedTokens),
			Running: c.Load.Running, Waiting: c.Load.Waiting, KVUsage: clitable.Float(c.Load.KVUsage),
			QueueMs: clitable.Float(s.QueueMs), InterfMs: clitable.Float(s.InterferenceMs), WaitMs: clitable.Float(s.WaitMs), PrefillMs: clitable.Float(s.PrefillMs),
			ColdPrefillMs: clitable.Float(s.ColdPrefillMs), TTFTMs: clitable.Float(s.TotalMs), VsPickMs: clitable.Float(s.TotalMs - best),
			Pick: i == d.Index, Current: s.Worker == r.WorkerId,
		})
	}
	slices.SortStableFunc(v.Placement, func(x, y ctlview.Placement) int {
		switch {
		case x.Pick != y.Pick:
			if x.Pick {
				return -1
			}
			return 1
		case x.TTFTMs < y.TTFTMs:
			return -1
		case x.TTFTMs > y.TTFTMs:
			return 1
		}
		return strings.Compare(x.Worker, y.Worker)
	})
	return v, nil
}

func holderIDs(hs []ctlview.Holder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Worker
	}
	return out
}

func writeWhoHolds(w io.Writer, v *ctlview.WhoHolds) error {
	s := v.Session
	fmt.Fprintf(w, "session %s: latest turn on %s, %d prompt tokens, %d cached (%s), chain of %d blocks (%d tokens), recorded %s ago\n",
		s.ID, s.Worker, s.PromptTokens, s.CachedTokens, clitable.Percent(float64(s.CachedTokens), float64(s.PromptTokens)),
		s.Blocks, v.ChainTokens, sessionAge(s))
	fmt.Fprintln(w)
	if !v.Connected {
		fmt.Fprintln(w, "Holders: none. No worker holds the turn's last block any more (evicted, or its worker expired),")
		fmt.Fprintln(w, "so the index cannot trace the session's chain; every worker starts it cold.")
	} else {
		fmt.Fprintln(w, "Holders:")
		t := clitable.NewTab("WORKER", "STATE", "BLOCKS", "TOKENS", "OF-CHAIN", "GPU", "CPU", "DISK", "REMOTE")
		for _, h := range v.Holders {
			t.Add(h.Worker, h.State, h.Blocks, h.Tokens, fmt.Sprintf("%.1f%%", h.Percent), h.GPUBlocks, h.CPUBlocks, h.DiskBlocks, h.RemoteBlocks)
		}
		if _, err := t.WriteTo(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if v.Note != "" {
		fmt.Fprintf(w, "Placement: %s.\n", v.Note)
		return nil
	}
	fmt.Fprintf(w, "Placement of a %d-token turn (kvdir cost model, profile %s, model %s, load as last reported):\n", v.PromptTokens, v.Profile, v.Model)
	t := clitable.NewTab("WORKER", "MATCHED", "EXP-CACHED", "RUNNING", "WAITING", "KV-USAGE", "WAIT-MS", "PREFILL-MS", "TTFT-MS", "VS-PICK", "")
	for _, p := range v.Placement {
		mark := ""
		switch {
		case p.Pick && p.Current:
			mark = "pick, current"
		case p.Pick:
			mark = "pick"
		case p.Current:
			mark = "current"
		}
		vs := "-"
		if !p.Pick {
			vs = fmt.Sprintf("%+.1f ms", p.VsPickMs)
		}
		t.Add(p.Worker, p.MatchedTokens, fmt.Sprintf("%.0f", p.CachedTokens), p.Running, p.Waiting, clitable.Percent(float64(p.KVUsage), 1),
			clitable.Millis(float64(p.WaitMs)), clitable.Millis(float64(p.PrefillMs)), clitable.Millis(float64(p.TTFTMs)), vs, mark)
	}
	if _, err := t.WriteTo(w); err != nil {
		return err
	}
	var pick, current *ctlview.Placement
	for i := range v.Placement {
		if v.Placement[i].Pick {
			pick = &v.Placement[i]
		}
		if v.Placement[i].Current {
			current = &v.Placement[i]
		}
	}
	switch {
	case len(v.Placement) == 1:
		fmt.Fprintf(w, "\npick: %s (the only candidate).\n", v.Pick)
	case current == pick:
		next, worst := v.Placement[1], v.Placement[len(v.Placement)-1]
		fmt.Fprintf(w, "\npick: %s, where the session is. Moving it costs %+.1f ms of expected TTFT on %s (the next best)", v.Pick, next.VsPickMs, next.Worker)
		if worst.Worker != next.Worker {
			fmt.Fprintf(w, ", up to %+.1f ms on %s", worst.VsPickMs, worst.Worker)
		}
		fmt.Fprintln(w, ".")
	case current != nil:
		fmt.Fprintf(w, "\npick: %s. Staying on %s, where the session's latest turn went, would cost %+.1f ms of expected TTFT: its load outweighs its cache.\n",
			pick.Worker, current.Worker, current.VsPickMs)
	default:
		fmt.Fprintf(w, "\npick: %s. The session's worker %s is not a candidate (not ACTIVE, or another model or block size).\n", v.Pick, s.Worker)
	}
	return nil
}
