// Command directory runs one node of the kvdir directory: a member of a
// Raft-replicated (hashicorp/raft, BoltDB) record of which LLM-serving worker
// holds which KV-cache prefix. It serves the gRPC API (agent, directory and
// admin services) and HTTP (/metrics, /healthz, /readyz).
//
// Every setting is a flag, an environment variable (KVDIR_ and the flag's
// name in capitals, dashes as underscores) and a key of an optional YAML
// config file (--config); a flag beats the environment, which beats the
// file, which beats the default. Run it with --help for the list and an
// example of a three-node cluster on one machine.
//
// On SIGINT or SIGTERM the node hands over leadership if it leads, then
// stops; a second signal, a second or more after the first, abandons the
// shutdown. Exit status: 0 after a clean stop, 1 on an error, 2 on a usage
// error (bad flag, environment variable or config file).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvdir/kvdir/internal/node"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr, sigs))
}

// run is the whole command; it returns the exit status. The node stops at
// the first value received from sigs; one received a second or more later
// abandons the shutdown.
func run(args, env []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	l, err := loadSettings(args, env)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": ")
		fmt.Fprintf(stderr, "directory: %s\nRun 'directory --help' for the list of flags.\n", msg)
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitError
	}
	switch {
	case l.help:
		writeHelp(stdout)
		return exitOK
	case l.version:
		fmt.Fprintf(stdout, "kvdir directory %s (%s)\n", version, runtime.Version())
		return exitOK
	}
	s := l.s
	log := newLogger(stderr, s)
	slog.SetDefault(log)
	for _, w := range l.warnings {
		log.Warn(w)
	}
	cfg, err := s.nodeConfig(log)
	if err != nil {
		fmt.Fprintf(stderr, "directory: %s\n", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return exitUsage
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

	dataDir, err := filepath.Abs(s.dataDir)
	if err != nil {
		dataDir = s.dataDir
	}
	log.Info("starting kvdir directory", "version", version, "node", s.nodeID, "data_dir", dataDir)
	n, err := node.New(cfg)
	if err != nil {
		log.Error("could not start the node", "err", fmt.Errorf("start node %s: %w", s.nodeID, err))
		return exitError
	}
	httpAddr := n.HTTPAddr()
	if httpAddr == "" {
		httpAddr = "off"
	}
	log.Info("listening",
		"raft", s.raftAddr, "raft_advertise", s.raftAdvertiseOrAddr(),
		"api", n.APIAddr(), "http", httpAddr, "tls", cfg.TLS != nil, "auth", cfg.Tokens != node.Tokens{})

	sig := <-sigs
	first := time.Now()
	log.Info("stopping: leadership is handed over first if this node leads", "signal", sig.String(), "timeout", s.shutdownTimeout.String())
	ctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Shutdown(ctx) }()
	finished := func(err error) int {
		if err != nil {
			log.Error("shutdown failed", "err", fmt.Errorf("shut down node %s: %w", s.nodeID, err))
			return exitError
		}
		log.Info("stopped cleanly")
		return exitOK
	}
	// Shutdown bounds its gRPC and HTTP draining by ctx, not the Raft
	// steps: give those a little longer before giving up.
	grace := time.NewTimer(s.shutdownTimeout + 5*time.Second)
	defer grace.Stop()
	for {
		select {
		case err := <-done:
			return finished(err)
		case sig := <-sigs:
			// A terminal's Ctrl-C reaches the whole process group, so under
			// `go run` or `timeout` the same stop arrives twice at once:
			// only a signal sent later abandons the shutdown.
			if time.Since(first) < time.Second {
				log.Debug("ignoring a repeated signal", "signal", sig.String())
				continue
			}
			select {
			case err := <-done:
				return finished(err)
			default:
			}
			log.Error("second signal: exiting without finishing the shutdown", "signal", sig.String())
			return exitError
		case <-grace.C:
			log.Error("shutdown did not finish in time", "timeout", s.shutdownTimeout.String())
			return exitError
		}
	}
}

func newLogger(w io.Writer, s *settings) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.logLevel}
	if s.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
