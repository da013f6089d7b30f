package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/dirclient"
)

// Exit codes.
const (
	exitOK    = cli.ExitOK
	exitError = cli.ExitError
	exitUsage = cli.ExitUsage
)

// app is one invocation: the global options and the directory client.
type app struct {
	// out and errOut escape control characters (clitable.SafeWriter):
	// worker ids and errors come from the directory and must not act on
	// the operator's terminal; rawOut is stdout itself (watch's screen
	// clearing, and whether it is a terminal).
	out, errOut io.Writer
	rawOut      io.Writer
	getenv      func(string) string
	now         func() time.Time
	prog        *cli.Program

	directory     []string
	token         string
	tokenFile     string
	tlsOn         bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tlsInsecure   bool
	dialTimeout   time.Duration
	timeout       time.Duration
	output        string
	verbose       bool

	// groupFlags is --directory-group; groups the directory groups (one,
	// named default, for --directory), each with its client once dialled;
	// cur the one dir() returns (-1: none chosen, with several).
	groupFlags []cli.NamedList
	groups     []*dirGroup
	cur        int

	format clitable.Format
}

// usageErrorf returns a mistake on the command line: exit status 2 and a
// pointer to --help.
func usageErrorf(format string, args ...any) error { return cli.Usagef(format, args...) }

// run executes kvdirctl with args and returns the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	a := &app{out: clitable.SafeWriter(stdout), errOut: clitable.SafeWriter(stderr), rawOut: stdout, getenv: getenv, now: time.Now}
	root := a.rootCommand()
	_, err := a.prog.ExecuteC(ctx, root, args)
	for _, g := range a.groups {
		if g.client != nil {
			g.client.Close()
		}
	}
	if err != nil && !cli.IsUsage(err) {
		err = errors.New(describe(err, a))
	}
	return a.prog.Exit(err)
}

const rootLong = `kvdirctl is the operator CLI of kvdir, a KV-cache-aware routing control plane.

It talks to the directory's gRPC API (--directory, a list of node addresses
tried in turn: a node that does not answer is skipped) and, for "explain", to
the router's HTTP API (--router). It shows which worker holds a session's
prefix and how much of it, how loaded each worker is, whether the directory
cluster agrees with itself, and why the router would place a request where it
does; it also drains and expires workers, changes the cluster's membership and
takes snapshots.

Output is an aligned table by default; -o json and -o yaml are for scripts
(the same keys in both). status, workers and sessions refresh with --watch.

Every global flag has an environment variable: KVDIR_CTL_ and the flag's name
in capitals with '-' as '_' (--directory is KVDIR_CTL_DIRECTORY, --tls-ca is
KVDIR_CTL_TLS_CA); so do a few flags of commands (--router of explain). A
flag on the command line wins over the environment; each command's --help
lists its variables.

Exit status: 0 on success, 1 when the work fails (the directory or the
router unreachable, a refused change), 2 on a usage error.`

func (a *app) rootCommand() *cobra.Command {
	if a.prog == nil {
		a.prog = &cli.Program{Name: "kvdirctl", Env: "CTL", Getenv: a.getenv, Stdout: a.out, Stderr: a.errOut,
			// Before KVDIR_CTL_<FLAG>, kvdirctl read KVDIRCTL_<FLAG>.
			OldEnv: func(flag string) string { return "KVDIRCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }}
	}
	root := &cobra.Command{
		Use:   "kvdirctl",
		Short: "Operate a kvdir directory cluster and see where sessions' KV caches live",
		Long:  rootLong,
		Example: `  kvdirctl --directory 127.0.0.1:7001,127.0.0.1:7011,127.0.0.1:7021 status
  KVDIR_CTL_DIRECTORY=dir-0:7001 KVDIR_CTL_TOKEN_FILE=/etc/kvdir/router kvdirctl who-holds chat-7f3a
  kvdirctl workers -o json | jq '.workers[].id'`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setup(cmd)
		},
	}
	pf := root.PersistentFlags()
	pf.StringSliceVarP(&a.directory, "directory", "d", []string{"127.0.0.1:7001"},
		"gRPC addresses of directory nodes (host:port), comma-separated; tried in turn when one does not answer")
	pf.Var(cli.NamedLists(&a.groupFlags), "directory-group",
		"one directory group of several, as the router's flag: `NAME=HOST:PORT[,HOST:PORT...]`, repeated for each group (in the environment, groups separated by ';'); instead of --directory. Listings ask every group and add a GROUP column; a worker's command finds its group; members, snapshot and leader need a single group")
	pf.StringVar(&a.token, "token", "", "bearer token (router role for reads, admin role for changes); prefer --token-file or KVDIR_CTL_TOKEN, flags show in ps")
	pf.StringVar(&a.tokenFile, "token-file", "", "file holding the bearer token")
	pf.BoolVar(&a.tlsOn, "tls", false, "use TLS with the system's root certificates (implied by --tls-ca and --tls-cert)")
	pf.StringVar(&a.tlsCA, "tls-ca", "", "PEM file of the CA that signed the directory's certificates (enables TLS)")
	pf.StringVar(&a.tlsCert, "tls-cert", "", "PEM client certificate, for a directory that asks for one (with --tls-key)")
	pf.StringVar(&a.tlsKey, "tls-key", "", "PEM key of --tls-cert")
	pf.StringVar(&a.tlsServerName, "tls-server-name", "", "name to verify the directory's certificate against (default: the host of each address)")
	pf.BoolVar(&a.tlsInsecure, "tls-insecure-skip-verify", false, "do not verify the directory's certificate (testing only)")
	pf.DurationVar(&a.dialTimeout, "dial-timeout", dirclient.DefaultDialTimeout, "time allowed to connect to one node")
	pf.DurationVar(&a.timeout, "timeout", dirclient.DefaultCallTimeout, "time allowed for each call, failover to other nodes included")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "log failovers and retries to stderr (as --log-level debug)")

	root.AddCommand(
		a.statusCommand(),
		a.workersCommand(),
		a.sessionsCommand(),
		a.whoHoldsCommand(),
		a.matchCommand(),
		a.explainCommand(),
		a.drainCommand(),
		a.expireCommand(),
		a.membersCommand(),
		a.snapshotCommand(),
		a.leaderCommand(),
	)
	a.prog.SetupCobra(root)
	return root
}

// markEnv gives a command's local flag an environment variable.
func markEnv(fs *pflag.FlagSet, name string) { cli.MarkEnv(fs, name) }

// setup checks the global flags (the environment is applied before it).
func (a *app) setup(*cobra.Command) error {
	f, err := clitable.ParseFormat(a.output)
	if err != nil {
		return cli.Usage(fmt.Errorf("--output: %w", err))
	}
	a.format = f
	var addrs []string
	for _, d := range a.directory {
		if d = strings.TrimSpace(d); d != "" {
			addrs = append(addrs, d)
		}
	}
	if len(addrs) == 0 {
		return usageErrorf("--directory is empty: give at least one directory node's gRPC address (host:port)")
	}
	if err := checkAddrs("--directory", addrs); err != nil {
		return err
	}
	a.directory = addrs
	if err := a.parseGroups(addrs); err != nil {
		return err
	}
	if a.token != "" && a.tokenFile != "" {
		return usageErrorf("--token and --token-file are both set: give one")
	}
	if (a.tlsCert == "") != (a.tlsKey == "") {
		return usageErrorf("--tls-cert and --tls-key go together: give both or neither")
	}
	if a.timeout <= 0 || a.dialTimeout <= 0 {
		return usageErrorf("--timeout and --dial-timeout must be positive")
	}
	return nil
}

// dir returns the current directory group's client, creating it on first
// use.
func (a *app) dir() (*dirclient.Client, error) {
	if a.cur < 0 || a.cur >= len(a.groups) {
		return nil, usageErrorf("this command acts on one directory group, and %d are given (%s): give --directory, or a single --directory-group", len(a.groups), a.groupNames())
	}
	g := a.groups[a.cur]
	if g.client != nil {
		return g.client, nil
	}
	cfg := dirclient.Config{Addrs: g.addrs, DialTimeout: a.dialTimeout, CallTimeout: a.timeout}
	level := slog.LevelError + 4 // silent unless asked: errors are reported by the command
	switch {
	case a.prog.Source(cli.FlagLogLevel) != cli.FromDefault:
		level = a.prog.LogLevel()
	case a.verbose:
		level = slog.LevelDebug
	}
	cfg.Logger = cli.NewLogger(a.errOut, level, a.prog.JSONLogs())
	cfg.Token = a.token
	if a.tokenFile != "" {
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("read --token-file: %w", err)
		}
		cfg.Token = strings.TrimSpace(string(b))
		if cfg.Token == "" {
			return nil, fmt.Errorf("--token-file %s is empty", a.tokenFile)
		}
	}
	if a.tlsOn || a.tlsCA != "" || a.tlsCert != "" || a.tlsInsecure || a.tlsServerName != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: a.tlsServerName, InsecureSkipVerify: a.tlsInsecure}
		if a.tlsCA != "" {
			pem, err := os.ReadFile(a.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("read --tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", a.tlsCA)
			}
			tc.RootCAs = pool
		}
		if a.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(a.tlsCert, a.tlsKey)
			if err != nil {
				return nil, fmt.Errorf("load --tls-cert and --tls-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cfg.TLS = tc
	}
	c, err := dirclient.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("directory client: %w", err)
	}
	g.client = c
	return c, nil
}

// exactArgs is cobra.ExactArgs with a usage error that names the arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			for i, v := range args {
				if strings.TrimSpace(v) == "" {
					return usageErrorf("%s must not be empty", names[i])
				}
			}
			return nil
		}
		if len(names) == 0 {
			return usageErrorf("%s takes no arguments, got %q", cmd.Name(), args)
		}
		return usageErrorf("%s needs %d argument(s): %s; got %d", cmd.Name(), len(names), strings.Join(names, " "), len(args))
	}
}

// write renders doc in the chosen format, table through table.
func (a *app) write(w io.Writer, doc any, table func(io.Writer) error) error {
	return clitable.Write(w, a.format, doc, table)
}
