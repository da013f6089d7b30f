package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// devFlags configure kvbench dev.
type devFlags struct {
	engines, routers int
	model, profile   string
	timeScale        string
	dataDir          string
	matchTimeout     string
}

// fleetMatchTimeout is the directory look-up deadline kvbench gives the
// routers of a fleet it runs on one machine: the router's 5 ms default is
// for a directory on machines of its own, and with every process of the
// fleet sharing a few cores a look-up often takes longer, so the request
// would be placed by the fallback policy instead.
const fleetMatchTimeout = "25ms"

func newDev() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local fleet (3 directory nodes, engine simulators with agents, a router) until Ctrl-C",
		Long: `Builds the binaries and starts, on loopback ports chosen free, a 3-node directory
cluster, --engines engine simulators each with its agent, and --routers routers; waits
until every worker is registered and every router is ready; prints the router URL, the
directory addresses and an export line for kvdirctl and the docs' commands; then runs
until Ctrl-C (or SIGTERM), and stops every process it started: routers, agents,
engines, then the directory. ` + "`make dev`" + ` runs it.`,
		Example: `  kvbench dev
  kvbench dev --engines 4 --time-scale 0.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.engines, "engines", 2, "engine simulators, each with its agent")
	fl.IntVar(&f.routers, "routers", 1, "routers")
	fl.StringVar(&f.model, "model", "llama3-8b", "model the engines serve (and the agents hash for)")
	fl.StringVar(&f.profile, "profile", "llama3-8b", "engines' timing profile and the routers' cost model")
	fl.StringVar(&f.timeScale, "time-scale", "1", "engines' time scale (1 = the modelled H200's real time; 0.1 = ten times faster)")
	fl.StringVar(&f.matchTimeout, "match-timeout", fleetMatchTimeout, "the routers' directory look-up deadline (the router's default is 5ms; a machine running the whole fleet needs more)")
	fl.StringVar(&f.dataDir, "data-dir", "", "folder for the binaries and the directory's data (default: a new temporary folder, removed at the end)")
	return cmd
}

func runDev(ctx context.Context, out io.Writer, f devFlags) error {
	if f.engines < 1 || f.routers < 1 {
		return fmt.Errorf("--engines and --routers must be at least 1")
	}
	dir := f.dataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "kvdir-dev-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kvdir dev: building and starting 3 directory nodes, %d engines with agents, %d router(s) in %s\n",
		f.engines, f.routers, dir)
	fl, err := fleet.Start(ctx, fleet.Config{
		Dir: dir, Engines: f.engines, Routers: f.routers, Model: f.model,
		EngineArgs: []string{"--profile", f.profile, "--time-scale", f.timeScale},
		RouterArgs: []string{"--profile", f.profile, "--match-timeout", f.matchTimeout},
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(os.Stderr, "kvdir dev: stopping routers, agents, engines, directory")
		fl.Stop()
		fmt.Fprintln(os.Stderr, "kvdir dev: stopped")
	}()

	var b strings.Builder
	fmt.Fprintf(&b, "kvdir dev fleet is up (model %s, profile %s, time scale %s). Ctrl-C stops it.\n\n", f.model, f.profile, f.timeScale)
	for i, r := range fl.Routers {
		fmt.Fprintf(&b, "%-13s %s   (OpenAI API, /v1/kvdir/explain, /metrics)\n", fmt.Sprintf("router %d", i), r.URL)
	}
	for _, n := range fl.Directory.Nodes {
		fmt.Fprintf(&b, "%-13s gRPC %s   http://%s/metrics\n", "directory "+n.ID, n.API, n.HTTP)
	}
	for _, e := range fl.Engines {
		fmt.Fprintf(&b, "%-13s %s\n", "engine "+e.WorkerID, e.URL)
	}
	fmt.Fprintf(&b, "%-13s %s\n\n", "data", dir)
	fmt.Fprintf(&b, "In another shell:\n\n  export ROUTER=%s KVDIR_CTL_DIRECTORY=%s KVDIR_CTL_ROUTER=%s\n",
		fl.Routers[0].URL, fl.DirectoryAddrs(), fl.Routers[0].URL)
	b.WriteString("  ./bin/kvdirctl status\n")
	b.WriteString("  curl -s -D - $ROUTER/v1/chat/completions -H 'Content-Type: application/json' \\\n")
	b.WriteString("    -H 'X-Session-Id: demo-1' -d @docs/examples/turn1.json\n")
	fmt.Fprint(out, b.String())

	<-ctx.Done()
	fmt.Fprintln(os.Stderr)
	return nil
}
