// Package node runs one directory node: a Raft member (hashicorp/raft, with
// BoltDB for the log and stable store and files for snapshots) whose state
// machine is internal/raftfsm, serving the gRPC API (agent, directory and
// admin services, health and reflection) and HTTP (metrics, health). Writes
// that reach a follower are forwarded to the leader; reads are served from
// the local state. The leader also keeps workers' leases, gathers their
// loads and expires old sessions.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvdir/kvdir/internal/memreturn"
	"github.com/kvdir/kvdir/internal/raftfsm"
)

// Config configures a node. Zero durations take the defaults.
type Config struct {
	// ID is the node's Raft server id, unique in the cluster.
	ID string
	// RaftAddr is the address the Raft transport binds; RaftAdvertise the
	// one other members dial (defaults to RaftAddr).
	RaftAddr      string
	RaftAdvertise string
	// APIAddr is the gRPC listen address; APIAdvertise the address other
	// nodes and clients dial (defaults to APIAddr).
	APIAddr      string
	APIAdvertise string
	// HTTPAddr serves /metrics, /healthz and /readyz ("" disables it).
	HTTPAddr string
	// HTTPIdleTimeout closes keep-alive connections to HTTPAddr idle for
	// that long (0: httpserve.DefaultIdleTimeout).
	HTTPIdleTimeout time.Duration
	// Pprof also serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on HTTPAddr, for profiling a running node. Off by
	// default: a CPU profile costs the node while it runs, and the
	// endpoints are unauthenticated, like the rest of HTTPAddr.
	Pprof bool
	// DataDir holds raft.db (log and stable store) and snapshots/.
	DataDir string

	// Bootstrap makes this node a single-member cluster when it has no
	// state yet. InitialCluster, if set, bootstraps every listed member
	// (id -> Raft address) instead; each listed node can be given the
	// same list.
	Bootstrap      bool
	InitialCluster map[string]string
	// Join lists API addresses of existing members; a node without state
	// asks them to add it.
	Join []string
	// Models, when set, are the only models this directory group serves:
	// a worker registration for another model is refused with
	// FailedPrecondition, so that a fleet of several groups never holds a
	// model's workers in two of them. Empty: every model.
	Models []string

	// Lease is how long a worker stays without a heartbeat before the
	// leader expires it (default 10s).
	Lease time.Duration
	// MaxStaleness: a follower that has not heard from a leader for this
	// long (partitioned, or removed from the cluster) refuses reads, so
	// that clients move to a node that has (default 15s).
	MaxStaleness time.Duration
	// ReadyMaxLag: the node is not ready (/readyz) while its applied index
	// is more than this many entries behind the commit index (the
	// leader's, for a follower) (default DefaultReadyMaxLag).
	ReadyMaxLag uint64
	// LoadInterval is how often the leader commits the loads it gathered
	// from heartbeats (default 1s).
	LoadInterval time.Duration
	// SessionTTL forgets sessions not recorded for this long (default 24h).
	SessionTTL time.Duration
	// TestClockOffset is a fault-injection hook, for tests only: it offsets
	// every reading of the wall clock the node uses for leases and for the
	// timestamps it writes into the log (proposal times, the sessions'
	// expiry cutoff), as if this node's clock were that far off. Readings
	// keep Go's monotonic clock, as a skewed host's would, so elapsed times
	// on one node are unchanged. Zero: the real clock.
	TestClockOffset time.Duration

	// SnapshotInterval and SnapshotThreshold are Raft's: how often to check
	// and how many new log entries make a snapshot (defaults 30s, 8192).
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs are kept after a snapshot (default 10,240).
	TrailingLogs uint64
	// HeartbeatTimeout and ElectionTimeout are Raft's (defaults 1s each).
	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
	// ApplyTimeout bounds how long a write waits to be committed (default 10s).
	ApplyTimeout time.Duration

	// FSM bounds the state machine (batch sizes, sessions, index limits).
	FSM raftfsm.Options
	// FollowFeedEntries and FollowFeedBytes bound the in-memory feed of
	// recently applied entries that Follow streams serve from (defaults
	// DefaultFollowFeedEntries and DefaultFollowFeedBytes; see follow.go).
	FollowFeedEntries int
	FollowFeedBytes   int
	// IntentMaxCount and IntentMaxBytes bound the routers' placement
	// intents the node holds (defaults DefaultIntentMaxCount and
	// DefaultIntentMaxBytes; see intents.go).
	IntentMaxCount int
	IntentMaxBytes int

	// TLS, if set, serves the API over TLS. ClientTLS is used to dial other
	// nodes when forwarding (nil: plaintext).
	TLS       *tls.Config
	ClientTLS *tls.Config
	// Tokens enables bearer-token authorisation by role (see auth.go).
	Tokens Tokens
	// AgentCredentials are agent tokens bound to worker id patterns
	// (credentials.go); Tokens.Agent is one more, named "agent", for
	// every id.
	AgentCredentials []Credential
	// MaxWorkersPerCredential bounds the live workers one agent credential
	// owns; Register past it is refused with ResourceExhausted (default
	// DefaultMaxWorkersPerCredential; Unlimited: no bound).
	MaxWorkersPerCredential int
	// MaxStreamsPerCredential bounds the WatchWorkers, Follow and Share
	// streams one credential or role holds on this node (default
	// DefaultMaxStreamsPerCredential; Unlimited: no bound, of those and of
	// Publish streams). An agent credential's Publish streams count apart,
	// up to PublishStreamLimit (PublishStreamsPerWorker per worker of
	// MaxWorkersPerCredential).
	MaxStreamsPerCredential int
	// WorkerBlockQuota bounds the blocks one worker holds in the index:
	// blocks past it are not stored (default DefaultWorkerBlockQuota;
	// Unlimited: no bound). The leader stamps it into each registration,
	// so every replica enforces the value the worker registered under.
	WorkerBlockQuota int64
	// RaftTLS, if set, runs Raft over mutual TLS instead of plain TCP
	// (transport.go).
	RaftTLS *RaftTLS
	// SkipUndecodableEntries lists the log indexes whose entries, if they
	// cannot be decoded, are applied as no-ops instead of stopping the node
	// (undecodable.go). Give every node that stopped at the entry the same
	// list.
	SkipUndecodableEntries []uint64

	// Transport and stores replace the TCP transport and BoltDB (tests
	// only: in-memory Raft with partitions).
	Transport   raft.Transport
	LogStore    raft.LogStore
	StableStore raft.StableStore
	Snapshots   raft.SnapshotStore

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Node is a running directory node.
type Node struct {
	cfg  Config
	log  *slog.Logger
	fsm  *raftfsm.FSM
	raft *raft.Raft

	closers []func() error // stores and transport, closed on shutdown

	grpc    *grpc.Server
	apiLis  net.Listener
	http    *http.Server
	httpLis net.Listener

	fwd     *forwarder
	pub     *publishBatcher
	leases  *leases
	watch   *watchHub
	feed    *feed
	share   *shareState
	metrics *metrics
	auth    *authorizer
	guard   *entryGuard  // undecodable entries
	members *raftMembers // the transport's view of the configuration (RaftTLS)
	commits commitWatch  // the leader's commit index, as sent (catchup.go)

	writeErr  errorBox
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New creates the node, opens its stores and starts Raft, the gRPC server
// and the HTTP server. It returns once everything listens; it does not wait
// for a leader.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node: invalid config: %w", err)
	}
	cfg.setDefaults()
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), stop: make(chan struct{})}
	n.metrics = newMetrics(cfg.Registerer)
	n.watch = newWatchHub()
	fsmOpts := cfg.FSM
	fsmOpts.Logger = n.log
	fsmOpts.Metrics = raftfsm.NewMetrics(cfg.Registerer)
	fsmOpts.OnWorkersChanged = n.watch.changed
	n.feed = newFeed(cfg.FollowFeedEntries, cfg.FollowFeedBytes)
	fsmOpts.OnApplied = n.feed.push
	fsmOpts.OnRestored = n.feed.reset
	n.guard = newEntryGuard(n.log, cfg.SkipUndecodableEntries, cfg.Registerer)
	fsmOpts.Fatal, fsmOpts.SkipUndecodable = n.guard.fatal, n.guard.skipUndecodable
	n.fsm = raftfsm.New(fsmOpts)
	auth, err := newAuthorizer(cfg.Tokens, cfg.AgentCredentials, cfg.MaxStreamsPerCredential,
		PublishStreamLimit(cfg.MaxStreamsPerCredential, cfg.MaxWorkersPerCredential), n.metrics.streamRefused)
	if err != nil {
		return nil, err
	}
	auth.member = n.isPeer
	n.auth = auth
	n.fwd = newForwarder(n)
	n.pub = newPublishBatcher(n)
	n.leases = newLeases()
	n.share = newShareState(n)

	if err := n.startRaft(); err != nil {
		n.closeStores()
		return nil, err
	}
	if err := n.startGRPC(); err != nil {
		n.raft.Shutdown().Error()
		n.closeStores()
		return nil, err
	}
	if err := n.startHTTP(); err != nil {
		n.grpc.Stop()
		n.raft.Shutdown().Error()
		n.closeStores()
		return nil, err
	}
	n.metrics.watchNode(n)
	n.wg.Add(5)
	go n.leaderLoop()
	go n.memberLoop()
	go n.pub.run()
	go n.share.run()
	go n.returnMemory()
	n.log.Info("directory node started", "raft", cfg.RaftAdvertise, "api", n.APIAddr(), "http", n.HTTPAddr())
	return n, nil
}

func (n *Node) startRaft() error {
	cfg := n.cfg
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = min(cfg.HeartbeatTimeout, cfg.ElectionTimeout) / 2
	rc.CommitTimeout = 5 * time.Millisecond
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: slogWriter{n.log}})

	logs, stable, snaps, trans := cfg.LogStore, cfg.StableStore, cfg.Snapshots, cfg.Transport
	if logs == nil || stable == nil {
		if cfg.DataDir == "" {
			return errors.New("node: a data directory is required")
		}
		if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
			return fmt.Errorf("node: data directory: %w", err)
		}
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
		if err != nil {
			return fmt.Errorf("node: open raft.db: %w", err)
		}
		n.closers = append(n.closers, bolt.Close)
		cached, err := raft.NewLogCache(1024, bolt)
		if err != nil {
			return fmt.Errorf("node: log cache: %w", err)
		}
		logs, stable = cached, bolt
	}
	if snaps == nil {
		s, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "snapshots"), 2, rc.Logger)
		if err != nil {
			return fmt.Errorf("node: snapshot store: %w", err)
		}
		snaps = s
	}
	snaps = &recordingSnapshotStore{SnapshotStore: snaps, failed: &n.writeErr}
	if err := n.guard.check(logs, stable, snaps); err != nil {
		return err
	}
	if trans == nil {
		t, closeT, err := n.newTransport(rc.Logger)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, closeT)
		trans = t
	}
	if n.cfg.RaftAdvertise == "" { // an injected transport and no address given
		n.cfg.RaftAdvertise = string(trans.LocalAddr())
	}
	trans = watchTransport(trans, &n.commits, n.stop)
	hasState, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("node: read raft state: %w", err)
	}
	// A failing log store is recorded where it fails: the leader steps down
	// on it, so the proposal that meets it may see only "leadership lost".
	logs = &recordingLogStore{LogStore: logs, failed: &n.writeErr}
	r, err := raft.NewRaft(rc, guardedFSM{n.fsm, n.guard}, logs, stable, snaps, trans)
	if err != nil {
		return fmt.Errorf("node: start raft: %w", err)
	}
	n.raft = r
	n.raftStarted(r)
	n.fwd.watchLeader(r, n.stop, &n.wg)
	if hasState {
		return nil
	}
	var servers []raft.Server
	switch {
	case len(cfg.InitialCluster) > 0:
		for id, addr := range cfg.InitialCluster {
			servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
		}
	case cfg.Bootstrap:
		servers = []raft.Server{{ID: rc.LocalID, Address: trans.LocalAddr()}}
	}
	if len(servers) > 0 {
		err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
		if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("node: bootstrap: %w", err)
		}
	}
	return nil
}

func (n *Node) closeStores() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		if err := n.closers[i](); err != nil {
			n.log.Warn("close", "err", err)
		}
	}
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// APIAddr returns the address the gRPC server listens on.
func (n *Node) APIAddr() string { return n.apiLis.Addr().String() }

// HTTPAddr returns the address the HTTP server listens on, or "".
func (n *Node) HTTPAddr() string {
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// Raft exposes the Raft instance (tests and the admin service).
func (n *Node) Raft() *raft.Raft { return n.raft }

// FSM exposes the state machine (tests and reads).
func (n *Node) FSM() *raftfsm.FSM { return n.fsm }

// IsLeader reports whether this node is the Raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Shutdown stops the node: if it leads, it first hands leadership to
// another member, then stops serving, stops Raft and closes its stores.
func (n *Node) Shutdown(ctx context.Context) error {
	var err error
	n.closeOnce.Do(func() {
		if n.IsLeader() && len(n.raft.GetConfiguration().Configuration().Servers) > 1 {
			// Bounded: a transfer waits for the target to catch up and can
			// take far longer than the caller's shutdown budget (a chaos run
			// saw 35 s); past half of the budget the node stops anyway and the
			// others elect a leader as after a crash.
			if e := waitFuture(ctx, n.raft.LeadershipTransfer(), shutdownTransferMax); e != nil {
				n.log.Warn("leadership transfer on shutdown failed; stopping anyway", "err", e)
			} else {
				n.log.Info("handed over leadership")
			}
		}
		close(n.stop)
		n.watch.close()
		n.feed.close()
		// Every phase is bounded and a slow one is logged: a chaos run's
		// rolling restart once saw a follower's shutdown pass the process's
		// hard limit without saying where it was. Unary calls finish in
		// milliseconds and the node ends its own streams, so GracefulStop
		// gets a third of the budget (at most 5 s) before open calls are cut.
		slow := func(phase string, start time.Time) {
			if d := time.Since(start); d > time.Second {
				n.log.Warn("shutdown phase was slow", "phase", phase, "took", d.Round(time.Millisecond))
			}
		}
		start := time.Now()
		done := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(done) }()
		grace := 5 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			grace = min(grace, time.Until(dl)/3)
		}
		t := time.NewTimer(grace)
		select {
		case <-done:
		case <-t.C:
			n.log.Warn("gRPC calls still open after the grace period; cutting them", "grace", grace)
			n.grpc.Stop()
		case <-ctx.Done():
			n.grpc.Stop()
		}
		t.Stop()
		slow("grpc", start)
		if n.http != nil {
			start = time.Now()
			hctx, cancel := context.WithTimeout(ctx, grace)
			n.http.Shutdown(hctx)
			cancel()
			slow("http", start)
		}
		n.fwd.close()
		start = time.Now()
		if e := waitFuture(ctx, n.raft.Shutdown(), time.Minute); e != nil {
			err = fmt.Errorf("raft shutdown: %w", e)
		}
		slow("raft", start)
		start = time.Now()
		n.wg.Wait()
		slow("node loops", start)
		n.closeStores()
		n.log.Info("directory node stopped")
	})
	return err
}

// recordingLogStore records every failure to append to the Raft log.
type recordingLogStore struct {
	raft.LogStore
	failed *errorBox
}

func (s *recordingLogStore) StoreLog(l *raft.Log) error {
	return s.record(s.LogStore.StoreLog(l))
}

func (s *recordingLogStore) StoreLogs(ls []*raft.Log) error {
	return s.record(s.LogStore.StoreLogs(ls))
}

// IsMonotonic passes on the wrapped store's raft.MonotonicLogStore answer.
func (s *recordingLogStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (s *recordingLogStore) record(err error) error {
	if err != nil {
		s.failed.set(fmt.Errorf("raft log store: %w", err))
	}
	return err
}

// recordingSnapshotStore records every failure to write a snapshot: a full
// disk shows there first when the log store has free pages to reuse.
type recordingSnapshotStore struct {
	raft.SnapshotStore
	failed *errorBox
}

func (s *recordingSnapshotStore) Create(version raft.SnapshotVersion, index, term uint64, configuration raft.Configuration,
	configurationIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := s.SnapshotStore.Create(version, index, term, configuration, configurationIndex, trans)
	if err != nil {
		s.failed.set(fmt.Errorf("raft snapshot store: %w", err))
		return nil, err
	}
	return &recordingSink{SnapshotSink: sink, failed: s.failed}, nil
}

type recordingSink struct {
	raft.SnapshotSink
	failed *errorBox
}

func (k *recordingSink) Write(p []byte) (int, error) {
	n, err := k.SnapshotSink.Write(p)
	if err != nil {
		k.failed.set(fmt.Errorf("raft snapshot store: %w", err))
	}
	return n, err
}

func (k *recordingSink) Close() error {
	err := k.SnapshotSink.Close()
	if err != nil {
		k.failed.set(fmt.Errorf("raft snapshot store: %w", err))
	}
	return err
}

// errorBox holds the latest write failure, for status and readiness.
type errorBox struct {
	mu  sync.Mutex
	err error
	at  time.Time
}

func (b *errorBox) set(err error) {
	b.mu.Lock()
	b.err, b.at = err, time.Now()
	b.mu.Unlock()
}

func (b *errorBox) get() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil && time.Since(b.at) > time.Minute {
		b.err = nil // a failure that has not recurred for a minute is over
	}
	return b.err
}

// slogWriter passes Raft's log lines (hclog's text format: time, [LEVEL],
// message and key=value pairs) on to the node's logger at their level.
type slogWriter struct{ log *slog.Logger }

var hclogLevels = []struct {
	tag   string
	level slog.Level
}{{"[ERROR]", slog.LevelError}, {"[WARN]", slog.LevelWarn}, {"[INFO]", slog.LevelInfo}, {"[DEBUG]", slog.LevelDebug}, {"[TRACE]", slog.LevelDebug}}

func (w slogWriter) Write(p []byte) (int, error) {
	line, level := strings.TrimSpace(string(p)), slog.LevelWarn
	for _, l := range hclogLevels {
		if _, rest, ok := strings.Cut(line, l.tag); ok {
			line, level = strings.TrimSpace(rest), l.level
			break
		}
	}
	w.log.Log(context.Background(), level, line, "component", "raft")
	return len(p), nil
}

// shutdownTransferMax bounds the leadership hand-over on shutdown when the
// caller's context has no earlier deadline.
const shutdownTransferMax = 10 * time.Second

// waitFuture waits for fut until it completes, half of ctx's remaining time
// passes, or maxWait passes, whichever comes first.
func waitFuture(ctx context.Context, fut raft.Future, maxWait time.Duration) error {
	limit := maxWait
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl)/2)
	}
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("not done after %v", limit)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// now reads the clock the node uses for leases and log timestamps: the
// wall clock, offset by Config.TestClockOffset.
func (n *Node) now() time.Time {
	if n.cfg.TestClockOffset == 0 {
		return time.Now()
	}
	return time.Now().Add(n.cfg.TestClockOffset)
}

// returnMemory gives the garbage of a burst of applied entries (a flood of
// events, a catch-up) back to the operating system once the burst ends, so
// that the node's resident size reflects what it holds (internal/memreturn).
func (n *Node) returnMemory() {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-n.stop; cancel() }()
	memreturn.New(memreturn.Config{Activity: n.fsm.AppliedIndex, OnReturn: func(allocated uint64) {
		n.metrics.memReturns.Inc()
		n.log.Debug("returned freed memory at the end of a burst", "allocated_mib", allocated>>20)
	}}).Run(ctx)
}
