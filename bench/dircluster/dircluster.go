// Package dircluster starts a directory cluster of real processes on
// loopback (the cmd/directory binary, BoltDB on disk) for benchmarks and
// end-to-end tests, and stops, kills and restarts its nodes.
package dircluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Build compiles cmd/directory into dir and returns the binary's path.
// moduleRoot is the repository root.
func Build(moduleRoot, dir string) (string, error) { return BuildCommand(moduleRoot, dir, "directory") }

// BuildCommand compiles cmd/<name> into dir and returns the binary's path.
func BuildCommand(moduleRoot, dir, name string) (string, error) {
	bins, err := BuildCommands(moduleRoot, dir, name)
	if err != nil {
		return "", err
	}
	return bins[name], nil
}

// BuildCommands compiles cmd/<name> for every name into dir in one go build
// (packages compile in parallel and share their dependencies) and returns
// the binaries' paths by name.
func BuildCommands(moduleRoot, dir string, names ...string) (map[string]string, error) {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	bins := make(map[string]string, len(names))
	for _, n := range names {
		args = append(args, "./cmd/"+n)
		bins[n] = filepath.Join(dir, n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %v: %w\n%s", names, err, out)
	}
	return bins, nil
}

// ModuleRoot finds the repository root (the folder with go.mod) from the
// working directory up.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run inside the kvdir repository")
		}
		dir = parent
	}
}

// Node is one directory process.
type Node struct {
	ID                  string
	RaftAddr, API, HTTP string
	DataDir             string
	cmd                 *exec.Cmd
	done                chan struct{}
	log                 *Buffer
	conn                *grpc.ClientConn
	extra               []string
	initialCluster, bin string
}

// Cluster is a running cluster.
type Cluster struct {
	Nodes []*Node
}

// Start starts size nodes under dir (one data directory each), all
// bootstrapped with the same --initial-cluster, each given extra flags.
func Start(bin, dir string, size int, extra ...string) (*Cluster, error) {
	c := &Cluster{}
	var members []string
	for i := range size {
		ports, err := FreePorts(3)
		if err != nil {
			return nil, err
		}
		n := &Node{
			ID:       fmt.Sprintf("n%d", i+1),
			RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]),
			API:      fmt.Sprintf("127.0.0.1:%d", ports[1]),
			HTTP:     fmt.Sprintf("127.0.0.1:%d", ports[2]),
			DataDir:  filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			extra:    extra,
			bin:      bin,
		}
		members = append(members, n.ID+"="+n.RaftAddr)
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		n.initialCluster = strings.Join(members, ",")
		if err := n.Start(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// FreePorts returns n loopback TCP ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Start (re)starts the node's process on its data directory.
func (n *Node) Start() error {
	args := append([]string{
		"--node-id", n.ID, "--data-dir", n.DataDir,
		"--raft-addr", n.RaftAddr, "--api-addr", n.API, "--http-addr", n.HTTP,
		"--initial-cluster", n.initialCluster,
	}, n.extra...)
	n.log = &Buffer{}
	n.cmd = exec.Command(n.bin, args...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.ID, err)
	}
	n.done = make(chan struct{})
	go func() { n.cmd.Wait(); close(n.done) }()
	if n.conn == nil {
		conn, err := grpc.NewClient(n.API, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
		if err != nil {
			return err
		}
		n.conn = conn
	}
	return nil
}

// Conn is a gRPC connection to the node's API.
func (n *Node) Conn() *grpc.ClientConn { return n.conn }

// Log returns what the process printed.
func (n *Node) Log() string { return n.log.String() }

// Running reports whether the process is alive.
func (n *Node) Running() bool {
	select {
	case <-n.done:
		return false
	default:
		return n.cmd != nil
	}
}

// Kill9 kills the process with SIGKILL and waits for it to exit.
func (n *Node) Kill9() {
	if n.Running() {
		n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	}
}

// Terminate sends SIGTERM and waits up to timeout for a clean exit.
func (n *Node) Terminate(timeout time.Duration) error {
	if !n.Running() {
		return nil
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
		if code := n.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("%s exited %d", n.ID, code)
		}
		return nil
	case <-time.After(timeout):
		n.Kill9()
		return fmt.Errorf("%s did not stop within %v", n.ID, timeout)
	}
}

// Status asks the node for its status.
func (n *Node) Status(ctx context.Context) (*kvdirv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return kvdirv1.NewAdminServiceClient(n.conn).Status(ctx, &kvdirv1.StatusRequest{})
}

// Ready reports whether the node's /readyz answers 200.
func (n *Node) Ready() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + n.HTTP + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// WaitLeader waits until every running node names the same leader and is
// ready, and returns the leader's index.
func (c *Cluster) WaitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		leader, agree := "", true
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			st, err := n.Status(context.Background())
			if err != nil || st.LeaderId == "" || st.LeaderAddress == "" || !n.Ready() {
				agree = false
				break
			}
			if leader == "" {
				leader = st.LeaderId
			} else if leader != st.LeaderId {
				agree = false
			}
		}
		if agree && leader != "" {
			for i, n := range c.Nodes {
				if n.ID == leader {
					return i, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, errors.New("no agreed leader in time")
}

// Stop terminates every node.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Terminate(10 * time.Second)
			if n.conn != nil {
				n.conn.Close()
			}
		}()
	}
	wg.Wait()
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

// Buffer collects a process's output; safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
