package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/node"
)

// settings is the command's configuration: the node's, bound to the flags,
// and what only the command line knows (files to read, the stop timeout).
type settings struct {
	prog *cli.Program
	cfg  node.Config

	shutdownTimeout        time.Duration
	tlsCert, tlsKey, tlsCA string
	insecureRaft           bool
	skipEntries            []string

	// tokenRefs are the flags of each role's token and token file;
	// resolve merges each pair into tokens[role].
	tokenRefs []tokenRef
	tokens    map[string]string
	// credentialsFile is --agent-credentials; the bounds below are the
	// flags' values, where 0 means no bound.
	credentialsFile                      string
	maxWorkersPerCred, maxStreamsPerCred int
	workerBlockQuota                     int64
}

type tokenRef struct {
	role      string
	tok, file *string
}

var roles = []string{"agent", "router", "admin"}

// newSettings declares the flags, with the node's defaults, on a new
// program.
func newSettings(env []string, stdout, stderr io.Writer) *settings {
	s := &settings{cfg: node.DefaultConfig(), shutdownTimeout: node.DefaultShutdownTimeout,
		tokens:            map[string]string{},
		maxWorkersPerCred: node.DefaultMaxWorkersPerCredential, maxStreamsPerCred: node.DefaultMaxStreamsPerCredential,
		workerBlockQuota: node.DefaultWorkerBlockQuota}
	lookup := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			lookup[k] = v
		}
	}
	p := &cli.Program{
		Name: "directory", Env: "DIRECTORY", ConfigFile: true,
		Summary: helpSummary, Usage: "directory --node-id ID [flags]", Examples: helpExamples, Notes: helpNotes,
		Getenv: func(k string) string { return lookup[k] }, Environ: func() []string { return env },
		Stdout: stdout, Stderr: stderr,
		// Before KVDIR_DIRECTORY_<FLAG>, the directory read KVDIR_<FLAG>.
		OldEnv: func(flag string) string { return "KVDIR_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) },
	}
	s.prog = p
	c := &s.cfg
	fs := p.Flags()

	p.Group("Node")
	fs.StringVar(&c.ID, "node-id", "", "this node's Raft server id, unique in the cluster (required; letters, digits, '.', '_', '-')")
	fs.StringVar(&c.RaftAddr, "raft-addr", c.RaftAddr, "address the Raft transport binds (a fixed port: other members dial it)")
	fs.StringVar(&c.RaftAdvertise, "raft-advertise", "", "Raft address other members dial (default: --raft-addr; required when --raft-addr binds all interfaces)")
	fs.StringVar(&c.APIAddr, "api-addr", c.APIAddr, "address the gRPC API listens on (port 0 picks a free port)")
	fs.StringVar(&c.APIAdvertise, "api-advertise", "", "gRPC address other nodes and clients dial (default: the address listened on)")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address serving /metrics, /healthz and /readyz (\"off\" or empty disables it)")
	fs.DurationVar(&c.HTTPIdleTimeout, "http-idle-timeout", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection to --http-addr is kept")
	fs.BoolVar(&c.Pprof, "pprof", false, "also serve Go's runtime profiles under /debug/pprof/ on --http-addr (unauthenticated, like /metrics: for profiling, not for an exposed address)")
	fs.StringVar(&c.DataDir, "data-dir", "", "`DIR` for raft.db (Raft log, BoltDB) and snapshots/ (default: kvdir-data/NODE_ID)")
	cli.SetPlaceholder(fs, "node-id", "ID")
	for _, n := range []string{"raft-addr", "raft-advertise", "api-addr", "api-advertise", "http-addr"} {
		cli.SetPlaceholder(fs, n, "HOST:PORT")
	}

	p.Group("Cluster")
	fs.BoolVar(&c.Bootstrap, "bootstrap", false, "start a new single-member cluster when the data directory is empty")
	fs.Var(cli.StringMap(&c.InitialCluster), "initial-cluster",
		"start a new cluster of these members (`ID=HOST:PORT,...`, id=raft address) when the data directory is empty; give every member the same list")
	fs.Var(cli.StringList(&c.Join), "join", "API addresses (`HOST:PORT,...`) of existing members to ask to add this node (when its data directory is empty)")

	p.Group("Workers and sessions")
	fs.Var(cli.StringList(&c.Models), "models",
		"the models this directory group serves (`MODEL,...`; default: every model). A worker of another model is refused at registration, naming this group's models: run several groups side by side, each with its own --models, and give the routers one --directory-group each")
	fs.Var(cli.PositiveDuration(&c.Lease), "lease", "how long a worker may go without a heartbeat before the leader expires it (at least 100ms)")
	fs.Var(cli.PositiveDuration(&c.MaxStaleness), "max-staleness", "a follower that has not heard from a leader for this long refuses reads, so clients use a node that has")
	fs.Var(cli.PositiveDuration(&c.LoadInterval), "load-interval", "how often the leader commits the loads gathered from heartbeats")
	fs.Var(cli.PositiveDuration(&c.SessionTTL), "session-ttl", "forget sessions not recorded for this long (at least 1s)")
	fs.Var(cli.PositiveInt(&c.FSM.MaxSessions), "max-sessions", "most sessions kept; the least recently recorded go first")
	fs.Var(cli.PositiveInt(&c.FSM.MaxGoneWorkers), "max-gone-workers", "most records kept of expired and deregistered workers")

	p.Group("Limits")
	fs.Var(cli.PositiveInt(&c.FSM.MaxBatchEvents), "max-batch-events", "most events in one published batch")
	fs.Var(cli.PositiveInt(&c.FSM.MaxBatchBlocks), "max-batch-blocks", "most blocks in one published batch")
	fs.Var(cli.PositiveInt(&c.FSM.Index.MaxWorkers), "max-workers", "most distinct workers the index holds")
	fs.Var(cli.PositiveInt(&c.FSM.Index.MaxChain), "max-chain", "longest chain accepted, in blocks")
	fs.Var(cli.PositiveInt(&c.FSM.Index.MaxOrphanBlocks), "max-orphan-blocks", "most blocks kept in out-of-order pieces waiting for their parent")
	fs.Int64Var(&s.workerBlockQuota, "worker-block-quota", s.workerBlockQuota,
		"most blocks one worker may hold in the index (0: no bound); blocks past it are not stored, counted on the worker and acknowledged. The leader stamps it into each registration")
	fs.IntVar(&s.maxWorkersPerCred, "max-workers-per-credential", s.maxWorkersPerCred,
		"most live workers one agent credential may own; Register past it is refused (0: no bound)")
	fs.IntVar(&s.maxStreamsPerCred, "max-streams-per-credential", s.maxStreamsPerCred,
		"most WatchWorkers, Follow and Share streams one credential or role may hold on this node (0: no bound, of those and of Publish streams); an agent credential's Publish streams are bounded apart, at 4 per worker of --max-workers-per-credential")
	cli.SetPlaceholder(fs, "worker-block-quota", "N")
	cli.SetPlaceholder(fs, "max-workers-per-credential", "N")
	cli.SetPlaceholder(fs, "max-streams-per-credential", "N")
	fs.Var(cli.PositiveInt(&c.FollowFeedEntries), "follow-feed-entries",
		"most recently applied log entries kept in memory for Follow streams (routers' --follow-log); a follower further behind is sent a fresh snapshot")

	p.Group("Raft")
	fs.Var(cli.PositiveDuration(&c.SnapshotInterval), "snapshot-interval", "how often Raft checks whether to take a snapshot")
	fs.Var(cli.PositiveUint64(&c.SnapshotThreshold), "snapshot-threshold", "new log entries that make a snapshot")
	fs.Var(cli.PositiveUint64(&c.TrailingLogs), "trailing-logs", "log entries kept after a snapshot")
	fs.Var(cli.PositiveDuration(&c.HeartbeatTimeout), "heartbeat-timeout", "Raft heartbeat timeout (at least 10ms)")
	fs.Var(cli.PositiveDuration(&c.ElectionTimeout), "election-timeout", "Raft election timeout (at least the heartbeat timeout)")
	fs.Var(cli.PositiveDuration(&c.ApplyTimeout), "apply-timeout", "how long a write may wait to be committed")
	fs.Var(cli.PositiveDuration(&s.shutdownTimeout), "shutdown-timeout", "how long a stop (SIGINT, SIGTERM) may take, handing over leadership included")

	fs.Var(cli.StringList(&s.skipEntries), "skip-undecodable-entry",
		"log indexes (`INDEX,...`) whose entries are applied as no-ops if they cannot be decoded, instead of stopping the node: the way past an entry every node stopped at (give each such node the same list)")

	p.Group("Security")
	fs.StringVar(&s.tlsCert, "tls-cert", "", "PEM certificate `FILE` of this member (with --tls-key); enables TLS: the API serves it, and Raft runs over mutual TLS with it")
	fs.StringVar(&s.tlsKey, "tls-key", "", "PEM private key `FILE` of --tls-cert")
	fs.StringVar(&s.tlsCA, "tls-ca", "", "PEM CA bundle `FILE` that signed the members' certificates: verifies both ends of every Raft connection, and the members when forwarding and joining (required with --tls-cert unless --insecure-raft; then the default is the system roots)")
	fs.BoolVar(&s.insecureRaft, "insecure-raft", false, "with TLS on, keep Raft on plain TCP without peer authentication (not recommended: anyone who reaches --raft-addr can rewrite the directory; warned about at every start)")
	for _, r := range roles {
		tok, file := new(string), new(string)
		fs.StringVar(tok, r+"-token", "", "bearer `TOKEN` of the "+r+" role (prefer --"+r+"-token-file or "+p.EnvVar(r+"-token")+": flags show in ps)")
		fs.StringVar(file, r+"-token-file", "", "`FILE` holding the "+r+" role's bearer token (surrounding whitespace is ignored)")
		s.tokenRefs = append(s.tokenRefs, tokenRef{role: r, tok: tok, file: file})
	}
	fs.StringVar(&s.credentialsFile, "agent-credentials", "",
		"`FILE` of agent credentials, one a line: NAME TOKEN PATTERN[,PATTERN...] ('#' comments); each token grants the agent role for the worker ids its path.Match patterns match, and owns the workers it registers (--agent-token is one more, named agent, for every id)")
	return s
}

// loaded is what loadSettings found to do.
type loaded struct {
	s        *settings
	help     bool
	version  bool
	warnings []string
}

// loadSettings merges, for every flag, flag > environment > config file >
// default, then checks the result. env holds "KEY=value" entries, as
// os.Environ returns them. Its errors are usage errors (cli.IsUsage).
func loadSettings(args, env []string) (*loaded, error) {
	return loadSettingsTo(args, env, io.Discard, io.Discard)
}

func loadSettingsTo(args, env []string, stdout, stderr io.Writer) (*loaded, error) {
	s := newSettings(env, stdout, stderr)
	err := s.prog.Parse(args)
	switch {
	case errors.Is(err, cli.ErrHelp):
		return &loaded{s: s, help: true}, nil
	case errors.Is(err, cli.ErrVersion):
		return &loaded{s: s, version: true}, nil
	case err != nil:
		return &loaded{s: s}, err
	}
	warnings, err := s.resolve()
	l := &loaded{s: s, warnings: append(s.prog.Warnings(), warnings...)}
	if err != nil {
		return l, cli.Usage(err)
	}
	return l, nil
}

// flagOf names the flag of each node.Config field whose mistakes
// node.Config.Validate reports.
var flagOf = map[string]string{
	"ID": "node-id", "RaftAddr": "raft-addr", "RaftAdvertise": "raft-advertise", "APIAddr": "api-addr",
	"APIAdvertise": "api-advertise", "HTTPAddr": "http-addr", "DataDir": "data-dir",
	"Bootstrap": "bootstrap", "InitialCluster": "initial-cluster", "Join": "join",
	"Lease": "lease", "MaxStaleness": "max-staleness", "LoadInterval": "load-interval", "SessionTTL": "session-ttl",
	"SnapshotInterval": "snapshot-interval", "HeartbeatTimeout": "heartbeat-timeout", "ElectionTimeout": "election-timeout",
	"FSM.MaxSessions": "max-sessions", "FSM.MaxGoneWorkers": "max-gone-workers", "FSM.MaxBatchEvents": "max-batch-events",
	"FSM.MaxBatchBlocks": "max-batch-blocks", "FSM.Index.MaxWorkers": "max-workers", "FSM.Index.MaxChain": "max-chain",
	"FSM.Index.MaxOrphanBlocks": "max-orphan-blocks", "FollowFeedEntries": "follow-feed-entries", "RaftTLS": "tls-cert",
	"SkipUndecodableEntries": "skip-undecodable-entry", "Tokens": "agent-token(-file), --router-token(-file) and --admin-token(-file)",
	"AgentCredentials": "agent-credentials", "MaxWorkersPerCredential": "max-workers-per-credential",
	"MaxStreamsPerCredential": "max-streams-per-credential", "WorkerBlockQuota": "worker-block-quota",
}

// flagError rewrites a node.FieldError in the flags' names.
func (s *settings) flagError(err error) error {
	var fe *node.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	name := func(field string) string {
		if f, ok := flagOf[field]; ok {
			return "--" + f
		}
		return field
	}
	subject := name(fe.Field)
	if fe.With != "" {
		subject += " and " + name(fe.With)
	}
	msg := fmt.Sprintf("%s: %s", subject, fe.Msg)
	if fe.Field == "ID" && s.cfg.ID == "" {
		msg += ": set --node-id or " + s.prog.EnvVar("node-id")
	}
	return errors.New(msg)
}

// resolve reads token files, fills derived defaults and checks that the
// settings make sense together (node.Config.Validate, and the files the
// command line names).
func (s *settings) resolve() (warnings []string, err error) {
	c := &s.cfg
	for _, p := range []*string{&c.ID, &c.RaftAddr, &c.RaftAdvertise, &c.APIAddr, &c.APIAdvertise, &c.HTTPAddr, &c.DataDir, &s.tlsCert, &s.tlsKey, &s.tlsCA} {
		*p = strings.TrimSpace(*p)
	}
	if c.HTTPAddr == "off" {
		c.HTTPAddr = ""
	}
	if c.Pprof && c.HTTPAddr == "" {
		warnings = append(warnings, "--pprof has no effect with --http-addr off: the profiles are served on --http-addr")
	}
	if c.DataDir == "" && c.ID != "" {
		c.DataDir = filepath.Join("kvdir-data", c.ID)
	}
	if c.APIAdvertise == "" && node.WildcardHost(c.APIAddr) {
		warnings = append(warnings, fmt.Sprintf("--api-addr %s binds every interface and --api-advertise is not set: other members will be told 127.0.0.1, which only works on one machine", c.APIAddr))
	}
	if !c.Bootstrap && len(c.InitialCluster) == 0 && len(c.Join) == 0 {
		warnings = append(warnings, "none of --bootstrap, --initial-cluster or --join is set: a node without state will wait to be added by a member")
	}

	// TLS.
	switch {
	case s.tlsKey != "" && s.tlsCert == "":
		return warnings, errors.New("--tls-key is set without --tls-cert: give both to serve TLS")
	case s.tlsCert != "" && s.tlsKey == "":
		return warnings, errors.New("--tls-cert is set without --tls-key: give both to serve TLS")
	case s.tlsCA != "" && s.tlsCert == "":
		return warnings, errors.New("--tls-ca is set without --tls-cert and --tls-key: members dial each other with TLS only when they serve it")
	case s.tlsCert != "" && s.tlsCA == "" && !s.insecureRaft:
		return warnings, errors.New("--tls-cert is set without --tls-ca: Raft runs over mutual TLS with TLS on and needs the CA that signed every member's certificate; give --tls-ca (or --insecure-raft to keep Raft on plain TCP)")
	}
	switch {
	case s.insecureRaft && s.tlsCert == "":
		warnings = append(warnings, "--insecure-raft has no effect without --tls-cert: Raft is on plain TCP anyway")
	case s.insecureRaft:
		warnings = append(warnings, fmt.Sprintf("--insecure-raft: Raft runs on plain TCP without peer authentication; anyone who reaches %s can rewrite the directory and stop every node, role tokens or not", c.RaftAddr))
	}
	c.SkipUndecodableEntries = nil
	for _, e := range s.skipEntries {
		i, err := strconv.ParseUint(strings.TrimSpace(e), 10, 64)
		if err != nil || i == 0 {
			return warnings, fmt.Errorf("--skip-undecodable-entry: %q is not a log index (a number from 1 up)", e)
		}
		c.SkipUndecodableEntries = append(c.SkipUndecodableEntries, i)
	}

	// Tokens: of each role's pair, the one from the higher source wins.
	for _, t := range s.tokenRefs {
		tok, file := t.role+"-token", t.role+"-token-file"
		ft, ff := s.prog.Source(tok), s.prog.Source(file)
		*t.tok, *t.file = strings.TrimSpace(*t.tok), strings.TrimSpace(*t.file)
		switch {
		case *t.tok == "" || *t.file == "":
		case ft == ff:
			return warnings, fmt.Errorf("--%s and --%s are both set (%s): give one", tok, file, s.prog.Describe(tok))
		case ft > ff:
			*t.file = ""
		default:
			*t.tok = ""
		}
		s.tokens[t.role] = *t.tok
		if *t.file != "" {
			v, warn, err := readToken(*t.file)
			if err != nil {
				return warnings, fmt.Errorf("--%s: %w", file, err)
			}
			if warn != "" {
				warnings = append(warnings, fmt.Sprintf("--%s: %s", file, warn))
			}
			s.tokens[t.role] = v
		}
	}
	c.Tokens = node.Tokens{Agent: s.tokens["agent"], Router: s.tokens["router"], Admin: s.tokens["admin"]}
	c.AgentCredentials = nil
	if f := strings.TrimSpace(s.credentialsFile); f != "" {
		creds, warn, err := readCredentials(f)
		if err != nil {
			return warnings, fmt.Errorf("--agent-credentials: %w", err)
		}
		if warn != "" {
			warnings = append(warnings, "--agent-credentials: "+warn)
		}
		c.AgentCredentials = creds
	}
	for _, b := range []struct {
		flag string
		v    int64
		to   func(int64)
	}{
		{"max-workers-per-credential", int64(s.maxWorkersPerCred), func(v int64) { c.MaxWorkersPerCredential = int(v) }},
		{"max-streams-per-credential", int64(s.maxStreamsPerCred), func(v int64) { c.MaxStreamsPerCredential = int(v) }},
		{"worker-block-quota", s.workerBlockQuota, func(v int64) { c.WorkerBlockQuota = v }},
	} {
		switch {
		case b.v < 0:
			return warnings, fmt.Errorf("--%s: %d is negative (0 means no bound)", b.flag, b.v)
		case b.v == 0:
			b.to(node.Unlimited)
		default:
			b.to(b.v)
		}
	}
	authOn := c.Tokens != (node.Tokens{}) || len(c.AgentCredentials) > 0
	if !authOn && s.tlsCert != "" {
		warnings = append(warnings, "TLS is on but no role tokens are set: any client may call any method")
	}
	if authOn && s.tlsCert == "" {
		warnings = append(warnings, fmt.Sprintf("role tokens are set but TLS is off: Raft runs on plain TCP, and anyone who reaches %s can rewrite the directory without a token; give --tls-cert, --tls-key and --tls-ca to run Raft over mutual TLS", c.RaftAddr))
	}
	if err := c.Validate(); err != nil {
		return warnings, s.flagError(err)
	}
	return warnings, nil
}

// readCredentials reads an agent credentials file (node.ParseCredentials).
// It warns when others may read the file.
func readCredentials(path string) ([]node.Credential, string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, "", fmt.Errorf("credentials file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, "", fmt.Errorf("credentials file %s is not a regular file", path)
	}
	if info.Size() > 4<<20 {
		return nil, "", fmt.Errorf("credentials file %s is larger than 4 MiB: is it the right file?", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("credentials file: %w", err)
	}
	defer f.Close()
	creds, err := node.ParseCredentials(f)
	if err != nil {
		return nil, "", fmt.Errorf("credentials file %s: %w", path, err)
	}
	if len(creds) == 0 {
		return nil, "", fmt.Errorf("credentials file %s holds no credential", path)
	}
	var warning string
	if info.Mode().Perm()&0o077 != 0 {
		warning = fmt.Sprintf("credentials file %s may be read by other users (mode %v); chmod 600 it", path, info.Mode().Perm())
	}
	return creds, warning, nil
}

// readToken reads a token file. It warns when others may read the file.
func readToken(path string) (token, warning string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("token file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return "", "", fmt.Errorf("token file %s is not a regular file", path)
	}
	if info.Size() > 4096 {
		return "", "", fmt.Errorf("token file %s is larger than 4 KiB: is it the right file?", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("token file: %w", err)
	}
	token = strings.TrimSpace(string(data))
	if token == "" {
		return "", "", fmt.Errorf("token file %s is empty", path)
	}
	if info.Mode().Perm()&0o077 != 0 {
		warning = fmt.Sprintf("token file %s may be read by other users (mode %v); chmod 600 it", path, info.Mode().Perm())
	}
	return token, warning, nil
}

// raftAdvertiseOrAddr is the Raft address other members dial.
func (s *settings) raftAdvertiseOrAddr() string {
	if s.cfg.RaftAdvertise != "" {
		return s.cfg.RaftAdvertise
	}
	return s.cfg.RaftAddr
}

// nodeConfig returns the node's configuration with the TLS files loaded
// (and Raft over mutual TLS unless --insecure-raft), checked again with
// them; its errors are usage errors.
func (s *settings) nodeConfig(log *slog.Logger) (node.Config, error) {
	cfg := s.cfg
	cfg.Logger = log
	if s.tlsCert == "" {
		return cfg, nil
	}
	cert, err := tls.LoadX509KeyPair(s.tlsCert, s.tlsKey)
	if err != nil {
		return cfg, cli.Usagef("load --tls-cert %s and --tls-key %s: %w", s.tlsCert, s.tlsKey, err)
	}
	cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	cfg.ClientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
	if s.tlsCA != "" {
		pem, err := os.ReadFile(s.tlsCA)
		if err != nil {
			return cfg, cli.Usagef("read --tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, cli.Usagef("--tls-ca %s holds no PEM certificate", s.tlsCA)
		}
		cfg.ClientTLS.RootCAs = pool
		if !s.insecureRaft {
			cfg.RaftTLS = &node.RaftTLS{Certificate: cert, CA: pool}
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, cli.Usage(s.flagError(err))
	}
	return cfg, nil
}
