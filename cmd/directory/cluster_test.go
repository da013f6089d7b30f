package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

var (
	binDir   string
	buildBin struct {
		once sync.Once
		path string
		err  error
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binary builds the command once per test run.
func binary(t *testing.T) string {
	t.Helper()
	buildBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "kvdir-directory-test-")
		if err != nil {
			buildBin.err = err
			return
		}
		binDir = dir
		path := filepath.Join(dir, "directory")
		out, err := exec.Command("go", "build", "-o", path, ".").CombinedOutput()
		if err != nil {
			buildBin.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		buildBin.path = path
	})
	if buildBin.err != nil {
		t.Fatal(buildBin.err)
	}
	return buildBin.path
}

// proc is one directory process of the test cluster.
type proc struct {
	id                   string
	raft, api, http, dir string
	cmd                  *exec.Cmd
	out                  *lockedBuffer
	done                 chan struct{} // closed when the process has exited
	conn                 *grpc.ClientConn
	starts               int
}

type procCluster struct {
	t     *testing.T
	bin   string
	procs []*proc
	extra []string // flags every node gets
}

func newProcCluster(t *testing.T, size int, extra ...string) *procCluster {
	c := &procCluster{t: t, bin: binary(t), extra: extra}
	addrs := freeAddrs(t, 3*size)
	var initial []string
	for i := range size {
		p := &proc{
			id:   fmt.Sprintf("n%d", i+1),
			raft: addrs[3*i], api: addrs[3*i+1], http: addrs[3*i+2],
			dir: filepath.Join(t.TempDir(), fmt.Sprintf("n%d", i+1)),
		}
		c.procs = append(c.procs, p)
		initial = append(initial, p.id+"="+p.raft)
	}
	c.extra = append(c.extra, "--initial-cluster", strings.Join(initial, ","))
	t.Cleanup(c.cleanup)
	for i := range c.procs {
		c.start(i)
	}
	return c
}

// start starts node i (again), on its data directory.
func (c *procCluster) start(i int) {
	c.t.Helper()
	p := c.procs[i]
	args := append([]string{
		"--node-id", p.id, "--data-dir", p.dir,
		"--raft-addr", p.raft, "--api-addr", p.api, "--http-addr", p.http,
	}, c.extra...)
	cmd := exec.Command(c.bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	p.out = &lockedBuffer{}
	p.starts++
	fmt.Fprintf(p.out, "=== start %d: %s\n", p.starts, strings.Join(args, " "))
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", p.id, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		cmd.Wait()
		close(done)
	}(p.done)
	if p.conn != nil {
		p.conn.Close() // a fresh connection: no reconnect backoff left from the dead process
	}
	conn, err := grpc.NewClient(p.api, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	p.conn = conn
}

func (c *procCluster) running(i int) bool {
	p := c.procs[i]
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill9 kills node i with SIGKILL and waits for it to be gone.
func (c *procCluster) kill9(i int) {
	c.t.Helper()
	p := c.procs[i]
	if err := p.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("kill -9 %s: %v", p.id, err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s still running 10s after SIGKILL", p.id)
	}
}

func (c *procCluster) cleanup() {
	for i, p := range c.procs {
		if c.running(i) {
			p.cmd.Process.Kill()
			<-p.done
		}
		if p.conn != nil {
			p.conn.Close()
		}
	}
	if c.t.Failed() || os.Getenv("TEST_DUMP_LOGS") != "" {
		for _, p := range c.procs {
			if p.out != nil {
				c.t.Logf("---- output of %s ----\n%s", p.id, tail(p.out.String(), 150))
			}
		}
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = append([]string{fmt.Sprintf("... (%d lines cut)", len(l)-lines)}, l[len(l)-lines:]...)
	}
	return strings.Join(l, "\n")
}

func (c *procCluster) status(i int) (*kvdirv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return kvdirv1.NewAdminServiceClient(c.procs[i].conn).Status(ctx, &kvdirv1.StatusRequest{})
}

var httpClient = &http.Client{Timeout: time.Second}

func (c *procCluster) readyz(i int) (bool, string) {
	resp, err := httpClient.Get("http://" + c.procs[i].http + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(body))
}

// waitLeader waits until the given nodes agree on a leader among them,
// know its API address and report ready, and returns the leader's index.
func (c *procCluster) waitLeader(nodes []int, timeout time.Duration) int {
	c.t.Helper()
	leader := -1
	waitFor(c.t, fmt.Sprintf("a leader among %v", c.ids(nodes)), timeout, func() (bool, string) {
		leader = -1
		var saw []string
		agreed := ""
		for _, i := range nodes {
			st, err := c.status(i)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", c.procs[i].id, err)
			}
			saw = append(saw, fmt.Sprintf("%s:%s leader=%q at %q", st.NodeId, st.State, st.LeaderId, st.LeaderAddress))
			if st.State == "Leader" {
				leader = i
			}
			if st.LeaderId == "" || st.LeaderAddress == "" || agreed != "" && st.LeaderId != agreed {
				return false, strings.Join(saw, "; ")
			}
			agreed = st.LeaderId
			if ok, why := c.readyz(i); !ok {
				return false, fmt.Sprintf("%s /readyz: %s", st.NodeId, why)
			}
		}
		return leader >= 0 && c.procs[leader].id == agreed, strings.Join(saw, "; ")
	})
	return leader
}

func (c *procCluster) ids(nodes []int) []string {
	var out []string
	for _, i := range nodes {
		out = append(out, c.procs[i].id)
	}
	return out
}

// publisher publishes batches for one worker through one node, one batch
// in flight at a time, re-sending a batch whose answer did not come.
type publisher struct {
	agent  kvdirv1.AgentServiceClient
	worker string
	epoch  uint64
	next   uint64 // sequence number of the next batch

	mu     sync.Mutex
	acked  []uint64       // sequence numbers acknowledged (APPLIED or DUPLICATE)
	maxIdx uint64         // highest Raft index among the acknowledgements
	errs   map[string]int // why streams failed (leader changes), by gRPC code
}

const blocksPerBatch = 4

// chain is the chain of blocks batch seq stores: a root chain of its own.
func chain(seq uint64) []uint64 {
	out := make([]uint64, blocksPerBatch)
	for j := range out {
		out[j] = seq<<8 | uint64(j+1)
	}
	return out
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// run publishes until stop returns true (checked between batches) or ctx
// ends. A refused batch (gap, stale epoch...) is an error.
func (p *publisher) run(ctx context.Context, stop func() bool) error {
	var stream kvdirv1.AgentService_PublishClient
	cancel := func() {}
	defer func() { cancel() }()
	pace := time.NewTicker(10 * time.Millisecond) // bounds the load on a 2-core machine
	defer pace.Stop()
	retry := func(stage string, err error) error {
		cancel()
		stream = nil
		p.mu.Lock()
		if p.errs == nil {
			p.errs = map[string]int{}
		}
		p.errs[stage+":"+status.Code(err).String()]++
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish batch %d: %w", p.next, ctx.Err())
		case <-time.After(50 * time.Millisecond): // back off before reconnecting
			return nil
		}
	}
	for !stop() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish batch %d: %w", p.next, ctx.Err())
		case <-pace.C:
		}
		if stream == nil {
			sctx, streamCancel := context.WithCancel(ctx)
			cancel = streamCancel
			s, err := p.agent.Publish(sctx)
			if err != nil {
				if err := retry("open", err); err != nil {
					return err
				}
				continue
			}
			stream = s
		}
		seq := p.next
		err := stream.Send(&kvdirv1.PublishRequest{Batch: &kvdirv1.EventBatch{
			WorkerId: p.worker, Epoch: p.epoch, FirstSeq: seq, LastSeq: seq,
			Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain(seq)}}}},
		}})
		if err != nil {
			if err := retry("send", err); err != nil {
				return err
			}
			continue
		}
		// An answer that does not come within 3s is given up on, as an
		// agent would: start a new stream and send the batch again.
		timer := time.AfterFunc(3*time.Second, cancel)
		resp, err := stream.Recv()
		timer.Stop()
		if err != nil {
			if err := retry("recv", err); err != nil {
				return err
			}
			continue
		}
		switch {
		case resp.FirstSeq != seq:
			return fmt.Errorf("sent batch %d, answered batch %d: %v", seq, resp.FirstSeq, resp)
		case resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED,
			resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE:
			p.mu.Lock()
			p.acked = append(p.acked, seq)
			p.maxIdx = max(p.maxIdx, resp.RaftIndex)
			p.mu.Unlock()
			p.next++
		default:
			return fmt.Errorf("batch %d refused: %v", seq, resp)
		}
	}
	return nil
}

// checkHeld checks that node i holds every acknowledged batch's blocks.
func (c *procCluster) checkHeld(i int, p *publisher) {
	c.t.Helper()
	p.mu.Lock()
	acked, maxIdx := append([]uint64(nil), p.acked...), p.maxIdx
	p.mu.Unlock()
	id := c.procs[i].id
	waitFor(c.t, fmt.Sprintf("%s to apply index %d", id, maxIdx), 15*time.Second, func() (bool, string) {
		st, err := c.status(i)
		if err != nil {
			return false, err.Error()
		}
		return st.AppliedIndex >= maxIdx, fmt.Sprintf("applied %d", st.AppliedIndex)
	})
	dir := kvdirv1.NewDirectoryServiceClient(c.procs[i].conn)
	var lost []uint64
	for _, seq := range acked {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := dir.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Chain{Chain: &kvdirv1.ChainQuery{Hashes: chain(seq), BlockSize: 16}}})
		cancel()
		if err != nil {
			c.t.Fatalf("match batch %d on %s: %v", seq, id, err)
		}
		if len(m.Matches) != 1 || m.Matches[0].WorkerId != p.worker || m.Matches[0].Blocks != blocksPerBatch {
			lost = append(lost, seq)
		}
	}
	if len(lost) > 0 {
		c.t.Errorf("%s lost %d of %d acknowledged batches, e.g. %v", id, len(lost), len(acked), lost[:min(len(lost), 10)])
	}
}

// TestClusterProcesses runs three directory processes (set TEST_DUMP_LOGS=1
// to see their logs even when it passes): publishing through a
// follower survives a kill -9 of the leader without losing an acknowledged
// batch, the killed node catches up after a restart, and SIGTERM on the
// leader hands leadership over and exits 0.
func TestClusterProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes; skipped with -short")
	}
	start := time.Now()
	c := newProcCluster(t, 3,
		"--heartbeat-timeout", "250ms", "--election-timeout", "250ms",
		"--lease", "10m", // the test worker sends no heartbeats
		"--snapshot-interval", "500ms", "--snapshot-threshold", "200", "--trailing-logs", "50",
		"--shutdown-timeout", "10s")
	all := []int{0, 1, 2}
	leader := c.waitLeader(all, 20*time.Second)
	follower := (leader + 1) % 3
	t.Logf("%v: leader %s; publishing through %s", time.Since(start).Round(time.Millisecond), c.procs[leader].id, c.procs[follower].id)

	agent := kvdirv1.NewAgentServiceClient(c.procs[follower].conn)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	reg, err := agent.Register(ctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w1", Model: "m", BlockSize: 16}})
	if err != nil {
		t.Fatalf("register through %s: %v", c.procs[follower].id, err)
	}
	p := &publisher{agent: agent, worker: "w1", epoch: reg.Epoch, next: 1}
	if err := p.run(ctx, func() bool { return p.count() >= 5 }); err != nil {
		t.Fatal(err)
	}

	// Keep publishing in the background while the leader is killed.
	stop := make(chan struct{})
	pubErr := make(chan error, 1)
	go func() {
		pubErr <- p.run(ctx, func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		})
	}()
	stopPublisher := func() {
		close(stop)
		if err := <-pubErr; err != nil {
			t.Fatalf("publisher: %v", err)
		}
	}
	waitFor(t, "more batches in flight", 10*time.Second, func() (bool, string) { return p.count() >= 15, fmt.Sprint(p.count()) })
	killed := leader
	c.kill9(killed)
	atKill := p.count()
	p.mu.Lock()
	idxAtKill := p.maxIdx
	p.mu.Unlock()
	t.Logf("%v: killed leader %s with %d batches acknowledged", time.Since(start).Round(time.Millisecond), c.procs[killed].id, atKill)

	survivors := []int{(killed + 1) % 3, (killed + 2) % 3}
	leader = c.waitLeader(survivors, 20*time.Second)
	atLeader := p.count()
	// Enough writes that the new leader snapshots and compacts its log past
	// what the killed node has (threshold 200, trailing logs 50): the
	// killed node must then catch up from a snapshot.
	waitFor(t, "publishing to go on under the new leader", 30*time.Second, func() (bool, string) {
		select {
		case err := <-pubErr:
			t.Fatalf("publisher stopped: %v", err)
		default:
		}
		return p.count() >= atLeader+300, fmt.Sprint(p.count())
	})
	stopPublisher()
	p.mu.Lock()
	t.Logf("%v: new leader %s; %d batches acknowledged; streams restarted after errors: %v",
		time.Since(start).Round(time.Millisecond), c.procs[leader].id, len(p.acked), p.errs)
	p.mu.Unlock()
	for _, i := range survivors {
		c.checkHeld(i, p)
	}

	waitFor(t, "the new leader to snapshot past the killed node's log", 15*time.Second, func() (bool, string) {
		st, err := c.status(leader)
		if err != nil {
			return false, err.Error()
		}
		return st.LastSnapshotIndex > idxAtKill+100, fmt.Sprintf("last snapshot at %d, killed at %d", st.LastSnapshotIndex, idxAtKill)
	})

	// The killed node comes back on its data directory and catches up.
	c.start(killed)
	var digest uint64
	waitFor(t, "all three nodes to converge", 30*time.Second, func() (bool, string) {
		var saw []string
		var first *kvdirv1.StatusResponse
		same := true
		for _, i := range all {
			st, err := c.status(i)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", c.procs[i].id, err)
			}
			saw = append(saw, fmt.Sprintf("%s:%s applied=%d digest=%016x", st.NodeId, st.State, st.AppliedIndex, st.Digest))
			if first == nil {
				first = st
			} else if st.AppliedIndex != first.AppliedIndex || st.Digest != first.Digest || st.LeaderId != first.LeaderId {
				same = false
			}
		}
		digest = first.Digest
		return same && first.Digest != 0 && first.Counters.GetWorkers() == 1, strings.Join(saw, "; ")
	})
	c.checkHeld(killed, p)
	if st, err := c.status(killed); err != nil || st.LastSnapshotIndex == 0 {
		t.Errorf("restarted %s has no snapshot (want one installed by the leader): %v %v", c.procs[killed].id, st, err)
	}
	t.Logf("%v: converged (digest %016x)", time.Since(start).Round(time.Millisecond), digest)

	// SIGTERM on the leader: it hands over leadership and exits 0.
	leader = c.waitLeader(all, 20*time.Second)
	lp := c.procs[leader]
	if err := lp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lp.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s still running 20s after SIGTERM", lp.id)
	}
	if code := lp.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited %d after SIGTERM, want 0", lp.id, code)
	}
	if !strings.Contains(lp.out.String(), "handed over leadership") {
		t.Errorf("%s did not log that it handed over leadership", lp.id)
	}
	rest := []int{(leader + 1) % 3, (leader + 2) % 3}
	next := c.waitLeader(rest, 20*time.Second)
	if next == leader {
		t.Fatalf("leadership stayed with %s", lp.id)
	}
	t.Logf("%v: %s stopped cleanly; %s leads", time.Since(start).Round(time.Millisecond), lp.id, c.procs[next].id)
}
