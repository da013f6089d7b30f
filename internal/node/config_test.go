package node

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/raftfsm"
)

func TestDefaultConfig(t *testing.T) {
	d := DefaultConfig()
	if d.RaftAddr != "127.0.0.1:7000" || d.APIAddr != "127.0.0.1:7001" || d.HTTPAddr != "127.0.0.1:7002" ||
		d.Lease != 10*time.Second || d.MaxStaleness != 15*time.Second || d.LoadInterval != time.Second ||
		d.SessionTTL != 24*time.Hour || d.SnapshotInterval != 30*time.Second || d.SnapshotThreshold != 8192 ||
		d.TrailingLogs != 10240 || d.HeartbeatTimeout != time.Second || d.ElectionTimeout != time.Second ||
		d.ApplyTimeout != 10*time.Second || d.FSM.MaxSessions != raftfsm.DefaultMaxSessions ||
		d.FSM.Index.MaxWorkers != radix.DefaultMaxWorkers {
		t.Errorf("defaults: %+v", d)
	}
	// A zero field takes its default: New runs the same node either way.
	var zero Config
	zero.fillDefaults()
	d.RaftAddr, d.APIAddr, d.HTTPAddr, d.FSM = "", "", "", raftfsm.Options{}
	d.fillDefaults()
	if zero.Lease != d.Lease || zero.SnapshotThreshold != d.SnapshotThreshold || zero.ApplyTimeout != d.ApplyTimeout {
		t.Errorf("zero config filled %+v, defaults %+v", zero, d)
	}
	// The defaults with an id and a data directory are valid.
	d = DefaultConfig()
	d.ID, d.DataDir = "n1", t.TempDir()
	if err := d.Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// TestValidate checks every rule of Validate, one mistake at a time.
func TestValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.ID, c.DataDir = "n1", "/tmp/kvdir-test"
		return c
	}
	cases := []struct {
		name        string
		edit        func(*Config)
		field, want string
	}{
		{"missing id", func(c *Config) { c.ID = "" }, "ID", "a node id is required"},
		{"bad id", func(c *Config) { c.ID = "a=b" }, "ID", "only letters"},
		{"long id", func(c *Config) { c.ID = strings.Repeat("a", 129) }, "ID", "longer than 128"},
		{"raft not host:port", func(c *Config) { c.RaftAddr = "nohost" }, "RaftAddr", "want host:port"},
		{"raft port 0", func(c *Config) { c.RaftAddr = "127.0.0.1:0" }, "RaftAddr", "port 0 is not allowed"},
		{"raft wildcard", func(c *Config) { c.RaftAddr = "0.0.0.0:7000" }, "RaftAddr", "binds every interface"},
		{"raft advertise wildcard", func(c *Config) { c.RaftAdvertise = "[::]:7000" }, "RaftAddr", "binds every interface"},
		{"raft advertise port", func(c *Config) { c.RaftAdvertise = "h:99999" }, "RaftAdvertise", "port must be a number"},
		{"api port", func(c *Config) { c.APIAddr = "127.0.0.1:http" }, "APIAddr", "port must be a number"},
		{"api bad host", func(c *Config) { c.APIAddr = "a b:1" }, "APIAddr", "bad host"},
		{"api advertise wildcard", func(c *Config) { c.APIAdvertise = "0.0.0.0:7001" }, "APIAdvertise", "not a wildcard"},
		{"api advertise port 0", func(c *Config) { c.APIAdvertise = "h:0" }, "APIAdvertise", "port 0"},
		{"http addr", func(c *Config) { c.HTTPAddr = "7002" }, "HTTPAddr", "want host:port"},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "DataDir", "a data directory is required"},
		{"bootstrap and join", func(c *Config) { c.Bootstrap, c.Join = true, []string{"h:1"} }, "Bootstrap", "exclude each other"},
		{"bootstrap and initial", func(c *Config) { c.Bootstrap, c.InitialCluster = true, map[string]string{"n1": "127.0.0.1:7000"} }, "Bootstrap", "exclude each other"},
		{"initial and join", func(c *Config) {
			c.InitialCluster, c.Join = map[string]string{"n1": "127.0.0.1:7000"}, []string{"h:1"}
		}, "InitialCluster", "exclude each other"},
		{"initial without self", func(c *Config) { c.InitialCluster = map[string]string{"n2": "127.0.0.1:7010"} }, "InitialCluster", `does not list this node ("n1")`},
		{"initial wrong self address", func(c *Config) { c.InitialCluster = map[string]string{"n1": "127.0.0.1:9999"} }, "InitialCluster", "must be the same"},
		{"initial duplicate address", func(c *Config) {
			c.InitialCluster = map[string]string{"n1": "127.0.0.1:7000", "n2": "127.0.0.1:7000"}
		}, "InitialCluster", "same address"},
		{"initial bad member id", func(c *Config) { c.InitialCluster = map[string]string{"n1": "127.0.0.1:7000", "n 2": "h:1"} }, "InitialCluster", "only letters"},
		{"initial bad member address", func(c *Config) { c.InitialCluster = map[string]string{"n1": "127.0.0.1:7000", "n2": "h"} }, "InitialCluster", "want host:port"},
		{"join address", func(c *Config) { c.Join = []string{"nohost"} }, "Join", "want host:port"},
		{"join port 0", func(c *Config) { c.Join = []string{"h:0"} }, "Join", "port 0"},
		{"heartbeat too short", func(c *Config) { c.HeartbeatTimeout, c.ElectionTimeout = time.Millisecond, time.Millisecond }, "HeartbeatTimeout", "too short"},
		{"election below heartbeat", func(c *Config) { c.HeartbeatTimeout, c.ElectionTimeout = 2*time.Second, time.Second }, "ElectionTimeout", "must be at least the heartbeat timeout"},
		{"snapshot interval", func(c *Config) { c.SnapshotInterval = time.Millisecond }, "SnapshotInterval", "too short"},
		{"short lease", func(c *Config) { c.Lease = time.Millisecond }, "Lease", "1ms is too short (at least 100ms)"},
		{"short session ttl", func(c *Config) { c.SessionTTL = 10 * time.Millisecond }, "SessionTTL", "too short"},
		{"negative limit", func(c *Config) { c.FSM.MaxSessions = -1 }, "FSM.MaxSessions", "negative"},
		{"negative index limit", func(c *Config) { c.FSM.Index.MaxChain = -1 }, "FSM.Index.MaxChain", "negative"},
		{"one token only", func(c *Config) { c.Tokens.Admin = "a" }, "Tokens", "missing: agent, router"},
		{"equal tokens", func(c *Config) { c.Tokens = Tokens{Agent: "x", Router: "x", Admin: "y"} }, "Tokens", "must differ"},
		{"token with whitespace", func(c *Config) { c.Tokens = Tokens{Agent: "x y", Router: "r", Admin: "a"} }, "Tokens", "whitespace"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.edit(&cfg)
			err := cfg.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v, want a FieldError on %s with %q", err, c.field, c.want)
			}
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New accepted the config, or failed otherwise: %v", err)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	_, tr := raft.NewInmemTransport("")
	store := raft.NewInmemStore()
	for name, cfg := range map[string]Config{
		"zero timings with an id and a data dir": {ID: "n1", RaftAddr: "127.0.0.1:7000", DataDir: "d"},
		"initial cluster of three": {ID: "n2", RaftAddr: "127.0.0.1:7010", DataDir: "d",
			InitialCluster: map[string]string{"n1": "127.0.0.1:7000", "n2": "127.0.0.1:7010", "n3": "127.0.0.1:7020"}},
		"advertised raft address": {ID: "n1", RaftAddr: "0.0.0.0:7000", RaftAdvertise: "10.0.0.1:7000", DataDir: "d",
			InitialCluster: map[string]string{"n1": "10.0.0.1:7000"}},
		"api on a free port": {ID: "n1", RaftAddr: "127.0.0.1:7000", APIAddr: "127.0.0.1:0", HTTPAddr: "", DataDir: "d"},
		"injected transport and stores": {ID: "n1", Transport: tr, LogStore: store, StableStore: store, Snapshots: raft.NewInmemSnapshotStore(),
			InitialCluster: map[string]string{"n1": string(tr.LocalAddr()), "n2": "some-inmem-address"}},
		"all three tokens": {ID: "n1", RaftAddr: "127.0.0.1:7000", DataDir: "d", Tokens: Tokens{Agent: "a", Router: "r", Admin: "x"}},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
