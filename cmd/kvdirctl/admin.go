package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func (a *app) writeChange(ch ctlview.Change) error {
	return a.write(a.out, ch, func(out io.Writer) error {
		fmt.Fprintf(out, "%s %s", ch.Action, ch.Target)
		if ch.RaftIndex > 0 {
			fmt.Fprintf(out, " (raft index %d)", ch.RaftIndex)
		}
		if ch.Detail != "" {
			fmt.Fprintf(out, ": %s", ch.Detail)
		}
		fmt.Fprintln(out)
		return nil
	})
}

func (a *app) drainCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "drain WORKER",
		Short: "Stop routing new requests to a worker; it keeps its blocks (admin)",
		Long: `drain marks a worker DRAINING: routers stop placing new requests on it, while
its blocks stay in the index and its agent keeps heartbeating (so requests
already there finish, and "who-holds" still shows what it holds). Use it
before taking an engine down for maintenance. The worker becomes ACTIVE again
when its agent registers anew (an agent or engine restart).

Needs the admin token when the directory enforces roles.`,
		Example:           `  kvdirctl drain enginesim-1`,
		Args:              exactArgs("WORKER"),
		ValidArgsFunction: a.completeWorkers,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.groupOfWorker(cmd.Context(), args[0]); err != nil {
				return err
			}
			c, err := a.dir()
			if err != nil {
				return err
			}
			resp, err := c.DrainWorker(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.writeChange(ctlview.Change{Action: "drained", Target: args[0], RaftIndex: resp.RaftIndex,
				Detail: "routers place no new requests on it; its blocks stay until it expires or re-registers"})
		},
	}
}

func (a *app) expireCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "expire WORKER",
		Short: "Expire a worker now and remove its blocks from the index (admin)",
		Long: `expire does now what the lease does when a worker stops heartbeating: the
worker becomes EXPIRED and every block it held leaves the index, so no router
sends a session there for its cache. Use it for an engine that is gone for
good and whose agent cannot deregister it. If its agent is still running it
registers the worker again (with a new epoch and an empty index).

Needs the admin token when the directory enforces roles.`,
		Example:           `  kvdirctl expire enginesim-1`,
		Args:              exactArgs("WORKER"),
		ValidArgsFunction: a.completeWorkers,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.groupOfWorker(cmd.Context(), args[0]); err != nil {
				return err
			}
			c, err := a.dir()
			if err != nil {
				return err
			}
			resp, err := c.ExpireWorker(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.writeChange(ctlview.Change{Action: "expired", Target: args[0], RaftIndex: resp.RaftIndex,
				Detail: "its blocks were removed from the index"})
		},
	}
}

func (a *app) membersCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "members",
		Aliases: []string{"member"},
		Short:   "List, add or remove directory cluster members",
		Long: `members lists the Raft members of the directory cluster, and adds or removes
one (admin). To grow the cluster, the usual way is to start the new node with
--join <any member's API address>, which adds it by itself; "members add" is
for adding a node by hand, e.g. as a non-voter first. Remove a node before
you retire it for good, so that the majority is counted without it.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.membersList(cmd.Context()) },
	}
	list := &cobra.Command{
		Use:     "list",
		Short:   "List the members: id, Raft and API addresses, voter, leader",
		Example: `  kvdirctl members list -o json`,
		Args:    exactArgs(),
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.membersList(cmd.Context()) },
	}
	var (
		raftAddr, apiAddr string
		nonVoter          bool
	)
	add := &cobra.Command{
		Use:   "add ID --raft-address HOST:PORT [--api-address HOST:PORT] [--non-voter]",
		Short: "Add a member (admin)",
		Long: `add adds a node to the Raft configuration. Start the node first (with its
--raft-addr, and no --initial-cluster), then add it; it catches up from the
leader. --api-address records its gRPC address so that clients and other
nodes can reach it.`,
		Example: `  kvdirctl members add n4 --raft-address 10.0.0.4:7000 --api-address 10.0.0.4:7001`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if raftAddr == "" {
				return usageErrorf("--raft-address is required: the new node's Raft address (its --raft-addr)")
			}
			c, err := a.dir()
			if err != nil {
				return err
			}
			resp, err := c.AddMember(cmd.Context(), &kvdirv1.AddMemberRequest{Id: args[0], RaftAddress: raftAddr, ApiAddress: apiAddr, NonVoter: nonVoter})
			if err != nil {
				return err
			}
			kind := "voter"
			if nonVoter {
				kind = "non-voter"
			}
			return a.writeChange(ctlview.Change{Action: "added member", Target: args[0], RaftIndex: resp.RaftIndex,
				Detail: fmt.Sprintf("%s at raft %s", kind, raftAddr)})
		},
	}
	add.Flags().StringVar(&raftAddr, "raft-address", "", "the new node's Raft address (required)")
	add.Flags().StringVar(&apiAddr, "api-address", "", "the new node's gRPC API address")
	add.Flags().BoolVar(&nonVoter, "non-voter", false, "add it as a non-voter (replicates, does not vote)")
	remove := &cobra.Command{
		Use:               "remove ID",
		Short:             "Remove a member (admin)",
		Example:           `  kvdirctl members remove n4`,
		Args:              exactArgs("ID"),
		ValidArgsFunction: a.completeMembers,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.dir()
			if err != nil {
				return err
			}
			resp, err := c.RemoveMember(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.writeChange(ctlview.Change{Action: "removed member", Target: args[0], RaftIndex: resp.RaftIndex})
		},
	}
	cmd.AddCommand(list, add, remove)
	return cmd
}

func (a *app) membersList(ctx context.Context) error {
	c, err := a.dir()
	if err != nil {
		return err
	}
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	doc := ctlview.MemberList{Members: []ctlview.Member{}, From: st.NodeId}
	for _, m := range st.Members {
		doc.Members = append(doc.Members, ctlview.Member{ID: m.Id, RaftAddress: m.RaftAddress, APIAddress: m.ApiAddress, Voter: m.Voter, Leader: m.Leader})
	}
	slices.SortFunc(doc.Members, func(x, y ctlview.Member) int { return strings.Compare(x.ID, y.ID) })
	return a.write(a.out, doc, func(out io.Writer) error {
		t := clitable.NewTab("ID", "RAFT-ADDRESS", "API-ADDRESS", "VOTER", "LEADER")
		for _, m := range doc.Members {
			api := m.APIAddress
			if api == "" {
				api = "-"
			}
			t.Add(m.ID, m.RaftAddress, api, yesNo(m.Voter), yesNo(m.Leader))
		}
		_, err := t.WriteTo(out)
		return err
	})
}

func (a *app) snapshotCommand() *cobra.Command {
	var nodes []string
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Make directory nodes take a Raft snapshot now (admin)",
		Long: `snapshot makes each member (or only the nodes given with --node) write a Raft
snapshot of its state now and compact its log behind it. Nodes also do this
on their own (every --snapshot-interval / --snapshot-threshold); use this
before a planned restart so that the node restarts from a recent snapshot.`,
		Example: `  kvdirctl snapshot
  kvdirctl snapshot --node 127.0.0.1:7011`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.snapshot(cmd.Context(), nodes) },
	}
	cmd.Flags().StringSliceVar(&nodes, "node", nil, "API address of a node to snapshot (repeatable; default: every member)")
	return cmd
}

func (a *app) snapshot(ctx context.Context, only []string) error {
	c, err := a.dir()
	if err != nil {
		return err
	}
	var targets []ctlview.Snapshot
	if len(only) > 0 {
		for _, addr := range only {
			targets = append(targets, ctlview.Snapshot{Address: addr})
		}
	} else {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		for _, m := range st.Members {
			if m.ApiAddress == "" {
				targets = append(targets, ctlview.Snapshot{Node: m.Id, Error: "its API address is not known to the cluster"})
				continue
			}
			targets = append(targets, ctlview.Snapshot{Node: m.Id, Address: m.ApiAddress})
		}
		// By node id, as status and members list print them; the
		// membership's own order changes with the leader.
		slices.SortFunc(targets, func(x, y ctlview.Snapshot) int { return strings.Compare(x.Node, y.Node) })
	}
	var wg sync.WaitGroup
	for i := range targets {
		if targets[i].Address == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &targets[i]
			resp, err := c.Snapshot(ctx, t.Address)
			if err != nil {
				t.Error = describe(err, a)
				return
			}
			t.Index, t.Term = resp.Index, resp.Term
			if t.Node == "" {
				if st, err := c.StatusOf(ctx, t.Address); err == nil {
					t.Node = st.NodeId
				}
			}
		}()
	}
	wg.Wait()
	failed := 0
	for _, t := range targets {
		if t.Error != "" {
			failed++
		}
	}
	doc := ctlview.SnapshotList{Snapshots: targets}
	if err := a.write(a.out, doc, func(out io.Writer) error {
		t := clitable.NewTab("NODE", "ADDRESS", "INDEX", "TERM", "RESULT")
		for _, s := range targets {
			if s.Error != "" {
				t.Add(s.Node, s.Address, "-", "-", "failed: "+firstLine(s.Error))
				continue
			}
			t.Add(s.Node, s.Address, s.Index, s.Term, "ok")
		}
		_, err := t.WriteTo(out)
		return err
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("snapshot failed on %d of %d node(s)", failed, len(targets))
	}
	return nil
}

func (a *app) leaderCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leader",
		Short: "Leadership of the directory cluster",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	transfer := &cobra.Command{
		Use:   "transfer [ID]",
		Short: "Hand leadership to member ID, or to any suitable member (admin)",
		Long: `transfer asks the leader to hand leadership over, to member ID or, without
an ID, to the most up-to-date other voter, and waits until a node reports the
new leader. Use it before stopping the leader's machine (a node stopped with
SIGTERM also hands over by itself).`,
		Example:           `  kvdirctl leader transfer n2`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeMembers,
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			return a.leaderTransfer(cmd.Context(), id)
		},
	}
	transfer.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 1 {
			return usageErrorf("transfer takes at most one member id, got %d arguments", len(args))
		}
		return nil
	}
	cmd.AddCommand(transfer)
	return cmd
}

func (a *app) leaderTransfer(ctx context.Context, id string) error {
	c, err := a.dir()
	if err != nil {
		return err
	}
	before, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if id != "" && id == before.LeaderId {
		return a.writeChange(ctlview.Change{Action: "leader is already", Target: id})
	}
	resp, err := c.TransferLeadership(ctx, id)
	if err != nil {
		return err
	}
	leader := resp.LeaderId
	// Wait until a node confirms the new leader, so that the next command
	// finds it.
	deadline := time.Now().Add(a.timeout)
	for time.Now().Before(deadline) {
		st, err := c.Status(ctx)
		if err == nil && st.LeaderId != "" && st.LeaderId != before.LeaderId {
			leader = st.LeaderId
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return a.writeChange(ctlview.Change{Action: "leadership transferred", Target: leader, Detail: "from " + before.LeaderId})
}

// Shell completion of worker ids, session ids, member ids and models.

func (a *app) completionClient(cmd *cobra.Command) bool {
	if a.current() != nil {
		return true
	}
	if err := a.setup(cmd); err != nil {
		return false
	}
	if a.cur < 0 {
		a.useGroup(0) // with several groups, complete from the first
	}
	_, err := a.dir()
	return err == nil
}

func (a *app) completeWorkers(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || !a.completionClient(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	lw, err := a.current().ListWorkers(ctx, "", false)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, w := range lw.Workers {
		if id := w.GetSpec().GetId(); strings.HasPrefix(id, toComplete) {
			out = append(out, id+"\t"+stateName(w.State)+" "+w.GetSpec().GetModel())
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeSessions(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || !a.completionClient(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ls, err := a.current().ListSessions(ctx, toComplete, "", 200)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, s := range ls.Sessions {
		out = append(out, s.SessionId+"\t"+s.WorkerId)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeMembers(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || !a.completionClient(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := a.current().Status(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, m := range st.Members {
		if strings.HasPrefix(m.Id, toComplete) {
			out = append(out, m.Id+"\t"+m.ApiAddress)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeModels(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if !a.completionClient(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	lw, err := a.current().ListWorkers(ctx, "", false)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, w := range lw.Workers {
		if m := w.GetSpec().GetModel(); strings.HasPrefix(m, toComplete) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
