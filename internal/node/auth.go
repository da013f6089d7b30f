package node

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Tokens are the bearer tokens of the router and admin roles, and the
// agent token (an agent credential named "agent" for every worker id; see
// Credential for per-agent ones). When none is set and no agent credential
// is configured, authorisation is off (every call is allowed): fine on a
// laptop, not in a cluster.
//
//   - agent: register workers whose ids its credential's patterns match,
//     and publish, heartbeat and deregister for a worker it registered
//     (those calls must also carry the worker token that Register returned,
//     in metadata "kvdir-worker-token");
//   - router: every directory read, recording sessions, and cluster status;
//   - admin: everything, including membership and draining workers, and
//     acting for any worker without its token.
type Tokens struct {
	Agent, Router, Admin string
}

type role int

const (
	roleAgent role = 1 << iota
	roleRouter
	roleAdmin
)

// methodRoles says which roles may call each method. Methods not listed
// (health, reflection) need no token.
var methodRoles = map[string]role{
	"/kvdir.v1.AgentService/Register":   roleAgent,
	"/kvdir.v1.AgentService/Publish":    roleAgent,
	"/kvdir.v1.AgentService/Heartbeat":  roleAgent,
	"/kvdir.v1.AgentService/Deregister": roleAgent,

	"/kvdir.v1.DirectoryService/Match":          roleRouter,
	"/kvdir.v1.DirectoryService/ListWorkers":    roleRouter,
	"/kvdir.v1.DirectoryService/GetWorker":      roleRouter,
	"/kvdir.v1.DirectoryService/RecordSessions": roleRouter,
	"/kvdir.v1.DirectoryService/WhoHolds":       roleRouter,
	"/kvdir.v1.DirectoryService/ListSessions":   roleRouter,
	"/kvdir.v1.DirectoryService/WatchWorkers":   roleRouter,
	"/kvdir.v1.DirectoryService/Follow":         roleRouter,
	"/kvdir.v1.DirectoryService/Share":          roleRouter,

	"/kvdir.v1.AdminService/Status":             roleRouter,
	"/kvdir.v1.AdminService/AddMember":          0,
	"/kvdir.v1.AdminService/RemoveMember":       0,
	"/kvdir.v1.AdminService/TransferLeadership": 0,
	"/kvdir.v1.AdminService/Snapshot":           0,
	"/kvdir.v1.AdminService/DrainWorker":        0,
	"/kvdir.v1.AdminService/ExpireWorker":       0,
}

// limitedStreams are the long-lived streams each credential (or role) may
// hold only so many of on one node (Config.MaxStreamsPerCredential).
var limitedStreams = map[string]string{
	"/kvdir.v1.DirectoryService/WatchWorkers": "WatchWorkers",
	"/kvdir.v1.DirectoryService/Follow":       "Follow",
	"/kvdir.v1.DirectoryService/Share":        "Share",
}

// publishMethod is the agents' Publish stream, bounded per agent credential
// apart from limitedStreams (see PublishStreamsPerWorker).
const publishMethod = "/kvdir.v1.AgentService/Publish"

// PublishStreamsPerWorker is how many Publish streams one agent credential
// may hold on one node per worker it may own: its Publish bound is
// PublishStreamsPerWorker × Config.MaxWorkersPerCredential.
//
// An agent holds one Publish stream per worker at a time: the agent's
// dirclient.Publisher opens the next only after the last one's call ended
// (and kvbench's directory tool, with or without --conn-per-worker, opens
// one per worker). But a node counts a stream until its handler returns,
// which is later than the agent letting go of it: an abandoned stream
// (a broken connection, a switch to the leader, a re-registration, an
// agent restarted after kill -9 whose old connection the node has not yet
// found dead) still waits for the answers of its in-flight batches, and a
// stream a follower forwarded lingers on the leader until the follower's
// side ends. So for a moment a worker may count twice or three times on a
// node. Four per worker leaves room for that on every worker at once, so
// the bound never refuses a credential that runs no more workers than it
// may own, while it stops one that opens streams without end. The bound
// cannot share the WatchWorkers/Follow/Share count: its default (256) is
// the default worker bound, with no room for a reconnect, and an operator
// raising --max-workers-per-credential would have to know to raise it too.
const PublishStreamsPerWorker = 4

// PublishStreamLimit is the Publish streams one agent credential may hold
// on one node, given Config.MaxStreamsPerCredential and
// Config.MaxWorkersPerCredential: 0 (no bound) when either is unbounded.
func PublishStreamLimit(maxStreams, maxWorkers int) int {
	if maxStreams <= 0 || maxWorkers <= 0 {
		return 0
	}
	return min(maxWorkers, math.MaxInt/PublishStreamsPerWorker) * PublishStreamsPerWorker
}

type authorizer struct {
	on            bool
	router, admin string
	creds         []Credential

	maxStreams int // per credential or role; <= 0: unlimited
	maxPublish int // Publish streams per agent credential; <= 0: unlimited
	refusals   func(method, holder string)
	// member reports whether id is a member of the cluster: another node's
	// relay of its routers' intents (a Share stream marked with
	// kvdirv1.MetadataRelay) counts under that node, not against the
	// routers' own streams. Nil: every relay counts as the router's.
	member     func(id string) bool
	mu         sync.Mutex
	streams    map[string]int // holder -> open limited streams
	publishing map[string]int // agent credential holder -> open Publish streams
}

func newAuthorizer(t Tokens, creds []Credential, maxStreams, maxPublish int, refusals func(method, holder string)) (*authorizer, error) {
	all, err := agentCredentials(t, creds)
	if err != nil {
		return nil, err
	}
	a := &authorizer{router: t.Router, admin: t.Admin, creds: all, maxStreams: maxStreams, maxPublish: maxPublish,
		refusals: refusals, streams: map[string]int{}, publishing: map[string]int{}}
	a.on = t.Router != "" || t.Admin != "" || len(all) > 0
	if a.on && (len(all) == 0 || t.Router == "" || t.Admin == "") {
		return nil, errors.New("node: set the router and admin tokens and an agent token or credential, or none")
	}
	return a, nil
}

// caller is who a call's bearer tokens say it comes from.
type caller struct {
	roles role
	cred  *Credential // the agent credential matched, if any
}

// holder names the caller for per-credential limits.
func (c caller) holder() string {
	switch {
	case c.roles&roleAdmin != 0:
		return "admin"
	case c.cred != nil:
		return "agent:" + c.cred.Name
	case c.roles&roleRouter != 0:
		return "router"
	}
	return "anonymous"
}

// identify returns the roles the call's bearer tokens grant. Every token is
// compared with every configured one in constant time.
func (a *authorizer) identify(ctx context.Context) caller {
	md, _ := metadata.FromIncomingContext(ctx)
	var c caller
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		if eq(tok, a.router) {
			c.roles |= roleRouter
		}
		if eq(tok, a.admin) {
			c.roles |= roleAdmin
		}
		for i := range a.creds {
			if eq(tok, a.creds[i].Token) && c.cred == nil {
				c.roles |= roleAgent
				c.cred = &a.creds[i]
			}
		}
	}
	return c
}

func eq(tok, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(want)) == 1
}

func (a *authorizer) check(ctx context.Context, method string) error {
	if !a.on {
		return nil
	}
	need, listed := methodRoles[method]
	if !listed {
		return nil
	}
	have := a.identify(ctx).roles
	switch {
	case have&roleAdmin != 0 || have&need != 0:
		return nil
	case have == 0:
		return status.Error(codes.Unauthenticated, "missing or unknown bearer token (metadata \"authorization: Bearer <token>\")")
	}
	return status.Errorf(codes.PermissionDenied, "this token's role may not call %s", method)
}

// registrant is who a Register call registers for: the owner to record
// and whether it may take over another owner's live worker (an
// administrator). It refuses a worker id outside the credential's
// patterns.
func (a *authorizer) registrant(ctx context.Context, id string) (owner string, override bool, err error) {
	if !a.on {
		return "", false, nil
	}
	c := a.identify(ctx)
	switch {
	case c.roles&roleAdmin != 0:
		return "", true, nil
	case c.cred == nil:
		return "", false, status.Error(codes.PermissionDenied, "register: only an agent credential or the admin token may register workers")
	case !c.cred.Allows(id):
		return "", false, status.Errorf(codes.PermissionDenied,
			"register: credential %q may not register worker %q (its patterns: %s)", c.cred.Name, id, strings.Join(c.cred.Patterns, ","))
	}
	return c.cred.Name, false, nil
}

// newWorkerToken draws a worker token: 32 random bytes, hex-encoded. The
// state machine keeps only its hash (hashToken).
func newWorkerToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw a worker token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func hashToken(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return h[:]
}

// errWorkerGone says that a worker call's worker has no live record: the
// caller answers as the state machine would (unknown worker) without
// proposing anything, so that no check is skipped for a command that could
// meet a registration made in between.
var errWorkerGone = errors.New("worker is not registered")

// checkWorker verifies, on the node that serves the call (the leader), that
// an agent's call for worker id carries the token of the worker's current
// epoch and comes from the credential that owns it. Administrators may act
// for any worker. A follower forwards these calls without checking: its
// copy of the registry may lag behind a registration the agent has already
// been answered.
func (n *Node) checkWorker(ctx context.Context, id string) error {
	a := n.auth
	if !a.on {
		return nil
	}
	c := a.identify(ctx)
	if c.roles&roleAdmin != 0 {
		return nil
	}
	if c.cred == nil {
		return status.Error(codes.PermissionDenied, "only an agent credential or the admin token may act for a worker")
	}
	wa, ok := n.fsm.WorkerAuth(id)
	if !ok || !wa.Alive {
		return errWorkerGone
	}
	if !c.cred.Allows(id) || wa.Owner != "" && wa.Owner != c.cred.Name {
		return status.Errorf(codes.PermissionDenied, "worker %q is owned by credential %q, not %q", id, wa.Owner, c.cred.Name)
	}
	if tokenMatches(ctx, wa.TokenHash) {
		return nil
	}
	// A leader elected a moment ago may not have applied the registration
	// yet: catch up with what is committed (no log entry) and look again.
	if n.catchUp(ctx) {
		if wa2, ok := n.fsm.WorkerAuth(id); ok && wa2.Alive && wa2.Epoch != wa.Epoch && tokenMatches(ctx, wa2.TokenHash) {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied,
		"no valid worker token for %q at epoch %d: send the token its latest Register returned (metadata %q), or register again", id, wa.Epoch, MDWorkerToken)
}

func tokenMatches(ctx context.Context, want []byte) bool {
	if len(want) == 0 {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(MDWorkerToken) {
		if subtle.ConstantTimeCompare(hashToken(v), want) == 1 {
			return true
		}
	}
	return false
}

// catchUp waits briefly until the state machine has applied what Raft has
// committed, and reports whether it got there.
func (n *Node) catchUp(ctx context.Context) bool {
	target := n.raft.CommitIndex()
	if n.fsm.AppliedIndex() >= target {
		return false // nothing more to learn
	}
	deadline := time.NewTimer(time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n.fsm.AppliedIndex() < target {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// shareMethod is the routers' (and the nodes' relays') Share stream.
const shareMethod = "/kvdir.v1.DirectoryService/Share"

// relayFrom returns the member node a router-role Share stream says it
// relays for, or "". Each node relays to each other one, so with peers'
// relays counted as the router's, a cluster of n nodes took n−1 of every
// node's router streams before any router connected. A claim of a
// non-member counts as the router's own, so the claim cannot be used to
// open streams without bound.
func (a *authorizer) relayFrom(ctx context.Context, method string, c caller) string {
	if method != shareMethod || a.member == nil || c.roles&roleRouter == 0 {
		return ""
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if from := md.Get(kvdirv1.MetadataRelay); len(from) == 1 && a.member(from[0]) {
		return from[0]
	}
	return ""
}

// acquireStream counts a limited stream against its holder; release undoes
// it. It refuses with ResourceExhausted a WatchWorkers, Follow or Share
// stream over Config.MaxStreamsPerCredential, and an agent credential's
// Publish stream over PublishStreamLimit. The administrator's Publish
// streams, and every Publish stream when authorisation is off, are not
// counted: no worker bound applies to them either, so no Publish bound
// could be sized to spare an honest deployment.
func (a *authorizer) acquireStream(ctx context.Context, method string) (release func(), err error) {
	var (
		name  string
		count map[string]int
		limit int
		what  string // the refusal's explanation
		c     caller
	)
	if method == publishMethod {
		c = a.identify(ctx)
		if !a.on || a.maxPublish <= 0 || c.cred == nil || c.roles&roleAdmin != 0 {
			return func() {}, nil
		}
		name, count, limit = "Publish", a.publishing, a.maxPublish
		what = fmt.Sprintf("Publish streams on this node (the limit: %d per worker it may own, --max-workers-per-credential %d); close some or raise --max-workers-per-credential",
			PublishStreamsPerWorker, limit/PublishStreamsPerWorker)
	} else {
		var limited bool
		if name, limited = limitedStreams[method]; !limited || a.maxStreams <= 0 {
			return func() {}, nil
		}
		c, count, limit = a.identify(ctx), a.streams, a.maxStreams
		what = "WatchWorkers, Follow and Share streams on this node (the limit); close some or raise --max-streams-per-credential"
	}
	holder := c.holder()
	if from := a.relayFrom(ctx, method, c); from != "" {
		holder = "relay:" + from
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if count[holder] >= limit {
		if a.refusals != nil {
			a.refusals(name, holder)
		}
		return nil, status.Errorf(codes.ResourceExhausted, "%s: %s already holds %d %s", name, holder, limit, what)
	}
	count[holder]++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			if count[holder]--; count[holder] <= 0 {
				delete(count, holder)
			}
		})
	}, nil
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	release, err := a.acquireStream(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return h(srv, ss)
}

// stampRegister fills in what the leader adds to a registration: the owner,
// the hash of a new worker token (returned), and the bounds every replica
// enforces.
func (n *Node) stampRegister(ctx context.Context, c *kvdirv1.RegisterCommand) (token string, err error) {
	owner, override, err := n.auth.registrant(ctx, c.Worker.GetId())
	if err != nil {
		return "", err
	}
	c.Owner, c.Override = owner, override
	if n.auth.on {
		if token, err = newWorkerToken(); err != nil {
			return "", status.Error(codes.Internal, err.Error())
		}
		c.TokenHash = hashToken(token)
		if lim := n.cfg.MaxWorkersPerCredential; lim > 0 && owner != "" {
			c.MaxOwnerWorkers = uint32(min(lim, 1<<31))
		}
	}
	if q := n.cfg.WorkerBlockQuota; q > 0 {
		c.BlockQuota = uint64(q)
	}
	return token, nil
}
