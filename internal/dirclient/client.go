// Package dirclient is the Go client of the kvdir directory, used by the
// agent, the router and the operator CLI.
//
// A Client keeps one gRPC connection per directory node. Reads go to the
// node that answered last and fail over to the next node when one is
// unreachable; writes go to the Raft leader, which the client learns from
// the "kvdir-leader" header of every response, and are retried on another
// node while the cluster answers Unavailable. Any other error is final and
// returned at once. The client attaches the bearer token of Config.Token and,
// for a worker it registered, the worker token Register returned.
//
// A Publisher streams one worker's event batches: it numbers them, keeps
// every batch until the directory acknowledges it, and re-sends the
// unacknowledged ones after a reconnection. The directory answers DUPLICATE
// for a batch it already applied, so each batch applies exactly once.
package dirclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Metadata keys shared with the directory nodes (internal/node).
const (
	mdAuthorization = "authorization"
	mdLeader        = kvdirv1.MetadataLeader
	mdWorkerToken   = kvdirv1.MetadataWorkerToken
)

// Defaults of Config.
const (
	DefaultCallTimeout = 5 * time.Second
	DefaultDialTimeout = 2 * time.Second
)

const (
	// maxMessage matches the nodes' message limit.
	maxMessage = 64 << 20
	// retryBase and retryMax bound the pause between retries.
	retryBase = 25 * time.Millisecond
	retryMax  = 500 * time.Millisecond
	// suspectFor is how long an address that failed is tried after the
	// others.
	suspectFor = 2 * time.Second
)

// ErrUnreachable is wrapped by the error of a call that no node answered
// before its deadline.
var ErrUnreachable = errors.New("no directory node answered")

// ErrClosed is returned by calls on a closed Client or Publisher.
var ErrClosed = errors.New("closed")

// Config configures a Client.
type Config struct {
	// Addrs are the gRPC addresses of directory nodes (host:port). More may
	// be learned from the leader header.
	Addrs []string
	// Token is the bearer token sent as "authorization: Bearer <token>"
	// (none if empty).
	Token string
	// TLS dials the nodes over TLS (plaintext if nil).
	TLS *tls.Config
	// DialTimeout bounds establishing one connection (default 2s).
	DialTimeout time.Duration
	// CallTimeout bounds a call, retries included, when its context has no
	// deadline (default 5s).
	CallTimeout time.Duration
	// Logger receives failovers and reconnections (default slog.Default()).
	Logger *slog.Logger
	// Dialer, if set, opens the connections in place of a TCP dial of the
	// address: for a client outside the network the nodes' advertised
	// addresses resolve in (a test harness on a container host), which
	// maps those names to reachable addresses. Nil: dial the address.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Client is a directory client. It is safe for concurrent use.
type Client struct {
	cfg      Config
	log      *slog.Logger
	dialOpts []grpc.DialOption

	mu         sync.Mutex
	addrs      []string // known addresses: configured first, then learned
	conns      map[string]*grpc.ClientConn
	preferred  string               // the address that answered last
	leader     string               // the leader's API address, if known
	suspect    map[string]time.Time // when an address last failed
	lastErr    error                // the latest failed attempt, with its address (LastFailure)
	lastAddr   string
	lastAt     time.Time
	answeredAt time.Time         // when a node last answered
	tokens     map[string]string // worker id -> worker token
	pubs       map[*Publisher]struct{}
	closed     bool

	// onAttempt, if set (tests), is called before every attempt.
	onAttempt func(op, addr string)
}

// New returns a client of the nodes at cfg.Addrs. Connections are made
// lazily, on first use.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("dirclient: no directory address given (Config.Addrs is empty)")
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	} else if cfg.Token != "" {
		cfg.Logger.Warn("dirclient: sending a bearer token without TLS")
	}
	c := &Client{
		cfg: cfg,
		log: cfg.Logger,
		dialOpts: []grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			// Ping while a stream is open, to notice a dead node (the
			// server allows pings every 10 s).
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 5 * time.Second}),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{
					BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
				},
				MinConnectTimeout: cfg.DialTimeout,
			}),
		},
		conns:   make(map[string]*grpc.ClientConn),
		suspect: make(map[string]time.Time),
		tokens:  make(map[string]string),
		pubs:    make(map[*Publisher]struct{}),
	}
	if cfg.Dialer != nil {
		c.dialOpts = append(c.dialOpts, grpc.WithContextDialer(cfg.Dialer))
	}
	for _, a := range cfg.Addrs {
		a = strings.TrimSpace(a)
		if a == "" {
			c.closeConns()
			return nil, errors.New("dirclient: empty address in Config.Addrs")
		}
		c.mu.Lock()
		_, err := c.connLocked(a)
		c.mu.Unlock()
		if err != nil {
			c.closeConns()
			return nil, err
		}
	}
	c.preferred = c.addrs[0]
	return c, nil
}

// Close stops the client's publishers and closes its connections.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	pubs := make([]*Publisher, 0, len(c.pubs))
	for p := range c.pubs {
		pubs = append(pubs, p)
	}
	c.mu.Unlock()
	for _, p := range pubs {
		p.Close()
	}
	return c.closeConns()
}

func (c *Client) closeConns() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for a, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("dirclient: close connection to %s: %w", a, err))
		}
	}
	clear(c.conns)
	return errors.Join(errs...)
}

// Addrs returns the node addresses the client knows, configured ones first.
func (c *Client) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.addrs)
}

// Leader returns the leader's API address as the nodes last reported it,
// or "" when unknown.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// SetWorkerToken records the worker token for a worker registered
// elsewhere (Register records it by itself).
func (c *Client) SetWorkerToken(workerID, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if token == "" {
		delete(c.tokens, workerID)
		return
	}
	c.tokens[workerID] = token
}

// connLocked returns the connection to addr, creating it (and adding addr
// to the known addresses) if needed. c.mu must be held.
func (c *Client) connLocked(addr string) (*grpc.ClientConn, error) {
	if c.closed {
		return nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	target := addr
	if c.cfg.Dialer != nil {
		target = "passthrough:///" + addr // the Dialer resolves it
	}
	cc, err := grpc.NewClient(target, c.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dirclient: connection to %s: %w", addr, err)
	}
	c.conns[addr] = cc
	if !slices.Contains(c.addrs, addr) {
		c.addrs = append(c.addrs, addr)
	}
	return cc, nil
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connLocked(addr)
}

// order returns the addresses to try: the leader first for writes (when
// known), else the address that answered last, then the others in turn;
// addresses that failed recently come last.
func (c *Client) order(write bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.preferred
	if write && c.leader != "" {
		first = c.leader
	}
	start := max(slices.Index(c.addrs, first), 0)
	out := make([]string, 0, len(c.addrs))
	out = append(out, c.addrs[start:]...)
	out = append(out, c.addrs[:start]...)
	now := time.Now()
	bad := func(a string) bool { t, ok := c.suspect[a]; return ok && now.Sub(t) < suspectFor }
	slices.SortStableFunc(out, func(a, b string) int {
		switch ba, bb := bad(a), bad(b); {
		case ba == bb:
			return 0
		case bb:
			return -1
		}
		return 1
	})
	return out
}

// answered records that addr answered a call.
func (c *Client) answered(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.preferred, c.answeredAt = addr, time.Now()
	delete(c.suspect, addr)
}

// failed records that a call to addr failed in a way worth trying another
// node for.
func (c *Client) failed(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.suspect[addr] = time.Now()
	if c.leader == addr {
		c.leader = ""
	}
}

// noteError records err as the latest failed attempt at addr.
func (c *Client) noteError(addr string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr, c.lastAddr, c.lastAt = err, addr, time.Now()
}

// Failure is a failed attempt at one node.
type Failure struct {
	Addr string    // the node's address
	Err  error     // what failed
	At   time.Time // when
}

// LastFailure returns the latest failed attempt of a call or of the worker
// watch that another node could answer (unreachable, no leader, timed
// out); ok is false if none failed or a node has answered since.
func (c *Client) LastFailure() (f Failure, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastErr == nil || !c.lastAt.After(c.answeredAt) {
		return Failure{}, false
	}
	return Failure{Addr: c.lastAddr, Err: c.lastErr, At: c.lastAt}, true
}

// recentlyFailed reports whether addr failed recently.
func (c *Client) recentlyFailed(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.suspect[addr]
	return ok && time.Since(t) < suspectFor
}

// noteHeader learns the leader's address from a response header.
func (c *Client) noteHeader(md metadata.MD) {
	v := md.Get(mdLeader)
	if len(v) == 0 || v[0] == "" {
		return
	}
	addr := v[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.leader == addr {
		return
	}
	if _, err := c.connLocked(addr); err != nil {
		c.log.Warn("dirclient: cannot connect to the reported leader", "addr", addr, "err", err)
		return
	}
	c.log.Debug("dirclient: leader learned", "addr", addr)
	c.leader = addr
}

// forgetLeader drops the leader hint (after a leadership transfer).
func (c *Client) forgetLeader() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = ""
}

// workerMD returns the metadata of calls for a worker: its token, if known.
func (c *Client) workerMD(workerID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tok, ok := c.tokens[workerID]; ok {
		return []string{mdWorkerToken, tok}
	}
	return nil
}

// outgoing adds the bearer token and extra metadata pairs to ctx.
func (c *Client) outgoing(ctx context.Context, extra []string) context.Context {
	var kv []string
	if c.cfg.Token != "" {
		kv = append(kv, mdAuthorization, "Bearer "+c.cfg.Token)
	}
	kv = append(kv, extra...)
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// withTimeout applies CallTimeout to a context without a deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.cfg.CallTimeout)
}

// failFastKey marks a context made by FailFast.
type failFastKey struct{}

// FailFast returns ctx marked so that a read made with it gives up after
// one round of the nodes when every node tried was unavailable (a refused
// or failed dial, a node shutting down: gRPC's Unavailable), instead of
// retrying them until the deadline. Attempts are fail-fast gRPC calls
// (WaitForReady(false)), so a node whose connection is in transient
// failure answers Unavailable at once. The router's look-ups use it: with
// every directory node down each fails at once, as an error its breaker
// counts, rather than waiting out its deadline. A slow node (an attempt
// that timed out) still gets the usual retries.
func FailFast(ctx context.Context) context.Context {
	return context.WithValue(ctx, failFastKey{}, true)
}

func isFailFast(ctx context.Context) bool {
	v, _ := ctx.Value(failFastKey{}).(bool)
	return v
}

// allUnavailable reports whether every one of addrs was tried and its last
// attempt answered Unavailable.
func allUnavailable(tried []attemptError, addrs []string) bool {
	if len(tried) < len(addrs) {
		return false
	}
	for _, a := range addrs {
		i := slices.IndexFunc(tried, func(t attemptError) bool { return t.addr == a })
		if i < 0 || status.Code(tried[i].err) != codes.Unavailable {
			return false
		}
	}
	return true
}

// rpcFunc makes one attempt of a call on a connection.
type rpcFunc[T any] func(ctx context.Context, cc *grpc.ClientConn, opts ...grpc.CallOption) (T, error)

// retryable reports whether a failed attempt is worth making on another
// node: the node is unreachable or has no leader (Unavailable), or the
// attempt's own time ran out, or it was cancelled, while the call itself
// goes on. (gRPC reports a connection that was torn down while the attempt
// waited for it, as when a node restarts, as Canceled; a chaos run saw a
// publisher give up on it, re-register, and wipe its worker's blocks.)
func retryable(callCtx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.DeadlineExceeded, codes.Canceled:
		return callCtx.Err() == nil
	}
	return false
}

// call runs f against the nodes until one answers, an error is final, or
// the deadline passes. Reads start with the node that answered last and
// give each node but the last of a round half of the remaining time;
// writes start with the leader and pause briefly between attempts.
func call[T any](c *Client, ctx context.Context, op string, write bool, md []string, f rpcFunc[T]) (T, error) {
	var zero T
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	var tried []attemptError
	delay := retryBase
	oneRound := !write && isFailFast(ctx)
	for {
		addrs := c.order(write)
		for i, addr := range addrs {
			if c.onAttempt != nil {
				c.onAttempt(op, addr)
			}
			cc, err := c.conn(addr)
			if err != nil {
				return zero, fmt.Errorf("dirclient: %s: %w", op, err)
			}
			actx, acancel := ctx, context.CancelFunc(func() {})
			if dl, _ := ctx.Deadline(); !write && i < len(addrs)-1 {
				actx, acancel = context.WithTimeout(ctx, time.Until(dl)/2)
			}
			var hdr metadata.MD
			resp, err := f(c.outgoing(actx, md), cc, grpc.Header(&hdr), grpc.WaitForReady(false))
			acancel()
			c.noteHeader(hdr)
			if err == nil {
				c.answered(addr)
				return resp, nil
			}
			if errors.Is(ctx.Err(), context.Canceled) {
				return zero, fmt.Errorf("dirclient: %s: %w", op, ctx.Err())
			}
			if ctx.Err() == nil && !retryable(ctx, err) {
				return zero, c.finalError(op, addr, err)
			}
			c.failed(addr)
			c.noteError(addr, err)
			tried = record(tried, addr, err)
			c.log.Debug("dirclient: attempt failed", "op", op, "addr", addr, "err", err)
			if ctx.Err() != nil {
				return zero, c.exhausted(ctx, op, tried)
			}
			if oneRound && i == len(addrs)-1 && allUnavailable(tried, addrs) {
				e := c.exhausted(ctx, op, tried)
				if ue, ok := e.(*UnreachableError); ok {
					ue.ctx, ue.Refused = nil, true
				}
				return zero, e
			}
			if write || i == len(addrs)-1 {
				if !sleep(ctx, delay) {
					return zero, c.exhausted(ctx, op, tried)
				}
				delay = min(2*delay, retryMax)
			}
			if write && c.Leader() != "" {
				break // a leader may have been learned: start again from it
			}
		}
	}
}

// sleep waits for d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

type attemptError struct {
	addr string
	err  error
}

// record keeps the latest error per address, in the order first tried.
func record(tried []attemptError, addr string, err error) []attemptError {
	for i := range tried {
		if tried[i].addr == addr {
			tried[i].err = err
			return tried
		}
	}
	return append(tried, attemptError{addr, err})
}

// UnreachableError is the error of a call that no node answered before its
// deadline, or, with FailFast, in one round. It wraps ErrUnreachable, the
// last attempt's error (whose gRPC status code status.Code reports) and,
// unless Refused, the context's.
type UnreachableError struct {
	Op string
	// Attempts holds the last error seen from each node tried.
	Attempts map[string]error
	// NoLeader is set when the nodes that answered had no leader.
	NoLeader bool
	// Refused is set when a FailFast call gave up after one round in which
	// every node was unavailable, before its deadline.
	Refused bool

	order []string
	last  error
	ctx   error
}

func (e *UnreachableError) Error() string {
	var b strings.Builder
	if e.Refused {
		fmt.Fprintf(&b, "dirclient: %s: %v (every node unavailable); tried ", e.Op, ErrUnreachable)
	} else {
		fmt.Fprintf(&b, "dirclient: %s: %v (%v); tried ", e.Op, ErrUnreachable, e.ctx)
	}
	for i, a := range e.order {
		if i > 0 {
			b.WriteString("; ")
		}
		err := e.Attempts[a]
		if s, ok := status.FromError(err); ok {
			fmt.Fprintf(&b, "%s: %s: %s", a, s.Code(), s.Message())
		} else {
			fmt.Fprintf(&b, "%s: %v", a, err)
		}
	}
	if e.NoLeader {
		b.WriteString(": the cluster has no leader (an election may be under way, or a majority of the nodes is down); retry later")
	} else {
		b.WriteString(": check that the directory nodes run and that Config.Addrs lists their gRPC addresses")
	}
	return b.String()
}

// Unwrap returns ErrUnreachable, the last attempt's error and the context's.
func (e *UnreachableError) Unwrap() []error {
	if e.ctx == nil {
		return []error{ErrUnreachable, e.last}
	}
	return []error{ErrUnreachable, e.last, e.ctx}
}

// GRPCStatus reports the error as Unavailable.
func (e *UnreachableError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

func (c *Client) exhausted(ctx context.Context, op string, tried []attemptError) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("dirclient: %s: %w", op, ctx.Err())
	}
	e := &UnreachableError{Op: op, Attempts: make(map[string]error, len(tried)), ctx: ctx.Err()}
	for _, t := range tried {
		e.order = append(e.order, t.addr)
		e.Attempts[t.addr] = t.err
		e.last = t.err
		if strings.Contains(status.Convert(t.err).Message(), "no leader") {
			e.NoLeader = true
		}
	}
	if e.ctx == nil {
		e.ctx = context.DeadlineExceeded
	}
	return e
}

// finalError describes an error that another node would not change.
func (c *Client) finalError(op, addr string, err error) error {
	switch status.Code(err) {
	case codes.Unauthenticated:
		hint := "set Config.Token to the bearer token of a role allowed to call it"
		if c.cfg.Token != "" {
			hint = "Config.Token is not one of the directory's tokens"
		}
		return fmt.Errorf("dirclient: %s at %s: not authenticated (%s): %w", op, addr, hint, err)
	case codes.PermissionDenied:
		return fmt.Errorf("dirclient: %s at %s: permission denied: the token's role may not make this call, "+
			"or a call for a worker lacks the worker token Register returned (register the worker through this "+
			"client, or SetWorkerToken): %w", op, addr, err)
	case codes.Canceled:
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return fmt.Errorf("dirclient: %s: %w", op, ErrClosed)
		}
	}
	return fmt.Errorf("dirclient: %s at %s: %w", op, addr, err)
}
