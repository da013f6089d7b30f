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

func (a *app) statusCommand() *cobra.Command {
	var w watchOpts
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Members, leader, term, indexes, lag and digest agreement of the directory cluster",
		Long: `status asks one node for the member list, then every member for its own view:
its Raft state, term, commit and applied index, how far its applied index is
behind the leader's commit index (LAG), how long ago it last heard from the
leader (LAST-CONTACT; 0 on the leader), and the digest of its index.

The digests of nodes at the same applied index must be equal: "digests:
agree" says they are. While writes keep arriving the nodes may be at
different indexes; status asks again a few times before it calls the
comparison inconclusive. A node that does not answer is listed as
unreachable.

Routers connected to the nodes that keep a replica of the directory
(router --follow-log) are listed in a second table: ROUTER, the NODE it
is connected to, its replica's APPLIED index, LAG (log entries behind the
last commit index it heard of), HEARD (how long ago a node last sent its
replica anything) and DIGEST (of its index, as the nodes' DIGEST). Each
node compares the router's state digest with its own at the router's
applied index when a report comes while the node is at that index;
"routers: agree" says every router compared matched.
Routers that do not follow the log are in -o json only (routers).

Below the tables: the leader, and the index counters (workers, blocks,
entries, sessions) as the leader reports them; then the misconfiguration
check: each worker whose routers' predicted cached tokens and its engine's
reported ones disagree (MISMATCH lines: the condition, the numbers, the
likely cause and what to check), judged from the worker's cache accounting
by the same rule the routers apply; and warnings, among them workers
whose agent was told a block size (--block-size) their engine's events do
not show.`,
		Example: `  kvdirctl status
  kvdirctl status -o json
  kvdirctl status --watch --interval 1s`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.watchLoop(cmd, w, func(ctx context.Context, out io.Writer) error {
				if a.multiGroup() {
					return a.groupsStatus(ctx, out)
				}
				st, err := a.clusterStatus(ctx)
				if err != nil {
					return err
				}
				a.cacheMismatches(ctx, st)
				return a.write(out, st, func(out io.Writer) error { return writeStatus(out, st) })
			})
		},
	}
	w.addFlags(cmd)
	return cmd
}

// clusterStatus asks every member for its status, up to four times until
// the reachable ones are at the same applied index.
func (a *app) clusterStatus(ctx context.Context) (*ctlview.Status, error) {
	c, err := a.dir()
	if err != nil {
		return nil, err
	}
	first, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	members := slices.Clone(first.Members)
	slices.SortFunc(members, func(x, y *kvdirv1.Member) int { return strings.Compare(x.Id, y.Id) })
	if len(members) == 0 { // the node does not know its configuration
		members = []*kvdirv1.Member{{Id: first.NodeId, ApiAddress: "", Voter: true}}
	}
	var st *ctlview.Status
	for attempt := 0; attempt < 4; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			}
		}
		st = a.askMembers(ctx, first, members)
		if st.Digests.Comparable {
			break
		}
	}
	st.BlockSizeMismatches = a.blockSizeMismatches(ctx)
	return st, nil
}

func (a *app) askMembers(ctx context.Context, first *kvdirv1.StatusResponse, members []*kvdirv1.Member) *ctlview.Status {
	c := a.current()
	answers := make([]*kvdirv1.StatusResponse, len(members))
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		if m.ApiAddress == "" {
			if m.Id == first.NodeId {
				answers[i] = first
			} else {
				errs[i] = fmt.Errorf("its API address is not known to the cluster")
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, a.timeout)
			defer cancel()
			answers[i], errs[i] = c.StatusOf(cctx, m.ApiAddress)
		}()
	}
	wg.Wait()

	st := &ctlview.Status{Leader: first.LeaderId, LeaderAddress: first.LeaderAddress, Term: first.Term}
	var leader *kvdirv1.StatusResponse
	for _, r := range answers {
		if r != nil && r.State == "Leader" {
			leader = r
		}
	}
	if leader != nil {
		st.Leader, st.LeaderAddress, st.Term = leader.NodeId, leader.LeaderAddress, leader.Term
	}
	for i, m := range members {
		n := ctlview.Node{ID: m.Id, APIAddress: m.ApiAddress, RaftAddress: m.RaftAddress, Voter: m.Voter, Lag: -1}
		if r := answers[i]; r != nil {
			n.State = r.State
			n.Term, n.CommitIndex, n.AppliedIndex, n.LastLogIndex = r.Term, r.CommitIndex, r.AppliedIndex, r.LastLogIndex
			n.Digest = fmt.Sprintf("%016x", r.Digest)
			n.LastSnapshotIndex = r.LastSnapshotIndex
			n.LastContactMs = clitable.Float(r.GetStaleness().AsDuration()) / 1e6
			n.Counters = countersOf(r.Counters)
			n.WriteError = r.WriteError
			if leader != nil {
				n.Lag = max(0, int64(leader.CommitIndex)-int64(r.AppliedIndex))
			}
		} else {
			n.State = "unreachable"
			if st, ok := grpcStatus(errs[i]); ok {
				n.Error = st.Code().String() + ": " + st.Message()
			} else if errs[i] != nil {
				n.Error = errs[i].Error()
			}
		}
		st.Nodes = append(st.Nodes, n)
	}
	src := leader
	if src == nil {
		src = first
	}
	st.Counters, st.CountersFrom = countersOf(src.Counters), src.NodeId
	st.Digests = compareDigests(st.Nodes)
	st.Routers = routersOf(answers)
	st.RouterDigests = compareRouterDigests(st.Routers)
	return st
}

// routersOf collects the routers the nodes report, by id; a router that
// two nodes list (a stream that moved) is taken from the freshest report.
func routersOf(answers []*kvdirv1.StatusResponse) []ctlview.Router {
	byID := map[string]ctlview.Router{}
	for _, r := range answers {
		for _, rs := range r.GetRouters() {
			v := rs.GetView()
			cr := ctlview.Router{ID: rs.RouterId, Node: rs.NodeId, Follows: v.GetFollows(), Synced: v.GetSynced(),
				AppliedIndex: v.GetAppliedIndex(), LagEntries: v.GetLagEntries(),
				HeardAgeMs:  clitable.Float(v.GetHeardAge().AsDuration()) / 1e6,
				ReportAgeMs: clitable.Float(rs.GetReportAge().AsDuration()) / 1e6, Intents: rs.Intents}
			if cr.Follows && cr.Synced {
				cr.Digest, cr.StateDigest = fmt.Sprintf("%016x", v.GetIndexDigest()), fmt.Sprintf("%016x", v.GetDigest())
			}
			if rs.DigestChecked {
				cr.DigestChecked, cr.CheckedIndex = true, rs.CheckedIndex
				cr.CheckedDigest, cr.CheckedNodeDigest = fmt.Sprintf("%016x", rs.CheckedRouterDigest), fmt.Sprintf("%016x", rs.CheckedNodeDigest)
			}
			if old, ok := byID[cr.ID]; !ok || cr.ReportAgeMs < old.ReportAgeMs {
				byID[cr.ID] = cr
			}
		}
	}
	out := make([]ctlview.Router, 0, len(byID))
	for _, r := range byID {
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y ctlview.Router) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// compareRouterDigests says whether the following routers' replicas
// agree with the directory: each node compares the digest a router
// reports with its own at the router's applied index, when it is at that
// index as the report comes. nil when no router follows the log.
func compareRouterDigests(routers []ctlview.Router) *ctlview.DigestCheck {
	var following, agree, pending, differ []string
	for _, r := range routers {
		if !r.Follows {
			continue
		}
		following = append(following, r.ID)
		switch {
		case !r.Synced:
			pending = append(pending, r.ID+" (its replica is not in sync yet)")
		case !r.DigestChecked:
			pending = append(pending, r.ID+" (its node was at another applied index each time it reported)")
		case r.CheckedDigest == r.CheckedNodeDigest:
			agree = append(agree, fmt.Sprintf("%s at %d on %s", r.ID, r.CheckedIndex, r.Node))
		default:
			differ = append(differ, fmt.Sprintf("%s at applied index %d has %s, %s has %s", r.ID, r.CheckedIndex, r.CheckedDigest, r.Node, r.CheckedNodeDigest))
		}
	}
	if len(following) == 0 {
		return nil
	}
	dc := &ctlview.DigestCheck{Comparable: len(pending) == 0, Nodes: len(agree) + len(differ)}
	switch {
	case len(differ) > 0:
		dc.Detail = "DIFFER: " + strings.Join(differ, "; ") + "; the router's replica has diverged from the directory, " +
			"which is a bug: restart the router (its replica starts over from a snapshot) and report it"
	case len(agree) > 0:
		dc.Agree = len(pending) == 0
		dc.Detail = fmt.Sprintf("agree: %d router(s) with their node's digest at their applied index (%s)", len(agree), strings.Join(agree, ", "))
	}
	if len(pending) > 0 {
		if dc.Detail != "" {
			dc.Detail += "; "
		}
		dc.Detail += "not compared yet: " + strings.Join(pending, ", ") + "; ask again"
	}
	return dc
}

func countersOf(c *kvdirv1.IndexCounters) *ctlview.Counters {
	if c == nil {
		return nil
	}
	return &ctlview.Counters{Workers: c.Workers, Blocks: c.Blocks, Entries: c.Entries, StoredBlocks: c.StoredBlocks,
		OrphanBlocks: c.OrphanBlocks, ApproxBytes: c.ApproxBytes, Sessions: c.Sessions}
}

// compareDigests checks that the reachable nodes are at one applied index
// with one digest.
func compareDigests(nodes []ctlview.Node) ctlview.DigestCheck {
	byIndex := map[uint64][]ctlview.Node{}
	var indexes []uint64
	for _, n := range nodes {
		if n.Digest == "" {
			continue
		}
		if _, ok := byIndex[n.AppliedIndex]; !ok {
			indexes = append(indexes, n.AppliedIndex)
		}
		byIndex[n.AppliedIndex] = append(byIndex[n.AppliedIndex], n)
	}
	if len(indexes) == 0 {
		return ctlview.DigestCheck{Detail: "no node answered"}
	}
	if len(indexes) > 1 {
		var parts []string
		for _, n := range nodes {
			if n.Digest != "" {
				parts = append(parts, fmt.Sprintf("%s at %d", n.ID, n.AppliedIndex))
			}
		}
		return ctlview.DigestCheck{Detail: "not comparable: the nodes are at different applied indexes (" + strings.Join(parts, ", ") +
			"); writes are arriving, ask again"}
	}
	idx := indexes[0]
	group := byIndex[idx]
	digests := map[string][]string{}
	for _, n := range group {
		digests[n.Digest] = append(digests[n.Digest], n.ID)
	}
	dc := ctlview.DigestCheck{Comparable: true, Index: idx, Nodes: len(group)}
	if len(digests) == 1 {
		dc.Agree = true
		dc.Detail = fmt.Sprintf("agree: %d node(s) at applied index %d, digest %s", len(group), idx, group[0].Digest)
		return dc
	}
	var parts []string
	keys := make([]string, 0, len(digests))
	for d := range digests {
		keys = append(keys, d)
	}
	slices.Sort(keys)
	for _, d := range keys {
		parts = append(parts, fmt.Sprintf("%s on %s", d, strings.Join(digests[d], ",")))
	}
	dc.Detail = fmt.Sprintf("DIFFER at applied index %d: %s; the indexes have diverged, which is a bug: "+
		"keep the nodes' data directories and report it", idx, strings.Join(parts, "; "))
	return dc
}

func writeStatus(w io.Writer, st *ctlview.Status) error {
	t := clitable.NewTab("NODE", "API-ADDRESS", "STATE", "VOTER", "TERM", "COMMIT", "APPLIED", "LAG", "LAST-CONTACT", "SNAPSHOT", "DIGEST")
	for _, n := range st.Nodes {
		if n.Digest == "" {
			t.Add(n.ID, n.APIAddress, n.State, yesNo(n.Voter), "-", "-", "-", "-", "-", "-", "-")
			continue
		}
		lag := "-"
		if n.Lag >= 0 {
			lag = fmt.Sprint(n.Lag)
		}
		t.Add(n.ID, n.APIAddress, n.State, yesNo(n.Voter), n.Term, n.CommitIndex, n.AppliedIndex, lag,
			clitable.Age(time.Duration(n.LastContactMs*1e6)), n.LastSnapshotIndex, n.Digest)
	}
	if _, err := t.WriteTo(w); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := writeRouters(w, st.Routers); err != nil {
		return err
	}
	if st.Leader != "" {
		fmt.Fprintf(w, "leader:   %s (%s), term %d\n", st.Leader, st.LeaderAddress, st.Term)
	} else {
		fmt.Fprintf(w, "leader:   NONE: no node reports a leader; writes (drain, expire, sessions) fail until one is elected\n")
	}
	if c := st.Counters; c != nil {
		fmt.Fprintf(w, "index:    %d blocks held by %d worker(s), %d (block, worker) entries, %d orphan blocks, %d sessions, about %s (from %s)\n",
			c.Blocks, c.Workers, c.Entries, c.OrphanBlocks, c.Sessions, clitable.Bytes(c.ApproxBytes), st.CountersFrom)
	}
	fmt.Fprintf(w, "digests:  %s\n", st.Digests.Detail)
	if st.RouterDigests != nil {
		fmt.Fprintf(w, "routers:  %s\n", st.RouterDigests.Detail)
	}
	writeMismatches(w, st)
	for _, n := range st.Nodes {
		switch {
		case n.Error != "":
			fmt.Fprintf(w, "warning:  %s is unreachable: %s\n", n.ID, firstLine(n.Error))
		case n.WriteError != "":
			fmt.Fprintf(w, "warning:  %s refuses writes: %s\n", n.ID, n.WriteError)
		}
	}
	for _, m := range st.BlockSizeMismatches {
		fmt.Fprintf(w, "warning:  worker %s block size: %s\n", m.Worker, m.Detail)
	}
	return nil
}

// writeRouters lists the routers that follow the log, with their
// replica's applied index, lag, age and digest (nothing when none does).
func writeRouters(w io.Writer, routers []ctlview.Router) error {
	t := clitable.NewTab("ROUTER", "NODE", "APPLIED", "LAG", "HEARD", "DIGEST")
	rows := 0
	for _, r := range routers {
		if !r.Follows {
			continue
		}
		rows++
		if !r.Synced {
			t.Add(r.ID, r.Node, "-", "-", "-", "not in sync")
			continue
		}
		t.Add(r.ID, r.Node, r.AppliedIndex, r.LagEntries, clitable.Age(time.Duration(r.HeardAgeMs*1e6)), r.Digest)
	}
	if rows == 0 {
		return nil
	}
	if _, err := t.WriteTo(w); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
