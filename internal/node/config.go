package node

import (
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
	"github.com/kvdir/kvdir/internal/raftnet"
)

// Defaults of the per-credential and per-worker bounds (Unlimited turns
// one off).
const (
	// DefaultMaxWorkersPerCredential: live workers one agent credential may
	// own (an agent runs one worker per data-parallel rank, at most 256).
	DefaultMaxWorkersPerCredential = 256
	// DefaultMaxStreamsPerCredential: WatchWorkers, Follow and Share
	// streams one credential or role may hold on one node (a router holds
	// a few; each costs about 180 KB).
	DefaultMaxStreamsPerCredential = 256
	// DefaultWorkerBlockQuota: blocks one worker may hold in the index,
	// 2^22: the GPU cache of a 141 GB device at block size 1 for a model
	// of 32 KiB of KV cache per token or more, with room for a CPU tier
	// on larger models.
	DefaultWorkerBlockQuota = 1 << 22
	// Unlimited, as MaxWorkersPerCredential, MaxStreamsPerCredential or
	// WorkerBlockQuota, turns the bound off (0 means the default).
	Unlimited = -1
)

// DefaultShutdownTimeout is how long a stop may take by default, handing
// over leadership included (the time Shutdown's context is given).
const DefaultShutdownTimeout = 30 * time.Second

// Lower bounds that Validate enforces.
const (
	MinHeartbeatTimeout = 10 * time.Millisecond
	MinSnapshotInterval = 5 * time.Millisecond
	MinLease            = 100 * time.Millisecond
	MinSessionTTL       = time.Second
	MaxIDLength         = 128
)

// DefaultConfig returns the configuration a node runs with when nothing
// is set: loopback addresses 127.0.0.1:7000 (Raft), :7001 (gRPC) and
// :7002 (HTTP), and the default timings and limits. ID and DataDir, and
// how the cluster forms (Bootstrap, InitialCluster, Join), are left for
// the caller. A zero field of a Config passed to New means its default.
func DefaultConfig() Config {
	return Config{
		RaftAddr:          "127.0.0.1:7000",
		APIAddr:           "127.0.0.1:7001",
		HTTPAddr:          "127.0.0.1:7002",
		Lease:             10 * time.Second,
		MaxStaleness:      15 * time.Second,
		LoadInterval:      time.Second,
		SessionTTL:        24 * time.Hour,
		SnapshotInterval:  30 * time.Second,
		SnapshotThreshold: 8192,
		TrailingLogs:      10240,
		HeartbeatTimeout:  time.Second,
		ElectionTimeout:   time.Second,
		ApplyTimeout:      10 * time.Second,
		FollowFeedEntries: DefaultFollowFeedEntries,
		FollowFeedBytes:   DefaultFollowFeedBytes,

		MaxWorkersPerCredential: DefaultMaxWorkersPerCredential,
		MaxStreamsPerCredential: DefaultMaxStreamsPerCredential,
		WorkerBlockQuota:        DefaultWorkerBlockQuota,
		FSM: raftfsm.Options{
			Index: radix.Options{
				MaxChain:        radix.DefaultMaxChain,
				MaxOrphanBlocks: radix.DefaultMaxOrphanBlocks,
				MaxWorkers:      radix.DefaultMaxWorkers,
			},
			MaxBatchEvents: raftfsm.DefaultMaxBatchEvents,
			MaxBatchBlocks: raftfsm.DefaultMaxBatchBlocks,
			MaxSessions:    raftfsm.DefaultMaxSessions,
			MaxGoneWorkers: raftfsm.DefaultMaxGoneWorkers,
		},
	}
}

// fillDefaults sets every zero timing and size to its default, and the
// advertised addresses to the bound ones.
func (c *Config) fillDefaults() {
	d := DefaultConfig()
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&c.Lease, d.Lease)
	def(&c.LoadInterval, d.LoadInterval)
	def(&c.MaxStaleness, d.MaxStaleness)
	def(&c.SessionTTL, d.SessionTTL)
	def(&c.SnapshotInterval, d.SnapshotInterval)
	def(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	def(&c.ElectionTimeout, d.ElectionTimeout)
	def(&c.ApplyTimeout, d.ApplyTimeout)
	for _, l := range []struct {
		v *int
		d int
	}{
		{&c.MaxWorkersPerCredential, d.MaxWorkersPerCredential},
		{&c.MaxStreamsPerCredential, d.MaxStreamsPerCredential},
	} {
		if *l.v == 0 {
			*l.v = l.d
		}
	}
	if c.WorkerBlockQuota == 0 {
		c.WorkerBlockQuota = d.WorkerBlockQuota
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftAddr
	}
	if c.APIAdvertise == "" {
		c.APIAdvertise = c.APIAddr
	}
}

func (c *Config) setDefaults() {
	c.fillDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// FieldError is a Config that Validate refuses: the field at fault (With,
// if set, is a second field the rule involves) and why. Field and With
// are Go field names ("Lease", "Tokens.Admin"), so that a command line can
// name its own flag instead.
type FieldError struct {
	Field, With string
	Msg         string
}

func (e *FieldError) Error() string {
	if e.With != "" {
		return e.Field + " and " + e.With + ": " + e.Msg
	}
	return e.Field + ": " + e.Msg
}

func fieldErr(field, with, format string, args ...any) error {
	return &FieldError{Field: field, With: with, Msg: fmt.Sprintf(format, args...)}
}

// Validate reports the first problem of c as New would run it (zero fields
// taking their defaults), as a *FieldError: a missing or malformed id, a
// malformed or wildcard address, more than one way of forming the cluster,
// an initial cluster that does not list this node at its own address,
// a Raft TLS certificate that peers would refuse (see
// raftnet.CheckCertificate), a zero index to skip, timings below the
// bounds Raft and the lease logic need, negative limits,
// and role tokens that are not all set (or none), equal, or hold
// whitespace. With an injected Transport the Raft addresses are the
// transport's and are not checked as host:port.
func (c Config) Validate() error {
	c.fillDefaults()
	if c.ID == "" {
		return fieldErr("ID", "", "a node id is required")
	}
	if err := checkNodeID(c.ID); err != nil {
		return fieldErr("ID", "", "%v", err)
	}
	ownRaft := c.Transport == nil
	if ownRaft {
		if err := checkHostPort(c.RaftAddr, false); err != nil {
			return fieldErr("RaftAddr", "", "%v", err)
		}
		if err := checkHostPort(c.RaftAdvertise, false); err != nil {
			return fieldErr("RaftAdvertise", "", "%v", err)
		}
		if wildcardHost(c.RaftAdvertise) {
			return fieldErr("RaftAddr", "RaftAdvertise", "%s binds every interface: set the advertised address other members dial", c.RaftAddr)
		}
	}
	if c.APIAddr != "" {
		if err := checkHostPort(c.APIAddr, true); err != nil {
			return fieldErr("APIAddr", "", "%v", err)
		}
	}
	if c.APIAdvertise != "" && c.APIAdvertise != c.APIAddr {
		if err := checkHostPort(c.APIAdvertise, false); err != nil {
			return fieldErr("APIAdvertise", "", "%v", err)
		}
		if wildcardHost(c.APIAdvertise) {
			return fieldErr("APIAdvertise", "", "%s: give an address others can dial, not a wildcard", c.APIAdvertise)
		}
	}
	if c.HTTPAddr != "" {
		if err := checkHostPort(c.HTTPAddr, true); err != nil {
			return fieldErr("HTTPAddr", "", "%v", err)
		}
	}
	if c.RaftTLS != nil {
		if !ownRaft {
			return fieldErr("RaftTLS", "Transport", "exclude each other: RaftTLS configures the node's own transport")
		}
		if c.RaftTLS.CA == nil {
			return fieldErr("RaftTLS", "", "a CA is required to verify the other members")
		}
		if err := raftnet.CheckCertificate(c.RaftTLS.Certificate, c.RaftTLS.CA, c.RaftAdvertise); err != nil {
			return fieldErr("RaftTLS", "", "%v", err)
		}
	}
	for _, i := range c.SkipUndecodableEntries {
		if i == 0 {
			return fieldErr("SkipUndecodableEntries", "", "log indexes start at 1")
		}
	}
	if (c.LogStore == nil || c.StableStore == nil || c.Snapshots == nil) && c.DataDir == "" {
		return fieldErr("DataDir", "", "a data directory is required")
	}

	// How the cluster forms.
	switch {
	case c.Bootstrap && len(c.Join) > 0:
		return fieldErr("Bootstrap", "Join", "exclude each other: one starts a new cluster, the other enters an existing one; give one of them")
	case c.Bootstrap && len(c.InitialCluster) > 0:
		return fieldErr("Bootstrap", "InitialCluster", "exclude each other: one starts a one-member cluster, the other a cluster of the listed members; give one of them")
	case len(c.InitialCluster) > 0 && len(c.Join) > 0:
		return fieldErr("InitialCluster", "Join", "exclude each other: one starts a new cluster, the other enters an existing one; give one of them")
	}
	if len(c.InitialCluster) > 0 {
		ids := make([]string, 0, len(c.InitialCluster))
		for id := range c.InitialCluster {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		addrs := map[string]string{}
		for _, id := range ids {
			addr := c.InitialCluster[id]
			if err := checkNodeID(id); err != nil {
				return fieldErr("InitialCluster", "", "member %q: %v", id, err)
			}
			if ownRaft {
				if err := checkHostPort(addr, false); err != nil {
					return fieldErr("InitialCluster", "", "member %q: %v", id, err)
				}
			}
			if other, dup := addrs[addr]; dup {
				return fieldErr("InitialCluster", "", "members %q and %q have the same address %s", other, id, addr)
			}
			addrs[addr] = id
		}
		addr, ok := c.InitialCluster[c.ID]
		if !ok {
			return fieldErr("InitialCluster", "", "does not list this node (%q)", c.ID)
		}
		if ownRaft && addr != c.RaftAdvertise {
			return fieldErr("InitialCluster", "RaftAdvertise", "the initial cluster lists %s at %s but this node's Raft address is %s: they must be the same", c.ID, addr, c.RaftAdvertise)
		}
	}
	for _, a := range c.Join {
		if err := checkHostPort(a, false); err != nil {
			return fieldErr("Join", "", "%v", err)
		}
	}

	// Timings.
	switch {
	case c.HeartbeatTimeout < MinHeartbeatTimeout:
		return fieldErr("HeartbeatTimeout", "", "%v is too short (at least %v)", c.HeartbeatTimeout, MinHeartbeatTimeout)
	case c.ElectionTimeout < c.HeartbeatTimeout:
		return fieldErr("ElectionTimeout", "HeartbeatTimeout", "the election timeout %v must be at least the heartbeat timeout %v", c.ElectionTimeout, c.HeartbeatTimeout)
	case c.SnapshotInterval < MinSnapshotInterval:
		return fieldErr("SnapshotInterval", "", "%v is too short (at least %v)", c.SnapshotInterval, MinSnapshotInterval)
	case c.Lease < MinLease:
		return fieldErr("Lease", "", "%v is too short (at least %v)", c.Lease, MinLease)
	case c.SessionTTL < MinSessionTTL:
		return fieldErr("SessionTTL", "", "%v is too short (at least %v)", c.SessionTTL, MinSessionTTL)
	}

	// Limits: zero is the default, negative a mistake.
	for _, l := range []struct {
		field string
		v     int
	}{
		{"FSM.MaxBatchEvents", c.FSM.MaxBatchEvents}, {"FSM.MaxBatchBlocks", c.FSM.MaxBatchBlocks},
		{"FSM.MaxSessions", c.FSM.MaxSessions}, {"FSM.MaxGoneWorkers", c.FSM.MaxGoneWorkers},
		{"FSM.Index.MaxChain", c.FSM.Index.MaxChain}, {"FSM.Index.MaxOrphanBlocks", c.FSM.Index.MaxOrphanBlocks},
		{"FSM.Index.MaxWorkers", c.FSM.Index.MaxWorkers},
		{"FollowFeedEntries", c.FollowFeedEntries}, {"FollowFeedBytes", c.FollowFeedBytes},
		{"IntentMaxCount", c.IntentMaxCount}, {"IntentMaxBytes", c.IntentMaxBytes},
	} {
		if l.v < 0 {
			return fieldErr(l.field, "", "%d is negative (0 means the default)", l.v)
		}
	}
	for _, l := range []struct {
		field string
		v     int64
	}{
		{"MaxWorkersPerCredential", int64(c.MaxWorkersPerCredential)},
		{"MaxStreamsPerCredential", int64(c.MaxStreamsPerCredential)},
		{"WorkerBlockQuota", c.WorkerBlockQuota},
	} {
		if l.v < Unlimited {
			return fieldErr(l.field, "", "%d is negative (0 means the default, -1 no bound)", l.v)
		}
	}
	if err := c.Tokens.validate(len(c.AgentCredentials) > 0); err != nil {
		return err
	}
	if err := CheckCredentials(c.AgentCredentials); err != nil {
		return fieldErr("AgentCredentials", "", "%v", err)
	}
	if _, err := agentCredentials(c.Tokens, c.AgentCredentials); err != nil {
		return fieldErr("AgentCredentials", "Tokens", "%v", err)
	}
	return nil
}

// validate checks the role tokens: the router's and the admin's and an
// agent token or credential (haveCreds), or none; different from each
// other, without whitespace.
func (t Tokens) validate(haveCreds bool) error {
	roles := []struct{ name, tok string }{{"agent", t.Agent}, {"router", t.Router}, {"admin", t.Admin}}
	var missing []string
	for _, r := range roles {
		if strings.ContainsAny(r.tok, " \t\r\n") {
			return fieldErr("Tokens", "", "the %s token contains whitespace", r.name)
		}
		if r.tok == "" && !(r.name == "agent" && haveCreds) {
			missing = append(missing, r.name)
		}
	}
	switch {
	case len(missing) == len(roles):
		return nil
	case len(missing) == len(roles)-1 && haveCreds && t.Agent == "":
		return fieldErr("Tokens", "AgentCredentials", "agent credentials need the router and admin tokens too")
	case len(missing) > 0:
		return fieldErr("Tokens", "", "set the tokens of all three roles or of none; missing: %s (agent credentials may stand for the agent token)", strings.Join(missing, ", "))
	case t.Agent != "" && (t.Agent == t.Router || t.Agent == t.Admin) || t.Router == t.Admin:
		return fieldErr("Tokens", "", "the agent, router and admin tokens must differ from each other")
	}
	return nil
}

func checkNodeID(id string) error {
	if len(id) > MaxIDLength {
		return fmt.Errorf("node id %.20q... is longer than %d characters", id, MaxIDLength)
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

// WildcardHost reports whether the host:port address a binds every
// interface (an empty host, 0.0.0.0 or ::).
func WildcardHost(a string) bool { return wildcardHost(a) }

func wildcardHost(a string) bool {
	host, _, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}
