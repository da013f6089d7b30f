package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Faults injected from the host, beyond what the docker CLI does alone:
// a frozen agent, a slow follower (netem in the node's network namespace),
// a full disk (a size-limited tmpfs the host fills) and a skewed clock (the
// directory's test hook). See deploy/README.md, "Chaos tests".

// lease is the compose cluster's worker lease (KVDIR_LEASE in .env).
const lease = 10 * time.Second

// nodeID is the Raft id of directory container name.
func nodeID(container string) string {
	for i, n := range dirNames {
		if n == container {
			return fmt.Sprintf("n%d", i+1)
		}
	}
	return ""
}

// pid returns the host pid of a container's main process.
func (h *harness) pid(container string) (string, error) {
	out, err := h.d.Run(h.ctx, "inspect", "-f", "{{.State.Pid}}", container)
	pid := strings.TrimSpace(out)
	if err == nil && (pid == "" || pid == "0") {
		err = fmt.Errorf("%s is not running", container)
	}
	return pid, err
}

// host runs a command on the host (nsenter, tc, mount).
func (h *harness) host(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pauseAgent freezes an agent (docker pause: its cgroup is frozen, its
// connections stay open) until the directory has expired its worker for
// want of heartbeats, then thaws it: the agent finds its epoch unknown,
// registers again and rebuilds the worker from the engine's replay. The
// engine serves on throughout.
func pauseAgent(h *harness, r *FaultResult) (time.Time, error) {
	a, w := agentNames[3], engineNames[3]
	r.Target = a
	before, err := h.workers()
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "pause", a); err != nil {
		return time.Time{}, err
	}
	err = testkit.Poll(h.ctx, pauseBound, "the paused agent's worker to expire", func() (bool, string) {
		ws, err := h.workers()
		if err != nil {
			return false, err.Error()
		}
		st := ws[w].GetState()
		return st == kvdirv1.WorkerState_WORKER_STATE_EXPIRED, st.String()
	})
	r.ExpiredAfterSeconds = time.Since(at).Seconds()
	if _, uerr := h.d.Run(h.ctx, "unpause", a); uerr != nil {
		return time.Time{}, uerr
	}
	resumed := time.Now()
	h.onRepair(resumed)
	if err != nil {
		return resumed, err
	}
	// The agent heartbeats every lease/3: the directory may expire it from
	// lease - lease/3 after the pause on, and must within lease and a
	// leader tick or two (loaded machine: 3 s).
	if e := r.ExpiredAfterSeconds; e < (lease-lease/3).Seconds() || e > (lease+3*time.Second).Seconds() {
		r.problem("%s expired %.1f s after its agent was paused; the lease is %v", w, e, lease)
	}
	n, err := h.warmUntil(w, func() (bool, string) { return h.registered(w, before[w].GetEpoch(), 0) })
	r.EngineWarmups = n
	if err != nil {
		return resumed, fmt.Errorf("%s registered again after its agent was resumed: %w", w, err)
	}
	return resumed, nil
}

// slowCPUs is the CPU quota of a slow follower where netem is missing.
const slowCPUs = "0.05"

// slowFollowerLeaderLoss delays a follower's traffic by 200 ms (netem on
// its interface, from the host in its network namespace; where the kernel
// has no netem, a CPU quota of slowCPUs makes it slow instead) and kills
// the leader while it is slow: the fast follower and the slow one must elect a
// leader and serve; then the old leader is started and the delay removed.
func slowFollowerLeaderLoss(h *harness, r *FaultResult) (time.Time, error) {
	lv, err := h.dir.WaitLeader(h.ctx, leaderBound, 3, "")
	if err != nil {
		return time.Time{}, err
	}
	var slow string
	for _, n := range dirNames {
		if n != lv.Container {
			slow = n
			break
		}
	}
	pid, err := h.pid(slow)
	if err != nil {
		return time.Time{}, err
	}
	netem := func(op string, args ...string) error {
		return h.host("nsenter", append([]string{"-t", pid, "-n", "tc", "qdisc", op, "dev", "eth0", "root"}, args...)...)
	}
	how, undo := "netem delay 200ms", func() error { return netem("del") }
	if err := netem("add", "netem", "delay", "200ms"); err != nil {
		if !strings.Contains(err.Error(), "qdisc kind is unknown") {
			return time.Time{}, fmt.Errorf("slowing %s: %w", slow, err)
		}
		// A kernel without sch_netem: starve the node of CPU instead, so
		// that it answers late and falls behind.
		if _, err := h.d.Run(h.ctx, "update", "--cpus", slowCPUs, slow); err != nil {
			return time.Time{}, fmt.Errorf("slowing %s: %w", slow, err)
		}
		how = "CPU quota of " + slowCPUs + " cores (this kernel has no netem)"
		// --cpus 0 leaves the quota as it is: lift it to every core.
		undo = func() error {
			_, err := h.d.Run(h.ctx, "update", "--cpus", strconv.Itoa(runtime.NumCPU()), slow)
			return err
		}
	}
	unslowed := false
	unslow := func() error {
		if unslowed {
			return nil
		}
		unslowed = true
		return undo()
	}
	defer func() { _ = unslow() }()
	r.Target = lv.Container + " (leader, killed), " + slow + " (slow: " + how + ")"
	// The slow node must be behind the others' pace for a moment under
	// the load before the leader goes.
	select {
	case <-h.ctx.Done():
	case <-time.After(2 * time.Second):
	}
	at := time.Now()
	if _, err := h.d.Run(h.ctx, "kill", lv.Container); err != nil {
		return time.Time{}, err
	}
	nv, err := h.dir.WaitLeader(h.ctx, leaderBound, 2, lv.Leader)
	if err != nil {
		return time.Time{}, fmt.Errorf("leader after killing %s with %s slow: %w", lv.Container, slow, err)
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	r.Detail = "new leader " + nv.Container
	if nv.Container == slow {
		r.Detail += " (the slow follower)"
	}
	// Serve for a while with the slow member in the majority.
	select {
	case <-h.ctx.Done():
	case <-time.After(time.Until(at.Add(partitionHold))):
	}
	if _, err := h.d.Run(h.ctx, "start", lv.Container); err != nil {
		return time.Time{}, err
	}
	if err := unslow(); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	if err := h.rejoin(lv.Container); err != nil {
		return repaired, err
	}
	return repaired, h.rejoin(slow)
}

// diskNode is the node whose data directory can be a tmpfs of the host's
// (KVDIR_DIR3_DATA in the compose file).
const diskNode = "kvdir-dir3"

// dataTmpfs mounts a size-limited tmpfs for diskNode's data on the host,
// when the test runs as root; it returns its path ("" if not) and the
// unmount.
func dataTmpfs(t interface{ Logf(string, ...any) }) (string, func()) {
	if os.Geteuid() != 0 || os.Getenv("KVDIR_CHAOS_DISK") == "0" {
		t.Logf("disk-full needs root (a tmpfs mount) and KVDIR_CHAOS_DISK not 0: it will fail")
		return "", func() {}
	}
	dir, err := os.MkdirTemp("", "kvdir-chaos-dir3-")
	if err != nil {
		t.Logf("disk-full: %v", err)
		return "", func() {}
	}
	// The directory image runs as uid 65532.
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2g,uid=65532,gid=65532,mode=0755", "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Logf("disk-full: mount a tmpfs on %s: %v: %s", dir, err, out)
		_ = os.Remove(dir)
		return "", func() {}
	}
	return dir, func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", dir, err, out)
			return
		}
		_ = os.Remove(dir)
	}
}

// readyz reads a node's GET /readyz (on its HTTP port, 7002).
func (h *harness) readyz(container string) (int, string, error) {
	ip, err := h.d.IP(h.ctx, container)
	if err != nil || ip == "" {
		return 0, "", fmt.Errorf("address of %s: %q %v", container, ip, err)
	}
	ctx, cancel := context.WithTimeout(h.ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ip+":7002/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// lead makes node container the leader (or, with away, any other node).
func (h *harness) lead(container string, away bool) error {
	return testkit.Poll(h.ctx, leaderBound, "leadership moved", func() (bool, string) {
		lv := h.dir.Leader(h.ctx)
		if lv.Container != "" && (lv.Container == container) != away && lv.Reachable == len(dirNames) {
			return true, lv.Detail
		}
		if lv.Container == "" {
			return false, lv.Detail
		}
		id := nodeID(container)
		if away {
			id = "" // any other
		}
		ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
		_, err := h.dc.TransferLeadership(ctx, id)
		cancel()
		if err != nil {
			return false, err.Error()
		}
		return false, "transferred; " + lv.Detail
	})
}

// diskFull fills the tmpfs that holds a follower's data from the host
// until no byte is left: the node's writes (its Raft log) fail, its
// readiness must say so, and the other two keep the cluster serving. Then
// the file is removed; the node must catch up by itself (or, failing that
// within rejoinBound, after a restart, recorded as restart_needed).
func diskFull(h *harness, r *FaultResult) (time.Time, error) {
	if h.dataDir == "" {
		return time.Time{}, errors.New("no tmpfs for the node's data (the test must run as root; see the log)")
	}
	r.Target = diskNode
	if err := h.lead(diskNode, true); err != nil {
		return time.Time{}, fmt.Errorf("leadership away from %s: %w", diskNode, err)
	}
	fill := filepath.Join(h.dataDir, "chaos-fill")
	at := time.Now()
	n, err := fillUp(fill)
	if err != nil {
		return time.Time{}, err
	}
	freed := false
	free := func() error {
		if freed {
			return nil
		}
		freed = true
		return os.Remove(fill)
	}
	defer func() { _ = free() }()
	// The node may not need a new byte for a while: its log store reuses
	// the pages that compaction freed. A snapshot needs new files, so ask
	// for one now and then until the node says its writes fail.
	var why string
	var asked time.Time
	err = testkit.Poll(h.ctx, 30*time.Second, diskNode+" to fail its readiness", func() (bool, string) {
		code, body, err := h.readyz(diskNode)
		if err != nil {
			return false, err.Error()
		}
		why = body
		if code == http.StatusOK && time.Since(asked) > 3*time.Second {
			asked = time.Now()
			ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
			if err := h.dir.Snapshot(ctx, diskNode); err != nil {
				r.Detail = "snapshot on the full disk: " + err.Error()
			}
			cancel()
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, "writes failing"), fmt.Sprintf("%d %s", code, body)
	})
	r.FailedVisiblySeconds = time.Since(at).Seconds()
	r.Detail = fmt.Sprintf("filled %d MB; readiness: %s; %s", n>>20, why, r.Detail)
	if err != nil {
		return time.Time{}, fmt.Errorf("the full disk went unnoticed: %w", err)
	}
	if _, err := h.dir.WaitLeader(h.ctx, leaderBound, 2, ""); err != nil {
		return time.Time{}, fmt.Errorf("a leader while %s's disk is full: %w", diskNode, err)
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	select {
	case <-h.ctx.Done():
	case <-time.After(partitionHold):
	}
	if err := free(); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	if err := h.rejoin(diskNode); err == nil {
		return repaired, nil
	}
	r.RestartNeeded = true
	if _, err := h.d.Run(h.ctx, "restart", "-t", "35", diskNode); err != nil {
		return repaired, err
	}
	return repaired, h.rejoin(diskNode)
}

// fillUp fills the file system of path with one file until no byte is
// left, and returns the file's size: it allocates what statfs says is
// free (fallocate, quick on a tmpfs), then writes until ENOSPC.
func fillUp(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("fill: %w", err)
	}
	defer f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, fmt.Errorf("fill: statfs: %w", err)
	}
	var n int64
	if free := int64(st.Bavail) * int64(st.Bsize); free > 1<<20 {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-1<<20); err == nil {
			n = free - 1<<20
		}
	}
	if _, err := f.Seek(n, io.SeekStart); err != nil {
		return n, fmt.Errorf("fill: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("fill: %w", err)
		}
	}
}

// recreate recreates one compose service with extra environment (docker-
// compose up --no-deps: the container is replaced, its data kept).
func (h *harness) recreate(service string, extra ...string) error {
	ctx, cancel := context.WithTimeout(h.ctx, 2*time.Minute)
	defer cancel()
	dir := filepath.Join(h.root, "deploy/compose")
	cmd := exec.CommandContext(ctx, "docker-compose", "--project-directory", dir, "-f", filepath.Join(dir, "docker-compose.yml"),
		"up", "-d", "--no-deps", "--no-build", service)
	cmd.Env = append(append(os.Environ(), h.clusterEnv()...), extra...)
	if h.creds != nil { // what compose/cluster.sh exports for the secrets' mounts
		cmd.Env = append(cmd.Env, "KVDIR_SECRETS_DIR="+h.creds.Dir, fmt.Sprintf("KVDIR_SECRETS_GID=%d", h.creds.GID))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("docker-compose up %s: %w: %s", service, err, out)
	}
	return nil
}

// clockSkew recreates a node with its clock off (the directory's test hook,
// KVDIR_CHAOS_CLOCK_SKEW, default +5m), makes it the leader for longer
// than a lease under the load, then hands leadership back to a node with
// the right clock and waits a lease again: no worker may expire (every
// worker keeps its epoch), since leases are counted in elapsed time by the
// leader alone. Last, the node is recreated with the real clock.
func clockSkew(h *harness, r *FaultResult) (time.Time, error) {
	skew := env("KVDIR_CHAOS_CLOCK_SKEW", "+5m")
	if _, err := time.ParseDuration(strings.TrimPrefix(skew, "+")); err != nil {
		return time.Time{}, fmt.Errorf("KVDIR_CHAOS_CLOCK_SKEW: %w", err)
	}
	r.Target = diskNode + " (clock " + skew + ")"
	before, err := h.workers()
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if err := h.recreate(diskNode, "KVDIR_DIR3_TEST_CLOCK_OFFSET="+skew); err != nil {
		return time.Time{}, err
	}
	if err := h.rejoin(diskNode); err != nil {
		return time.Time{}, fmt.Errorf("%s with its clock %s: %w", diskNode, skew, err)
	}
	logs, _ := h.d.Logs(h.ctx, diskNode, at)
	if !strings.Contains(logs, "test hook: this node's clock is offset") {
		return time.Time{}, fmt.Errorf("%s does not say its clock is offset: the hook did not take", diskNode)
	}
	hold := func() {
		select {
		case <-h.ctx.Done():
		case <-time.After(lease + lease/2):
		}
	}
	if err := h.lead(diskNode, false); err != nil {
		return time.Time{}, fmt.Errorf("leadership to %s: %w", diskNode, err)
	}
	r.LeaderRecoverySeconds = time.Since(at).Seconds()
	hold()
	if err := h.lead(diskNode, true); err != nil {
		return time.Time{}, fmt.Errorf("leadership away from %s: %w", diskNode, err)
	}
	hold()
	after, err := h.workers()
	if err != nil {
		return time.Time{}, err
	}
	var bad []string
	for id, w := range before {
		a := after[id]
		if a.GetEpoch() != w.GetEpoch() || a.GetState() != w.GetState() {
			bad = append(bad, fmt.Sprintf("%s: %v epoch %d, was %v epoch %d", id, a.GetState(), a.GetEpoch(), w.GetState(), w.GetEpoch()))
		}
	}
	if len(bad) > 0 {
		r.problem("workers changed under a leader with its clock %s off: %s", skew, strings.Join(bad, "; "))
	}
	r.Detail = fmt.Sprintf("%d workers kept their epochs through leadership on and off a node %s off", len(before)-len(bad), skew)
	if err := h.recreate(diskNode); err != nil {
		return time.Time{}, err
	}
	repaired := time.Now()
	h.onRepair(repaired)
	return repaired, h.rejoin(diskNode)
}
