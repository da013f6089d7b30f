package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func (a *app) sessionView(r *kvdirv1.SessionRecord) ctlview.Session {
	v := ctlview.Session{ID: r.SessionId, Worker: r.WorkerId, PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens,
		Blocks: r.Blocks, BlockSize: r.BlockSize, Tail: fmt.Sprintf("%016x", r.Tail)}
	if r.TimeUnixNano > 0 {
		t := time.Unix(0, r.TimeUnixNano)
		v.LastSeen = t.UTC().Format(time.RFC3339Nano)
		age := clitable.Float(a.now().Sub(t).Seconds())
		v.AgeSeconds = &age
	}
	return v
}

// sessionAge is how long ago the session was last seen, as a table shows it.
func sessionAge(v ctlview.Session) string {
	if v.AgeSeconds == nil {
		return "-"
	}
	return clitable.Age(time.Duration(float64(*v.AgeSeconds) * float64(time.Second)))
}

func (a *app) sessionsCommand() *cobra.Command {
	var (
		w      watchOpts
		prefix string
		worker string
		limit  uint32
	)
	cmd := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session"},
		Short:   "Recorded sessions: their worker, cached / prompt tokens of the latest turn, last seen",
		Long: `sessions lists the sessions the router recorded, most recent first: the worker
the latest turn went to, that turn's prompt tokens and how many of them the
engine served from its prefix cache (CACHED/PROMPT, as the engine reported
it), the length of the turn's chain in blocks, and how long ago it was
recorded. Filter by session-id prefix (--prefix) and by worker (--worker).

"kvdirctl who-holds SESSION" shows where a session's prefix lives now.`,
		Example: `  kvdirctl sessions
  kvdirctl sessions --prefix user-42- --worker enginesim-0
  kvdirctl sessions -o json --limit 1000`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.watchLoop(cmd, w, func(ctx context.Context, out io.Writer) error {
				doc := ctlview.SessionList{Sessions: []ctlview.Session{}}
				err := a.eachGroup(func(g *dirGroup) error {
					c, err := a.dir()
					if err != nil {
						return err
					}
					resp, err := c.ListSessions(ctx, prefix, worker, limit)
					if err != nil {
						return err
					}
					doc.Total += resp.Total
					if doc.Read.Node == "" {
						doc.Read = readOf(resp.Read) // the first group's
					}
					for _, r := range resp.Sessions {
						v := a.sessionView(r)
						if a.multiGroup() {
							v.Group = g.name
						}
						doc.Sessions = append(doc.Sessions, v)
					}
					return nil
				})
				if err != nil {
					return err
				}
				return a.write(out, doc, func(out io.Writer) error {
					if len(doc.Sessions) == 0 {
						fmt.Fprintf(out, "No sessions match (%d recorded in all). Sessions are recorded by the router for requests with a session id.\n", doc.Total)
						return nil
					}
					cols := []string{"SESSION", "WORKER", "CACHED/PROMPT", "HIT", "BLOCKS", "LAST-SEEN"}
					if a.multiGroup() {
						cols = append([]string{"GROUP"}, cols...)
					}
					t := clitable.NewTab(cols...)
					for _, v := range doc.Sessions {
						row := []any{v.ID, v.Worker, fmt.Sprintf("%d/%d", v.CachedTokens, v.PromptTokens),
							clitable.Percent(float64(v.CachedTokens), float64(v.PromptTokens)), v.Blocks, sessionAge(v)}
						if a.multiGroup() {
							row = append([]any{v.Group}, row...)
						}
						t.Add(row...)
					}
					if _, err := t.WriteTo(out); err != nil {
						return err
					}
					if uint64(len(doc.Sessions)) < doc.Total && prefix == "" && worker == "" {
						fmt.Fprintf(out, "(%d of %d recorded sessions; --limit shows more)\n", len(doc.Sessions), doc.Total)
					}
					return nil
				})
			})
		},
	}
	w.addFlags(cmd)
	cmd.Flags().StringVar(&prefix, "prefix", "", "only sessions whose id starts with this")
	cmd.Flags().StringVar(&worker, "worker", "", "only sessions whose latest turn went to this worker")
	cmd.Flags().Uint32Var(&limit, "limit", 100, "at most this many sessions, most recent first (directory maximum 10000)")
	cmd.RegisterFlagCompletionFunc("worker", a.completeWorkers)
	return cmd
}
