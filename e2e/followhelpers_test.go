package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// The fault tests of routers following the log: helpers shared by the
// tests in follow_test.go.

// startFollowFleet starts 3 directory nodes (with extra flags), 2 engines
// and 2 routers with --follow-log, and waits until both routers' replicas
// are in sync. The lease is long: the test publisher's worker sends no
// heartbeats.
func startFollowFleet(t *testing.T, dirArgs ...string) *fleet.Fleet {
	t.Helper()
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2,
		DirectoryArgs: append([]string{"--lease", "10m"}, dirArgs...),
		EngineArgs:    []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs:    []string{"--policy", "kvdir", "--match-timeout", "200ms", "--follow-log"}})
	for _, r := range f.Routers {
		waitView(t, r, "its replica in sync", func(v router.View) bool { return v.Synced && v.Node != "" })
	}
	return f
}

// routerView reads a router's GET /v1/kvdir/view.
func routerView(url string) (router.View, error) {
	var v router.View
	resp, err := http.Get(url + router.PathView)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET %s: %s", router.PathView, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("GET %s: %w", router.PathView, err)
	}
	return v, nil
}

// waitView waits until the router's view satisfies cond and returns it.
func waitView(t *testing.T, r *fleet.Router, what string, cond func(router.View) bool) router.View {
	t.Helper()
	var v router.View
	testkit.Eventually(t, 20*time.Second, r.Proc.Name+": "+what, func() (bool, string) {
		var err error
		if v, err = routerView(r.URL); err != nil {
			return false, err.Error()
		}
		return cond(v), fmt.Sprintf("%+v", v)
	})
	return v
}

// nodeAt returns the directory node whose API address is addr.
func nodeAt(t *testing.T, f *fleet.Fleet, addr string) *fleet.DirNode {
	t.Helper()
	for _, n := range f.Directory.Nodes {
		if n.API == addr {
			return n
		}
	}
	t.Fatalf("no directory node at %q", addr)
	return nil
}

// otherNode returns a node of f other than every one of not.
func otherNode(f *fleet.Fleet, not ...*fleet.DirNode) *fleet.DirNode {
	for _, n := range f.Directory.Nodes {
		skip := false
		for _, m := range not {
			skip = skip || n == m
		}
		if !skip {
			return n
		}
	}
	return nil
}

// traffic is steady load on a fleet: chat requests through routers
// (engines store blocks, their agents publish them) and a publisher of
// acknowledged batches of its own worker through one directory node, whose
// acknowledgements the invariants check.
type traffic struct {
	p    *publisher
	stop chan struct{}
	done sync.WaitGroup
	err  chan error

	mu       sync.Mutex
	chats    int
	failures []string
}

// startTraffic registers a worker through via, then publishes through it
// and sends chat requests, one every 50 ms, through the routers in turn,
// until stopTraffic.
func startTraffic(t *testing.T, ctx context.Context, via *fleet.DirNode, routers ...string) *traffic {
	t.Helper()
	agent := kvdirv1.NewAgentServiceClient(via.Conn())
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reg, err := agent.Register(rctx, &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "acks", Model: "acks-only", BlockSize: 16}})
	if err != nil {
		t.Fatalf("register the publisher's worker through %s: %v", via.ID, err)
	}
	tr := &traffic{p: &publisher{agent: agent, worker: "acks", epoch: reg.Epoch, next: 1}, stop: make(chan struct{}), err: make(chan error, 1)}
	stopped := func() bool {
		select {
		case <-tr.stop:
			return true
		default:
			return false
		}
	}
	tr.done.Add(2)
	go func() { defer tr.done.Done(); tr.err <- tr.p.run(ctx, stopped) }()
	go func() {
		defer tr.done.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for n := 0; !stopped(); n++ {
			select {
			case <-tick.C:
			case <-tr.stop:
				return
			}
			r := routers[n%len(routers)]
			a, err := send(ctx, r, fmt.Sprintf("steady-%d", n%6), chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
				{Role: "system", Content: systemPrompt(300 + n%6)}, {Role: "user", Content: fmt.Sprintf("question %d", n)}}})
			tr.mu.Lock()
			tr.chats++
			if err != nil || a.status != http.StatusOK {
				tr.failures = append(tr.failures, fmt.Sprintf("%s: %v %d %s", r, err, a.status, a.body))
			}
			tr.mu.Unlock()
		}
	}()
	t.Cleanup(func() { tr.halt() })
	return tr
}

// halt stops the traffic (once) and returns the publisher's error.
func (tr *traffic) halt() error {
	select {
	case <-tr.stop:
		return nil
	default:
	}
	close(tr.stop)
	tr.done.Wait()
	return <-tr.err
}

// waitAcked waits until n more batches than now are acknowledged.
func (tr *traffic) waitAcked(t *testing.T, n int) {
	t.Helper()
	want := tr.p.count() + n
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%d batches acknowledged", want), func() (bool, string) {
		return tr.p.count() >= want, fmt.Sprintf("%d acknowledged", tr.p.count())
	})
}

// stopTraffic stops the load; a publisher refusal or a failed chat request
// fails t.
func (tr *traffic) stopTraffic(t *testing.T) {
	t.Helper()
	if err := tr.halt(); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.p.mu.Lock()
	t.Logf("traffic: %d chat requests, %d batches acknowledged; publish streams restarted after: %v", tr.chats, len(tr.p.acked), tr.p.errs)
	tr.p.mu.Unlock()
	if len(tr.failures) > 0 {
		t.Errorf("%d of %d chat requests failed, first: %s", len(tr.failures), tr.chats, tr.failures[0])
	}
}

// running returns the directory nodes that run.
func running(f *fleet.Fleet) []*fleet.DirNode {
	var out []*fleet.DirNode
	for _, n := range f.Directory.Nodes {
		if n.Running() {
			out = append(out, n)
		}
	}
	return out
}

// checkFollowInvariants runs once the traffic has stopped: the running
// nodes converge on one applied index and digest, each holds every
// acknowledged batch, and every router's view equals the directory's.
func checkFollowInvariants(t *testing.T, f *fleet.Fleet, tr *traffic) {
	t.Helper()
	nodes := running(f)
	testkit.Eventually(t, 20*time.Second, "the running directory nodes to converge", func() (bool, string) {
		var saw []string
		var first *kvdirv1.StatusResponse
		same := true
		for _, n := range nodes {
			st, err := n.Status(context.Background())
			if err != nil {
				return false, fmt.Sprintf("%s: %v", n.ID, err)
			}
			saw = append(saw, fmt.Sprintf("%s:%s applied=%d digest=%016x", st.NodeId, st.State, st.AppliedIndex, st.Digest))
			if first == nil {
				first = st
			} else if st.AppliedIndex != first.AppliedIndex || st.Digest != first.Digest {
				same = false
			}
		}
		return same, strings.Join(saw, "; ")
	})
	for _, n := range nodes {
		checkHeld(t, n, tr.p)
	}
	for _, r := range f.Routers {
		for _, n := range nodes {
			viewEqualsNode(t, r, n)
		}
	}
}

// viewEqualsNode waits until the router's replica and node n are at the
// same applied index (the node's index read before and after the view, so
// that its digest is the one of that index) and fails t if their index
// digests differ there.
func viewEqualsNode(t *testing.T, r *fleet.Router, n *fleet.DirNode) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("%s and %s at one applied index", r.Proc.Name, n.ID), func() (bool, string) {
		st, err := n.Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		v, err := routerView(r.URL)
		if err != nil {
			return false, err.Error()
		}
		again, err := n.Status(context.Background())
		if err != nil {
			return false, err.Error()
		}
		saw := fmt.Sprintf("%s applied %d then %d, digest %016x; view %+v", n.ID, st.AppliedIndex, again.AppliedIndex, st.Digest, v)
		if !v.Following || !v.Synced {
			return false, saw
		}
		if st.AppliedIndex != v.AppliedIndex || again.AppliedIndex != st.AppliedIndex {
			return false, saw
		}
		if want := fmt.Sprintf("%016x", st.Digest); v.IndexDigest != want {
			t.Fatalf("%s's view differs from %s at applied index %d: index digest %s, node %s", r.Proc.Name, n.ID, v.AppliedIndex, v.IndexDigest, want)
		}
		return true, saw
	})
}

// metricSum sums every series of a metric family on a router's /metrics
// (0 when there is none).
func metricSum(t *testing.T, r *fleet.Router, name string) float64 {
	t.Helper()
	resp, err := http.Get(r.URL + "/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", r.Proc.Name, err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("%s /metrics: %q: %v", r.Proc.Name, line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s /metrics: %v", r.Proc.Name, err)
	}
	return sum
}

// pause stops the process with SIGSTOP; the returned function (also run
// at the end of t) resumes it.
func pause(t *testing.T, p *testkit.Proc) (resume func()) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := p.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("resume %s: %v", p.Name, err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}
