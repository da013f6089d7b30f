// Package fleet starts kvdir as real processes on loopback, for the
// end-to-end tests (e2e/), the deployment checks (deploy/) and the
// benchmarks (bench/): a directory cluster of cmd/directory processes
// (BoltDB on disk), engine simulators each with its agent, and routers.
// Every process is a testkit.Proc: it can be terminated, killed and
// restarted, and its output is kept for failure reports.
package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// DirNode is one directory process.
type DirNode struct {
	ID                  string
	RaftAddr, API, HTTP string
	DataDir             string
	*testkit.Proc

	clientTLS *tls.Config // nil: the API is dialled without TLS

	mu   sync.Mutex
	conn *grpc.ClientConn
}

// Directory is a directory cluster of processes.
type Directory struct {
	Nodes []*DirNode
}

// StartDirectory starts size nodes of bin (cmd/directory) under dir, one
// data directory each, all bootstrapped with the same --initial-cluster and
// given extra flags. On error, the nodes started are stopped.
func StartDirectory(bin, dir string, size int, extra ...string) (*Directory, error) {
	return StartDirectoryTLS(bin, dir, size, nil, extra...)
}

// StartDirectoryTLS is StartDirectory for nodes that serve their API over
// TLS (extra holds the TLS flags): client configures the connections to
// their APIs.
func StartDirectoryTLS(bin, dir string, size int, client *tls.Config, extra ...string) (*Directory, error) {
	addrs, err := testkit.LoopbackAddrs(3 * size)
	if err != nil {
		return nil, err
	}
	d := &Directory{}
	var members []string
	for i := range size {
		n := &DirNode{
			ID:       fmt.Sprintf("n%d", i+1),
			RaftAddr: addrs[3*i], API: addrs[3*i+1], HTTP: addrs[3*i+2],
			DataDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			clientTLS: client,
		}
		members = append(members, n.ID+"="+n.RaftAddr)
		d.Nodes = append(d.Nodes, n)
	}
	for _, n := range d.Nodes {
		args := append([]string{
			"--node-id", n.ID, "--data-dir", n.DataDir,
			"--raft-addr", n.RaftAddr, "--api-addr", n.API, "--http-addr", n.HTTP,
			"--initial-cluster", strings.Join(members, ","),
		}, extra...)
		n.Proc = testkit.NewProc("directory "+n.ID, bin, args...)
		if err := n.Start(); err != nil {
			d.Stop()
			return nil, err
		}
	}
	return d, nil
}

// Start (re)starts the node's process on its data directory, with a fresh
// gRPC connection (no reconnect back-off left from a dead process).
func (n *DirNode) Start() error {
	if err := n.Proc.Start(); err != nil {
		return err
	}
	conn, err := n.Dial()
	if err != nil {
		return err
	}
	n.mu.Lock()
	old := n.conn
	n.conn = conn
	n.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Dial opens a new gRPC connection to the node's API, with the settings of
// Conn's (for a client that must have its own, as each agent does).
func (n *DirNode) Dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if n.clientTLS != nil {
		creds = credentials.NewTLS(n.clientTLS)
	}
	return grpc.NewClient(n.API, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
}

// Conn is a gRPC connection to the node's API.
func (n *DirNode) Conn() *grpc.ClientConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conn
}

// Status asks the node for its status (2 s at most).
func (n *DirNode) Status(ctx context.Context) (*kvdirv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return kvdirv1.NewAdminServiceClient(n.Conn()).Status(ctx, &kvdirv1.StatusRequest{})
}

var probe = &http.Client{Timeout: time.Second}

// Ready reports whether the node's /readyz answers 200 and, if not, why.
func (n *DirNode) Ready() (bool, string) {
	resp, err := probe.Get("http://" + n.HTTP + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(resp.Status + " " + string(body))
}

// Addrs are the nodes' gRPC addresses, comma-separated.
func (d *Directory) Addrs() string {
	var a []string
	for _, n := range d.Nodes {
		a = append(a, n.API)
	}
	return strings.Join(a, ",")
}

// WaitLeader waits until every running node answers, names the same
// leader and knows its API address, and reports ready, and the leader is a
// running node that reports itself leader; it returns the leader's index.
func (d *Directory) WaitLeader(timeout time.Duration) (int, error) {
	leader := -1
	err := testkit.Poll(context.Background(), timeout, "an agreed leader among the running directory nodes", func() (bool, string) {
		leader = -1
		agreed := ""
		var saw []string
		for i, n := range d.Nodes {
			if !n.Running() {
				continue
			}
			st, err := n.Status(context.Background())
			if err != nil {
				return false, fmt.Sprintf("%s: %v", n.ID, err)
			}
			saw = append(saw, fmt.Sprintf("%s:%s leader=%q at %q", st.NodeId, st.State, st.LeaderId, st.LeaderAddress))
			if st.State == "Leader" {
				leader = i
			}
			if st.LeaderId == "" || st.LeaderAddress == "" || agreed != "" && st.LeaderId != agreed {
				return false, strings.Join(saw, "; ")
			}
			agreed = st.LeaderId
			if ok, why := n.Ready(); !ok {
				return false, fmt.Sprintf("%s /readyz: %s", st.NodeId, why)
			}
		}
		return leader >= 0 && d.Nodes[leader].ID == agreed, strings.Join(saw, "; ")
	})
	if err != nil {
		return -1, err
	}
	return leader, nil
}

// Stop terminates every node (10 s each, then SIGKILL) and closes the
// connections.
func (d *Directory) Stop() {
	var wg sync.WaitGroup
	for _, n := range d.Nodes {
		if n.Proc == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.Terminate(10 * time.Second)
			if c := n.Conn(); c != nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
}

// Logs returns the tail of every node's output, for failure reports.
func (d *Directory) Logs(lines int) string {
	var b strings.Builder
	for _, n := range d.Nodes {
		if n.Proc != nil {
			fmt.Fprintf(&b, "---- %s\n%s\n", n.Name, n.Tail(lines))
		}
	}
	return b.String()
}

// DirSize returns the bytes of the files under dir (e.g. a snapshot).
func DirSize(dir string) int64 {
	var total int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			total += info.Size()
		}
		return nil
	})
	return total
}
