package chaos

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Directory reaches each directory node of the compose cluster from the
// host, at its container address on Network (the members' advertised
// addresses are container names, which only resolve on that network). A
// node's address is looked up again after a call to it fails, since a
// reconnected or restarted container may get a new one.
type Directory struct {
	d     Docker
	names []string // container names, kvdir-dir1..3
	creds *Credentials

	mu    sync.Mutex
	conns map[string]*nodeConn
}

type nodeConn struct {
	ip       string
	cc       *grpc.ClientConn
	admin    kvdirv1.AdminServiceClient
	dir      kvdirv1.DirectoryServiceClient
	lastLook time.Time
}

// NewDirectory returns a Directory for the named containers.
func NewDirectory(d Docker, names ...string) *Directory {
	return &Directory{d: d, names: names, conns: map[string]*nodeConn{}}
}

// NewSecureDirectory returns a Directory that dials the nodes over TLS
// with creds (nil: plaintext, no token).
func NewSecureDirectory(d Docker, creds *Credentials, names ...string) *Directory {
	c := NewDirectory(d, names...)
	c.creds = creds
	return c
}

// Names returns the nodes' container names.
func (c *Directory) Names() []string { return c.names }

// Close closes the connections.
func (c *Directory) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.conns {
		_ = n.cc.Close()
	}
	c.conns = map[string]*nodeConn{}
}

// conn returns the node's connection, looking its address up when it has
// none or when fresh is set (at most once a second).
func (c *Directory) conn(ctx context.Context, name string, fresh bool) (*nodeConn, error) {
	c.mu.Lock()
	n := c.conns[name]
	recent := n != nil && time.Since(n.lastLook) < time.Second
	c.mu.Unlock()
	if n != nil && (!fresh || recent) {
		return n, nil
	}
	ip, err := c.d.IP(ctx, name)
	if err != nil {
		return nil, err
	}
	if ip == "" {
		return nil, fmt.Errorf("%s has no address on %s", name, Network)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n = c.conns[name]; n != nil && n.ip == ip {
		n.lastLook = time.Now()
		return n, nil
	}
	cc, err := grpc.NewClient(net.JoinHostPort(ip, "7001"), c.creds.dialOptions(name)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", name, err)
	}
	if n != nil {
		_ = n.cc.Close()
	}
	n = &nodeConn{ip: ip, cc: cc, admin: kvdirv1.NewAdminServiceClient(cc), dir: kvdirv1.NewDirectoryServiceClient(cc), lastLook: time.Now()}
	c.conns[name] = n
	return n, nil
}

// call runs f against the node with a 1 s deadline, looking the node's
// address up again if it fails.
func call[T any](ctx context.Context, c *Directory, name string, f func(context.Context, *nodeConn) (T, error)) (T, error) {
	return callWithin(ctx, c, name, time.Second, f)
}

// callWithin is call with another deadline.
func callWithin[T any](ctx context.Context, c *Directory, name string, within time.Duration, f func(context.Context, *nodeConn) (T, error)) (T, error) {
	var zero T
	n, err := c.conn(ctx, name, false)
	if err != nil {
		return zero, err
	}
	cctx, cancel := context.WithTimeout(ctx, within)
	v, err := f(cctx, n)
	cancel()
	if err != nil {
		if _, lerr := c.conn(ctx, name, true); lerr != nil {
			return zero, fmt.Errorf("%s: %w (and %v)", name, err, lerr)
		}
		return zero, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// Status asks one node for its status.
func (c *Directory) Status(ctx context.Context, name string) (*kvdirv1.StatusResponse, error) {
	return call(ctx, c, name, func(ctx context.Context, n *nodeConn) (*kvdirv1.StatusResponse, error) {
		return n.admin.Status(ctx, &kvdirv1.StatusRequest{})
	})
}

// Snapshot asks one node to take a Raft snapshot now.
func (c *Directory) Snapshot(ctx context.Context, name string) error {
	_, err := call(ctx, c, name, func(ctx context.Context, n *nodeConn) (*kvdirv1.SnapshotResponse, error) {
		return n.admin.Snapshot(ctx, &kvdirv1.SnapshotRequest{})
	})
	return err
}

// Workers lists one node's workers, gone ones included.
func (c *Directory) Workers(ctx context.Context, name string) ([]*kvdirv1.Worker, error) {
	return call(ctx, c, name, func(ctx context.Context, n *nodeConn) ([]*kvdirv1.Worker, error) {
		r, err := n.dir.ListWorkers(ctx, &kvdirv1.ListWorkersRequest{IncludeGone: true})
		return r.GetWorkers(), err
	})
}

// Match returns each worker's matched blocks of the token prompt on one
// node, hashed in the namespace of model and blockSize.
func (c *Directory) Match(ctx context.Context, name, model string, blockSize int, tokens []uint32) (map[string]int, error) {
	// 3 s: a Match under the suite's load on the shared 2-core machine
	// once took over 1 s, and one failed call fails a whole view poll.
	return callWithin(ctx, c, name, 3*time.Second, func(ctx context.Context, n *nodeConn) (map[string]int, error) {
		r, err := n.dir.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{
			TokenIds: tokens, Namespace: &kvdirv1.Namespace{Model: model, BlockSize: uint32(blockSize)},
		}}})
		if err != nil {
			return nil, err
		}
		m := make(map[string]int, len(r.Matches))
		for _, w := range r.Matches {
			m[w.WorkerId] = int(w.Blocks)
		}
		return m, nil
	})
}

// Statuses asks every node at once; a node that does not answer has a nil
// entry and its error.
func (c *Directory) Statuses(ctx context.Context) ([]*kvdirv1.StatusResponse, []error) {
	out := make([]*kvdirv1.StatusResponse, len(c.names))
	errs := make([]error, len(c.names))
	var wg sync.WaitGroup
	for i, name := range c.names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = c.Status(ctx, name)
		}()
	}
	wg.Wait()
	return out, errs
}

// LeaderView is what the reachable nodes say about leadership.
type LeaderView struct {
	Leader    string // node id all reachable nodes name ("" if they disagree)
	Container string // the leader's container name
	Reachable int
	Term      uint64
	Detail    string
}

// Leader asks every node who leads. Leader is set only when every
// reachable node names the same leader and that node says it leads.
func (c *Directory) Leader(ctx context.Context) LeaderView {
	sts, errs := c.Statuses(ctx)
	var v LeaderView
	var parts []string
	ids := map[string]int{}
	self := map[string]string{} // node id -> its state
	for i, st := range sts {
		if st == nil {
			parts = append(parts, fmt.Sprintf("%s unreachable (%v)", c.names[i], errs[i]))
			continue
		}
		v.Reachable++
		ids[st.LeaderId]++
		self[st.NodeId] = st.State
		parts = append(parts, fmt.Sprintf("%s: %s %s, leader %q, term %d", c.names[i], st.NodeId, st.State, st.LeaderId, st.Term))
		v.Term = max(v.Term, st.Term)
	}
	sort.Strings(parts)
	v.Detail = strings.Join(parts, "; ")
	if len(ids) == 1 {
		for id := range ids {
			if id != "" && self[id] == "Leader" {
				v.Leader = id
			}
		}
	}
	if v.Leader != "" {
		for i, st := range sts {
			if st != nil && st.NodeId == v.Leader {
				v.Container = c.names[i]
			}
		}
	}
	return v
}

// WaitLeader waits until at least need nodes are reachable and all of them
// agree on a leader other than notID; it returns the view.
func (c *Directory) WaitLeader(ctx context.Context, timeout time.Duration, need int, notID string) (LeaderView, error) {
	var v LeaderView
	err := testkit.Poll(ctx, timeout, "an agreed leader", func() (bool, string) {
		v = c.Leader(ctx)
		ok := v.Leader != "" && v.Reachable >= need && v.Leader != notID
		return ok, v.Detail
	})
	return v, err
}
