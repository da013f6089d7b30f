// Command directory runs one node of the kvdir directory: a member of a
// Raft-replicated (hashicorp/raft, BoltDB) record of which LLM-serving worker
// holds which KV-cache prefix. It serves the gRPC API (agent, directory and
// admin services) and HTTP (/metrics, /healthz, /readyz).
//
// Every setting is a flag, an environment variable (KVDIR_DIRECTORY_ and
// the flag's name in capitals, dashes as underscores) and a key of an
// optional YAML config file (--config); a flag beats the environment, which
// beats the file, which beats the default (see internal/cli). The defaults
// and the checks of the node's settings are internal/node's
// (node.DefaultConfig, node.Config.Validate). Run it with --help for the
// list and an example of a three-node cluster on one machine.
//
// On SIGINT or SIGTERM the node hands over leadership if it leads, then
// stops; a second signal, a second or more after the first, abandons the
// shutdown. Exit status: 0 after a clean stop, 1 on an error, 2 on a usage
// error (bad flag, environment variable or config file), 130 when a second
// signal abandoned the shutdown.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/node"
)

// Exit statuses.
const (
	exitOK          = cli.ExitOK
	exitError       = cli.ExitError
	exitUsage       = cli.ExitUsage
	exitInterrupted = cli.ExitInterrupted
)

func main() {
	sigs, stop := cli.Notify()
	code := run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr, sigs)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit status. The node stops at
// the first value received from sigs; one received a second or more later
// abandons the shutdown.
func run(args, env []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	l, err := loadSettingsTo(args, env, stdout, stderr)
	p := l.s.prog
	switch {
	case err != nil:
		return p.Exit(err)
	case l.help:
		return p.Exit(cli.ErrHelp)
	case l.version:
		return p.Exit(cli.ErrVersion)
	}
	s := l.s
	log := p.Logger()
	slog.SetDefault(log)
	for _, w := range l.warnings {
		log.Warn(w)
	}
	cfg, err := s.nodeConfig(log)
	if err != nil {
		return p.Exit(err)
	}
	if cfg.TestClockOffset, err = testClockOffset(env); err != nil {
		return p.Exit(err)
	}
	if cfg.TestClockOffset != 0 {
		log.Warn("test hook: this node's clock is offset (fault injection; never in production)",
			"variable", testClockOffsetVar, "offset", cfg.TestClockOffset)
	}
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			log.Warn("register runtime metrics", "err", err)
		}
	}
	cfg.Registerer = reg

	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		dataDir = cfg.DataDir
	}
	log.Info("starting kvdir directory", "version", cli.Version(), "commit", cli.Commit(), "node", cfg.ID, "data_dir", dataDir)
	n, err := node.New(cfg)
	if err != nil {
		var ue *node.UndecodableEntryError
		if errors.As(err, &ue) {
			log.Error("refusing to start: this node stopped at a log entry it cannot decode, and would stop there again",
				"index", ue.Index, "term", ue.Term, "err", ue.Err, "fix", skipAdvice(ue.Index))
			return exitError
		}
		log.Error("could not start the node", "err", fmt.Errorf("start node %s: %w", cfg.ID, err))
		return exitError
	}
	httpAddr := n.HTTPAddr()
	if httpAddr == "" {
		httpAddr = "off"
	}
	log.Info("listening",
		"raft", cfg.RaftAddr, "raft_advertise", s.raftAdvertiseOrAddr(),
		"api", n.APIAddr(), "http", httpAddr, "tls", cfg.TLS != nil, "raft_tls", cfg.RaftTLS != nil, "auth", cfg.Tokens != node.Tokens{})

	watch := cli.WatchSignals(context.Background(), sigs)
	defer watch.Stop()
	failed := false
	select {
	case <-watch.Context().Done():
		log.Info("stopping: leadership is handed over first if this node leads", "signal", watch.First().String(), "timeout", s.shutdownTimeout.String())
	case <-n.Failed():
		failed = true
		var ue *node.UndecodableEntryError
		errors.As(n.Err(), &ue)
		log.Error("stopping: a committed log entry cannot be decoded, so this node cannot apply the log past it",
			"index", ue.Index, "term", ue.Term, "err", ue.Err, "fix", skipAdvice(ue.Index))
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Shutdown(ctx) }()
	finished := func(err error) int {
		if err != nil {
			log.Error("shutdown failed", "err", fmt.Errorf("shut down node %s: %w", cfg.ID, err))
			return exitError
		}
		if failed {
			log.Info("stopped after the undecodable log entry")
			return exitError
		}
		log.Info("stopped cleanly")
		return exitOK
	}
	// Shutdown bounds its gRPC and HTTP draining by ctx, not the Raft
	// steps: give those a little longer before giving up.
	grace := time.NewTimer(s.shutdownTimeout + 5*time.Second)
	defer grace.Stop()
	select {
	case err := <-done:
		return finished(err)
	case <-watch.Forced():
		select {
		case err := <-done:
			return finished(err)
		default:
		}
		log.Error("second signal: exiting without finishing the shutdown", "signal", watch.Second().String())
		return exitInterrupted
	case <-grace.C:
		log.Error("shutdown did not finish in time", "timeout", s.shutdownTimeout.String())
		return exitError
	}
}

// skipAdvice tells the operator how to get past the undecodable entry at
// index.
func skipAdvice(index uint64) string {
	return fmt.Sprintf("if it is not wanted (every node stops at it: an entry from outside the cluster, such as a forged Raft message), "+
		"restart every node that stopped there with --skip-undecodable-entry %d to apply it as a no-op; "+
		"if a newer build wrote it, run that build here instead (see the directory's README)", index)
}

// testClockOffsetVar is the fault-injection hook of node.Config.TestClockOffset:
// a duration (e.g. "+5m", "-90s") by which this node's clock reads off. It
// is read from the environment only, never a flag, and named outside the
// KVDIR_DIRECTORY_ variables so that no configuration sets it by mistake.
const testClockOffsetVar = "KVDIR_TEST_DIRECTORY_CLOCK_OFFSET"

// testClockOffset reads testClockOffsetVar from env ("KEY=value" items).
func testClockOffset(env []string) (time.Duration, error) {
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k != testClockOffsetVar || v == "" {
			continue
		}
		d, err := time.ParseDuration(strings.TrimPrefix(v, "+"))
		if err != nil {
			return 0, cli.Usagef("%s: %v", testClockOffsetVar, err)
		}
		return d, nil
	}
	return 0, nil
}
