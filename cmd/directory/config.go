package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
)

// envPrefix starts the name of every environment variable the command reads.
const envPrefix = "KVDIR_"

// source is where a setting came from; a later source overrides an
// earlier one.
type source int

const (
	fromDefault source = iota
	fromFile
	fromEnv
	fromFlag
)

// settings is the command's configuration once every source is merged.
type settings struct {
	configFile string

	nodeID        string
	raftAddr      string
	raftAdvertise string
	apiAddr       string
	apiAdvertise  string
	httpAddr      string
	dataDir       string

	bootstrap      bool
	initialCluster map[string]string
	join           []string

	lease        time.Duration
	maxStaleness time.Duration
	loadInterval time.Duration
	sessionTTL   time.Duration

	maxSessions     int
	maxGoneWorkers  int
	maxBatchEvents  int
	maxBatchBlocks  int
	maxWorkers      int
	maxChain        int
	maxOrphanBlocks int

	snapshotInterval  time.Duration
	snapshotThreshold uint64
	trailingLogs      uint64
	heartbeatTimeout  time.Duration
	electionTimeout   time.Duration
	applyTimeout      time.Duration
	shutdownTimeout   time.Duration

	tlsCert, tlsKey, tlsCA string

	// tokens[role] and tokenFiles[role], role one of "agent", "router",
	// "admin"; resolve merges each pair into tokens.
	tokens     map[string]string
	tokenFiles map[string]string

	logLevel  slog.Level
	logFormat string

	// from records where each option that was set came from.
	from map[string]source
}

// option is one setting: a flag --name, an environment variable
// KVDIR_NAME and a config file key name.
type option struct {
	name  string
	group string
	arg   string // placeholder in the help; "" for a boolean
	def   string // default, as text (parsed like any other value)
	usage string
	// list accepts a YAML sequence (joined with commas); pairs also a YAML
	// mapping (joined as k=v,k=v).
	list, pairs bool
	set         func(s *settings, v string) error
}

func (o *option) env() string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(o.name, "-", "_"))
}

// Help groups, in the order the help shows them.
var groups = []string{"Node", "Cluster", "Workers and sessions", "Limits", "Raft", "Security", "Logging"}

var roles = []string{"agent", "router", "admin"}

// options lists every setting. Defaults are text so that the help shows
// exactly what is parsed.
var options = buildOptions()

func buildOptions() []*option {
	opts := []*option{
		{name: "node-id", group: "Node", arg: "ID", usage: "this node's Raft server id, unique in the cluster (required; letters, digits, '.', '_', '-')",
			set: str(func(s *settings) *string { return &s.nodeID })},
		{name: "raft-addr", group: "Node", arg: "HOST:PORT", def: "127.0.0.1:7000", usage: "address the Raft transport binds (a fixed port: other members dial it)",
			set: str(func(s *settings) *string { return &s.raftAddr })},
		{name: "raft-advertise", group: "Node", arg: "HOST:PORT", usage: "Raft address other members dial (default: --raft-addr; required when --raft-addr binds all interfaces)",
			set: str(func(s *settings) *string { return &s.raftAdvertise })},
		{name: "api-addr", group: "Node", arg: "HOST:PORT", def: "127.0.0.1:7001", usage: "address the gRPC API listens on (port 0 picks a free port)",
			set: str(func(s *settings) *string { return &s.apiAddr })},
		{name: "api-advertise", group: "Node", arg: "HOST:PORT", usage: "gRPC address other nodes and clients dial (default: the address listened on)",
			set: str(func(s *settings) *string { return &s.apiAdvertise })},
		{name: "http-addr", group: "Node", arg: "HOST:PORT", def: "127.0.0.1:7002", usage: "address serving /metrics, /healthz and /readyz (\"off\" or empty disables it)",
			set: func(s *settings, v string) error {
				if v == "off" {
					v = ""
				}
				s.httpAddr = v
				return nil
			}},
		{name: "data-dir", group: "Node", arg: "DIR", usage: "directory for raft.db (Raft log, BoltDB) and snapshots/ (default: kvdir-data/NODE_ID)",
			set: str(func(s *settings) *string { return &s.dataDir })},

		{name: "bootstrap", group: "Cluster", def: "false", usage: "start a new single-member cluster when the data directory is empty",
			set: boolean(func(s *settings) *bool { return &s.bootstrap })},
		{name: "initial-cluster", group: "Cluster", arg: "ID=HOST:PORT,...", pairs: true, list: true,
			usage: "start a new cluster of these members (id=raft address) when the data directory is empty; give every member the same list",
			set: func(s *settings, v string) error {
				m, err := parseInitialCluster(v)
				if err != nil {
					return err
				}
				s.initialCluster = m
				return nil
			}},
		{name: "join", group: "Cluster", arg: "HOST:PORT,...", list: true, usage: "API addresses of existing members to ask to add this node (when its data directory is empty)",
			set: func(s *settings, v string) error {
				l, err := parseAddrList(v)
				if err != nil {
					return err
				}
				s.join = l
				return nil
			}},

		{name: "lease", group: "Workers and sessions", arg: "DURATION", def: "10s", usage: "how long a worker may go without a heartbeat before the leader expires it (at least 100ms)",
			set: duration(func(s *settings) *time.Duration { return &s.lease })},
		{name: "max-staleness", group: "Workers and sessions", arg: "DURATION", def: "15s", usage: "a follower that has not heard from a leader for this long refuses reads, so clients use a node that has",
			set: duration(func(s *settings) *time.Duration { return &s.maxStaleness })},
		{name: "load-interval", group: "Workers and sessions", arg: "DURATION", def: "1s", usage: "how often the leader commits the loads gathered from heartbeats",
			set: duration(func(s *settings) *time.Duration { return &s.loadInterval })},
		{name: "session-ttl", group: "Workers and sessions", arg: "DURATION", def: "24h", usage: "forget sessions not recorded for this long (at least 1s)",
			set: duration(func(s *settings) *time.Duration { return &s.sessionTTL })},
		{name: "max-sessions", group: "Workers and sessions", arg: "N", def: strconv.Itoa(raftfsm.DefaultMaxSessions), usage: "most sessions kept; the least recently recorded go first",
			set: positiveInt(func(s *settings) *int { return &s.maxSessions })},
		{name: "max-gone-workers", group: "Workers and sessions", arg: "N", def: strconv.Itoa(raftfsm.DefaultMaxGoneWorkers), usage: "most records kept of expired and deregistered workers",
			set: positiveInt(func(s *settings) *int { return &s.maxGoneWorkers })},

		{name: "max-batch-events", group: "Limits", arg: "N", def: strconv.Itoa(raftfsm.DefaultMaxBatchEvents), usage: "most events in one published batch",
			set: positiveInt(func(s *settings) *int { return &s.maxBatchEvents })},
		{name: "max-batch-blocks", group: "Limits", arg: "N", def: strconv.Itoa(raftfsm.DefaultMaxBatchBlocks), usage: "most blocks in one published batch",
			set: positiveInt(func(s *settings) *int { return &s.maxBatchBlocks })},
		{name: "max-workers", group: "Limits", arg: "N", def: strconv.Itoa(radix.DefaultMaxWorkers), usage: "most distinct workers the index holds",
			set: positiveInt(func(s *settings) *int { return &s.maxWorkers })},
		{name: "max-chain", group: "Limits", arg: "N", def: strconv.Itoa(radix.DefaultMaxChain), usage: "longest chain accepted, in blocks",
			set: positiveInt(func(s *settings) *int { return &s.maxChain })},
		{name: "max-orphan-blocks", group: "Limits", arg: "N", def: strconv.Itoa(radix.DefaultMaxOrphanBlocks), usage: "most blocks kept in out-of-order pieces waiting for their parent",
			set: positiveInt(func(s *settings) *int { return &s.maxOrphanBlocks })},

		{name: "snapshot-interval", group: "Raft", arg: "DURATION", def: "30s", usage: "how often Raft checks whether to take a snapshot",
			set: duration(func(s *settings) *time.Duration { return &s.snapshotInterval })},
		{name: "snapshot-threshold", group: "Raft", arg: "N", def: "8192", usage: "new log entries that make a snapshot",
			set: positiveUint(func(s *settings) *uint64 { return &s.snapshotThreshold })},
		{name: "trailing-logs", group: "Raft", arg: "N", def: "10240", usage: "log entries kept after a snapshot",
			set: positiveUint(func(s *settings) *uint64 { return &s.trailingLogs })},
		{name: "heartbeat-timeout", group: "Raft", arg: "DURATION", def: "1s", usage: "Raft heartbeat timeout (at least 10ms)",
			set: duration(func(s *settings) *time.Duration { return &s.heartbeatTimeout })},
		{name: "election-timeout", group: "Raft", arg: "DURATION", def: "1s", usage: "Raft election timeout (at least the heartbeat timeout)",
			set: duration(func(s *settings) *time.Duration { return &s.electionTimeout })},
		{name: "apply-timeout", group: "Raft", arg: "DURATION", def: "10s", usage: "how long a write may wait to be committed",
			set: duration(func(s *settings) *time.Duration { return &s.applyTimeout })},
		{name: "shutdown-timeout", group: "Raft", arg: "DURATION", def: "30s", usage: "how long a stop (SIGINT, SIGTERM) may take, handing over leadership included",
			set: duration(func(s *settings) *time.Duration { return &s.shutdownTimeout })},

		{name: "tls-cert", group: "Security", arg: "FILE", usage: "PEM certificate the API serves (with --tls-key); enables TLS",
			set: str(func(s *settings) *string { return &s.tlsCert })},
		{name: "tls-key", group: "Security", arg: "FILE", usage: "PEM private key of --tls-cert",
			set: str(func(s *settings) *string { return &s.tlsKey })},
		{name: "tls-ca", group: "Security", arg: "FILE", usage: "PEM CA bundle to verify other members when forwarding and joining (default: the system roots)",
			set: str(func(s *settings) *string { return &s.tlsCA })},
	}
	for _, r := range roles {
		opts = append(opts,
			&option{name: r + "-token", group: "Security", arg: "TOKEN",
				usage: "bearer token of the " + r + " role (prefer --" + r + "-token-file or " + envPrefix + strings.ToUpper(r) + "_TOKEN: flags show in ps)",
				set:   func(s *settings, v string) error { s.tokens[r] = strings.TrimSpace(v); return nil }},
			&option{name: r + "-token-file", group: "Security", arg: "FILE",
				usage: "file holding the " + r + " role's bearer token (surrounding whitespace is ignored)",
				set:   func(s *settings, v string) error { s.tokenFiles[r] = strings.TrimSpace(v); return nil }},
		)
	}
	opts = append(opts,
		&option{name: "log-level", group: "Logging", arg: "LEVEL", def: "info", usage: "debug, info, warn or error",
			set: func(s *settings, v string) error {
				switch strings.ToLower(v) {
				case "debug":
					s.logLevel = slog.LevelDebug
				case "info":
					s.logLevel = slog.LevelInfo
				case "warn", "warning":
					s.logLevel = slog.LevelWarn
				case "error":
					s.logLevel = slog.LevelError
				default:
					return fmt.Errorf("unknown log level %q (want debug, info, warn or error)", v)
				}
				return nil
			}},
		&option{name: "log-format", group: "Logging", arg: "FORMAT", def: "text", usage: "text or json (logs go to standard error)",
			set: func(s *settings, v string) error {
				v = strings.ToLower(v)
				if v != "text" && v != "json" {
					return fmt.Errorf("unknown log format %q (want text or json)", v)
				}
				s.logFormat = v
				return nil
			}},
	)
	return opts
}

func lookupOption(name string) *option {
	for _, o := range options {
		if o.name == name {
			return o
		}
	}
	return nil
}

func str(field func(*settings) *string) func(*settings, string) error {
	return func(s *settings, v string) error { *field(s) = strings.TrimSpace(v); return nil }
}

func boolean(field func(*settings) *bool) func(*settings, string) error {
	return func(s *settings, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not a boolean: %q (want true or false)", v)
		}
		*field(s) = b
		return nil
	}
}

func duration(field func(*settings) *time.Duration) func(*settings, string) error {
	return func(s *settings, v string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not a duration: %q (write a number with a unit, e.g. 500ms, 10s, 5m)", v)
		}
		if d <= 0 {
			return fmt.Errorf("duration %q must be positive", v)
		}
		*field(s) = d
		return nil
	}
}

func positiveInt(field func(*settings) *int) func(*settings, string) error {
	return func(s *settings, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || n <= 0 {
			return fmt.Errorf("not a positive integer below 2^31: %q", v)
		}
		*field(s) = int(n)
		return nil
	}
}

func positiveUint(field func(*settings) *uint64) func(*settings, string) error {
	return func(s *settings, v string) error {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("not a positive integer: %q", v)
		}
		*field(s) = n
		return nil
	}
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func parseAddrList(v string) ([]string, error) {
	l := splitList(v)
	for _, a := range l {
		if err := checkHostPort(a, false); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// parseInitialCluster parses "id=host:port,id=host:port".
func parseInitialCluster(v string) (map[string]string, error) {
	m := map[string]string{}
	addrs := map[string]string{}
	for _, item := range splitList(v) {
		id, addr, ok := strings.Cut(item, "=")
		id, addr = strings.TrimSpace(id), strings.TrimSpace(addr)
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("member %q: want id=host:port", item)
		}
		if err := checkNodeID(id); err != nil {
			return nil, fmt.Errorf("member %q: %w", item, err)
		}
		if err := checkHostPort(addr, false); err != nil {
			return nil, fmt.Errorf("member %q: %w", item, err)
		}
		if _, dup := m[id]; dup {
			return nil, fmt.Errorf("member id %q is listed twice", id)
		}
		if other, dup := addrs[addr]; dup {
			return nil, fmt.Errorf("members %q and %q have the same address %s", other, id, addr)
		}
		m[id], addrs[addr] = addr, id
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

func checkNodeID(id string) error {
	if len(id) > 128 {
		return fmt.Errorf("node id %.20q... is longer than 128 characters", id)
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return fmt.Errorf("node id %q: only letters, digits, '.', '_' and '-' are allowed", id)
		}
	}
	return nil
}

// checkHostPort checks a host:port address; zeroPortOK allows port 0.
func checkHostPort(a string, zeroPortOK bool) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("address %q: want host:port", a)
	}
	if strings.ContainsAny(host, " \t,=") {
		return fmt.Errorf("address %q: bad host", a)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("address %q: port must be a number from 1 to 65535", a)
	}
	if p == 0 && !zeroPortOK {
		return fmt.Errorf("address %q: port 0 is not allowed here (others must be able to dial it)", a)
	}
	return nil
}

func wildcardHost(a string) bool {
	host, _, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// describe names where a setting came from, for error messages.
func describe(o *option, from source, file string) string {
	switch from {
	case fromFlag:
		return "flag --" + o.name
	case fromEnv:
		return "environment variable " + o.env()
	case fromFile:
		return fmt.Sprintf("key %q in config file %s", o.name, file)
	}
	return "default of --" + o.name
}

// loaded is what loadSettings found to do.
type loaded struct {
	s        *settings
	help     bool
	version  bool
	warnings []string
}

// errUsage marks errors in the command line, environment or config file.
var errUsage = errors.New("usage error")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// rawFlag records a flag's text; the value is parsed after the sources
// below it, so that precedence holds whatever the order of work.
type rawFlag struct {
	name  string
	isBo  bool
	seen  map[string]string
	order *[]string
}

func (f *rawFlag) String() string { return "" }
func (f *rawFlag) Set(v string) error {
	if _, ok := f.seen[f.name]; !ok {
		*f.order = append(*f.order, f.name)
	}
	f.seen[f.name] = v
	return nil
}
func (f *rawFlag) IsBoolFlag() bool { return f.isBo }

// loadSettings merges, for every option, flag > environment > config file
// > default, then checks the result. env holds "KEY=value" entries, as
// os.Environ returns them.
func loadSettings(args, env []string) (*loaded, error) {
	fs := flag.NewFlagSet("directory", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	seen := map[string]string{}
	var order []string
	for _, o := range options {
		fs.Var(&rawFlag{name: o.name, isBo: o.arg == "", seen: seen, order: &order}, o.name, o.usage)
	}
	fs.Var(&rawFlag{name: "config", seen: seen, order: &order}, "config", "")
	fs.Var(&rawFlag{name: "version", isBo: true, seen: seen, order: &order}, "version", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &loaded{help: true}, nil
		}
		return nil, usageErrorf("%v", err)
	}
	if v, ok := seen["version"]; ok {
		if b, err := strconv.ParseBool(v); err != nil || b {
			return &loaded{version: true}, nil
		}
	}
	if fs.NArg() > 0 {
		return nil, usageErrorf("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	}

	envs := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, envPrefix) {
			envs[k] = v
		}
	}
	res := &loaded{}
	known := map[string]bool{envPrefix + "CONFIG": true}
	for _, o := range options {
		known[o.env()] = true
	}
	var unknownEnv []string
	for k := range envs {
		if !known[k] {
			unknownEnv = append(unknownEnv, k)
		}
	}
	sort.Strings(unknownEnv)
	for _, k := range unknownEnv {
		res.warnings = append(res.warnings, fmt.Sprintf("ignoring unknown environment variable %s", k))
	}

	s := &settings{tokens: map[string]string{}, tokenFiles: map[string]string{}, from: map[string]source{}}
	for _, o := range options {
		if err := o.set(s, o.def); err != nil {
			return nil, fmt.Errorf("default of --%s: %w", o.name, err) // a bug, not bad input
		}
	}

	s.configFile = strings.TrimSpace(envs[envPrefix+"CONFIG"])
	if v, ok := seen["config"]; ok {
		s.configFile = strings.TrimSpace(v)
	}
	if s.configFile != "" {
		values, err := readConfigFile(s.configFile)
		if err != nil {
			return nil, err
		}
		for _, kv := range values {
			if err := apply(s, kv.o, kv.v, fromFile); err != nil {
				return nil, usageErrorf("%s (line %d): %v", describe(kv.o, fromFile, s.configFile), kv.line, err)
			}
		}
	}
	for _, o := range options {
		if v := envs[o.env()]; strings.TrimSpace(v) != "" {
			if err := apply(s, o, v, fromEnv); err != nil {
				return nil, usageErrorf("%s: %v", describe(o, fromEnv, ""), err)
			}
		}
	}
	for _, name := range order {
		o := lookupOption(name)
		if o == nil {
			continue // config and version, handled above
		}
		if err := apply(s, o, seen[name], fromFlag); err != nil {
			return nil, usageErrorf("%s: %v", describe(o, fromFlag, ""), err)
		}
	}
	warnings, err := s.resolve()
	res.warnings = append(res.warnings, warnings...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	res.s = s
	return res, nil
}

func apply(s *settings, o *option, v string, from source) error {
	if err := o.set(s, v); err != nil {
		return err
	}
	s.from[o.name] = from
	return nil
}

type fileValue struct {
	o    *option
	v    string
	line int
}

// readConfigFile reads a YAML mapping whose keys are option names.
func readConfigFile(path string) ([]fileValue, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErrorf("read config file: %v", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, usageErrorf("config file %s: %v", path, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, usageErrorf("config file %s: want a mapping of option names to values (e.g. \"node-id: n1\")", path)
	}
	var out []fileValue
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, usageErrorf("config file %s (line %d): keys must be option names", path, k.Line)
		}
		o := lookupOption(k.Value)
		if o == nil {
			hint := ""
			if k.Value == "config" || k.Value == "version" {
				hint = ": it is a flag only"
			} else if alt := strings.ReplaceAll(strings.ToLower(k.Value), "_", "-"); lookupOption(alt) != nil {
				hint = fmt.Sprintf(": did you mean %q?", alt)
			}
			return nil, usageErrorf("config file %s (line %d): unknown key %q%s", path, k.Line, k.Value, hint)
		}
		if prev, dup := seen[k.Value]; dup {
			return nil, usageErrorf("config file %s (line %d): key %q already set on line %d", path, k.Line, k.Value, prev)
		}
		seen[k.Value] = k.Line
		text, err := nodeText(o, v)
		if err != nil {
			return nil, usageErrorf("config file %s (line %d): key %q: %v", path, v.Line, k.Value, err)
		}
		out = append(out, fileValue{o: o, v: text, line: v.Line})
	}
	return out, nil
}

// nodeText turns a YAML value into the text a flag would carry.
func nodeText(o *option, v *yaml.Node) (string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", nil
		}
		return v.Value, nil
	case yaml.SequenceNode:
		if !o.list {
			return "", errors.New("want a single value, not a list")
		}
		var items []string
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode || strings.Contains(it.Value, ",") {
				return "", fmt.Errorf("line %d: each list item must be one plain value", it.Line)
			}
			items = append(items, it.Value)
		}
		return strings.Join(items, ","), nil
	case yaml.MappingNode:
		if !o.pairs {
			return "", errors.New("want a single value, not a mapping")
		}
		var items []string
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, a := v.Content[i], v.Content[i+1]
			if k.Kind != yaml.ScalarNode || a.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("line %d: want id: host:port", k.Line)
			}
			items = append(items, k.Value+"="+a.Value)
		}
		return strings.Join(items, ","), nil
	}
	return "", errors.New("unsupported YAML value (aliases are not supported)")
}

// resolve reads token files, fills derived defaults and checks that the
// settings make sense together.
func (s *settings) resolve() (warnings []string, err error) {
	if s.nodeID == "" {
		return nil, errors.New("a node id is required: set --node-id or " + envPrefix + "NODE_ID")
	}
	if err := checkNodeID(s.nodeID); err != nil {
		return nil, fmt.Errorf("--node-id: %w", err)
	}
	if s.dataDir == "" {
		s.dataDir = filepath.Join("kvdir-data", s.nodeID)
	}

	// Addresses.
	if err := checkHostPort(s.raftAddr, false); err != nil {
		return nil, fmt.Errorf("--raft-addr: %w", err)
	}
	if s.raftAdvertise != "" {
		if err := checkHostPort(s.raftAdvertise, false); err != nil {
			return nil, fmt.Errorf("--raft-advertise: %w", err)
		}
	}
	if wildcardHost(s.raftAdvertiseOrAddr()) {
		return nil, fmt.Errorf("--raft-addr %s binds every interface: set --raft-advertise to the address other members dial", s.raftAddr)
	}
	if err := checkHostPort(s.apiAddr, true); err != nil {
		return nil, fmt.Errorf("--api-addr: %w", err)
	}
	if s.apiAdvertise != "" {
		if err := checkHostPort(s.apiAdvertise, false); err != nil {
			return nil, fmt.Errorf("--api-advertise: %w", err)
		}
		if wildcardHost(s.apiAdvertise) {
			return nil, fmt.Errorf("--api-advertise %s: give an address others can dial, not a wildcard", s.apiAdvertise)
		}
	} else if wildcardHost(s.apiAddr) {
		warnings = append(warnings, fmt.Sprintf("--api-addr %s binds every interface and --api-advertise is not set: other members will be told 127.0.0.1, which only works on one machine", s.apiAddr))
	}
	if s.httpAddr != "" {
		if err := checkHostPort(s.httpAddr, true); err != nil {
			return nil, fmt.Errorf("--http-addr: %w", err)
		}
	}

	// How the cluster forms.
	switch {
	case s.bootstrap && len(s.join) > 0:
		return nil, errors.New("--bootstrap starts a new cluster and --join enters an existing one: give one of them")
	case s.bootstrap && len(s.initialCluster) > 0:
		return nil, errors.New("--bootstrap (a one-member cluster) and --initial-cluster (a cluster of the listed members) exclude each other: give one of them")
	case len(s.initialCluster) > 0 && len(s.join) > 0:
		return nil, errors.New("--initial-cluster starts a new cluster and --join enters an existing one: give one of them")
	}
	if len(s.initialCluster) > 0 {
		addr, ok := s.initialCluster[s.nodeID]
		if !ok {
			return nil, fmt.Errorf("--initial-cluster does not list this node (%q)", s.nodeID)
		}
		if addr != s.raftAdvertiseOrAddr() {
			return nil, fmt.Errorf("--initial-cluster lists %s at %s but this node's Raft address is %s (--raft-advertise, or --raft-addr): they must be the same", s.nodeID, addr, s.raftAdvertiseOrAddr())
		}
	}
	if !s.bootstrap && len(s.initialCluster) == 0 && len(s.join) == 0 {
		warnings = append(warnings, "none of --bootstrap, --initial-cluster or --join is set: a node without state will wait to be added by a member")
	}

	// Timings.
	switch {
	case s.heartbeatTimeout < 10*time.Millisecond:
		return nil, fmt.Errorf("--heartbeat-timeout %v is too short (at least 10ms)", s.heartbeatTimeout)
	case s.electionTimeout < s.heartbeatTimeout:
		return nil, fmt.Errorf("--election-timeout %v must be at least --heartbeat-timeout %v", s.electionTimeout, s.heartbeatTimeout)
	case s.snapshotInterval < 5*time.Millisecond:
		return nil, fmt.Errorf("--snapshot-interval %v is too short (at least 5ms)", s.snapshotInterval)
	case s.lease < 100*time.Millisecond:
		return nil, fmt.Errorf("--lease %v is too short (at least 100ms)", s.lease)
	case s.sessionTTL < time.Second:
		return nil, fmt.Errorf("--session-ttl %v is too short (at least 1s)", s.sessionTTL)
	}

	// TLS.
	switch {
	case s.tlsKey != "" && s.tlsCert == "":
		return nil, errors.New("--tls-key is set without --tls-cert: give both to serve TLS")
	case s.tlsCert != "" && s.tlsKey == "":
		return nil, errors.New("--tls-cert is set without --tls-key: give both to serve TLS")
	case s.tlsCA != "" && s.tlsCert == "":
		return nil, errors.New("--tls-ca is set without --tls-cert and --tls-key: members dial each other with TLS only when they serve it")
	}

	// Tokens: of each role's pair, the one from the higher source wins.
	for _, r := range roles {
		tok, file := r+"-token", r+"-token-file"
		ft, okT := s.from[tok]
		ff, okF := s.from[file]
		switch {
		case okT && okF && ft == ff:
			return nil, fmt.Errorf("--%s and --%s are both set (%s): give one", tok, file, describe(lookupOption(tok), ft, s.configFile))
		case okT && okF && ft > ff:
			s.tokenFiles[r] = ""
		case okT && okF:
			s.tokens[r] = ""
		}
		if s.tokenFiles[r] != "" {
			t, warn, err := readToken(s.tokenFiles[r])
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", file, err)
			}
			if warn != "" {
				warnings = append(warnings, fmt.Sprintf("--%s: %s", file, warn))
			}
			s.tokens[r] = t
		}
		if t := s.tokens[r]; strings.ContainsAny(t, " \t\r\n") {
			return nil, fmt.Errorf("the %s token contains whitespace", r)
		}
	}
	set := 0
	for _, r := range roles {
		if s.tokens[r] != "" {
			set++
		}
	}
	switch {
	case set > 0 && set < len(roles):
		var missing []string
		for _, r := range roles {
			if s.tokens[r] == "" {
				missing = append(missing, "--"+r+"-token(-file)")
			}
		}
		return nil, fmt.Errorf("set the tokens of all three roles or of none; missing: %s", strings.Join(missing, ", "))
	case set == len(roles):
		if s.tokens["agent"] == s.tokens["router"] || s.tokens["agent"] == s.tokens["admin"] || s.tokens["router"] == s.tokens["admin"] {
			return nil, errors.New("the agent, router and admin tokens must differ from each other")
		}
	case set == 0 && s.tlsCert != "":
		warnings = append(warnings, "TLS is on but no role tokens are set: any client may call any method")
	}
	return warnings, nil
}

func (s *settings) raftAdvertiseOrAddr() string {
	if s.raftAdvertise != "" {
		return s.raftAdvertise
	}
	return s.raftAddr
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

// nodeConfig builds the node's configuration: it loads the TLS files.
func (s *settings) nodeConfig(log *slog.Logger) (node.Config, error) {
	cfg := node.Config{
		ID:                s.nodeID,
		RaftAddr:          s.raftAddr,
		RaftAdvertise:     s.raftAdvertise,
		APIAddr:           s.apiAddr,
		APIAdvertise:      s.apiAdvertise,
		HTTPAddr:          s.httpAddr,
		DataDir:           s.dataDir,
		Bootstrap:         s.bootstrap,
		InitialCluster:    s.initialCluster,
		Join:              slices.Clone(s.join),
		Lease:             s.lease,
		MaxStaleness:      s.maxStaleness,
		LoadInterval:      s.loadInterval,
		SessionTTL:        s.sessionTTL,
		SnapshotInterval:  s.snapshotInterval,
		SnapshotThreshold: s.snapshotThreshold,
		TrailingLogs:      s.trailingLogs,
		HeartbeatTimeout:  s.heartbeatTimeout,
		ElectionTimeout:   s.electionTimeout,
		ApplyTimeout:      s.applyTimeout,
		FSM: raftfsm.Options{
			Index: radix.Options{
				MaxChain:        s.maxChain,
				MaxOrphanBlocks: s.maxOrphanBlocks,
				MaxWorkers:      s.maxWorkers,
			},
			MaxBatchEvents: s.maxBatchEvents,
			MaxBatchBlocks: s.maxBatchBlocks,
			MaxSessions:    s.maxSessions,
			MaxGoneWorkers: s.maxGoneWorkers,
		},
		Tokens: node.Tokens{Agent: s.tokens["agent"], Router: s.tokens["router"], Admin: s.tokens["admin"]},
		Logger: log,
	}
	if s.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(s.tlsCert, s.tlsKey)
		if err != nil {
			return cfg, fmt.Errorf("%w: load --tls-cert %s and --tls-key %s: %w", errUsage, s.tlsCert, s.tlsKey, err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		cfg.ClientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if s.tlsCA != "" {
			pem, err := os.ReadFile(s.tlsCA)
			if err != nil {
				return cfg, fmt.Errorf("%w: read --tls-ca: %w", errUsage, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return cfg, fmt.Errorf("%w: --tls-ca %s holds no PEM certificate", errUsage, s.tlsCA)
			}
			cfg.ClientTLS.RootCAs = pool
		}
	}
	return cfg, nil
}
