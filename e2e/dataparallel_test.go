package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// portPair returns a loopback port p such that p and p+1 are free: a base
// port of a two-rank engine's event sockets (rank r uses p + r).
func portPair(t *testing.T) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		l.Close()
		if err == nil {
			l2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// startProc starts a process that stops at the end of t, logging its
// output tail if t failed.
func startProc(t *testing.T, name, bin string, args ...string) *testkit.Proc {
	t.Helper()
	p, err := fleet.StartProc(name, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Terminate(10 * time.Second)
		if t.Failed() {
			t.Logf("---- %s\n%s", name, p.Tail(30))
		}
	})
	return p
}

// TestDataParallelBehindOneServer runs one enginesim with two
// data-parallel ranks behind one HTTP server (as vLLM's
// --data-parallel-size 2), its events bound on loopback as
// docs/engine-side.md shows, one agent with --data-parallel-size 2 (workers
// sim-dp-dp0 and sim-dp-dp1, one event stream each), an ordinary engine
// beside it, a 3-node directory and two routers. Turn 2 of every session
// lands on turn 1's worker and the engine reports its cached tokens: for a
// rank worker that proves the router's X-data-parallel-rank header reached
// the rank holding the blocks, since the other rank's cache is cold.
// Sessions go to both ranks.
func TestDataParallelBehindOneServer(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 1, EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"}})

	httpPort := testkit.Port(testkit.FreeAddrs(t, 1)[0])
	pub, replay := portPair(t), portPair(t)
	dpURL := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	startProc(t, "enginesim-dp", f.Bin("enginesim"), "--addr", strings.TrimPrefix(dpURL, "http://"), "--model", "llama3-8b",
		"--seed", "7", "--data-parallel-size", "2", "--time-scale", "0.02", "--default-max-tokens", "4",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub), "--kv-events-bind",
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replay), "--log-level", "warn")
	startProc(t, "agent-dp", f.Bin("agent"), "--directory", f.DirectoryAddrs(), "--worker-id", "sim-dp",
		"--worker-address", dpURL, "--model", "llama3-8b", "--engine-kind", "enginesim", "--data-parallel-size", "2",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", replay),
		"--http-addr", "127.0.0.1:0", "--log-level", "warn")
	var routers []string
	for i, addr := range testkit.FreeAddrs(t, 2) {
		name := fmt.Sprintf("router-%d", i)
		r := &fleet.Router{URL: "http://" + addr, Proc: startProc(t, name, f.Bin("router"), "--addr", addr,
			"--directory", f.DirectoryAddrs(), "--policy", "kvdir", "--match-timeout", "200ms", "--share-intents=false", "--explain", "open", "--log-level", "warn")}
		if err := f.WaitRouterWorkers(ctx, r, 3, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		routers = append(routers, r.URL)
	}

	// The directory knows each rank worker's rank; kvdirctl shows it.
	var list ctlview.WorkerList
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "workers", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("kvdirctl workers: exit %d\n%s\n%s", code, out, errOut)
	}
	ranks := map[string]string{}
	for _, w := range list.Workers {
		ranks[w.ID] = "-"
		if w.DataParallelRank != nil {
			ranks[w.ID] = fmt.Sprint(*w.DataParallelRank)
		}
	}
	if want := map[string]string{"sim-0": "-", "sim-dp-dp0": "0", "sim-dp-dp1": "1"}; fmt.Sprint(ranks) != fmt.Sprint(want) {
		t.Fatalf("workers' ranks %v, want %v", ranks, want)
	}
	if out, _, _ := ctl(t, "--directory", f.DirectoryAddrs(), "workers"); !strings.Contains(out, dpURL+"#1") {
		t.Fatalf("kvdirctl workers does not show %s#1:\n%s", dpURL, out)
	}

	// Sessions until both ranks had some (placement breaks ties at random).
	onWorker := map[string][]int{}
	for i := 0; i < 24 && (i < 4 || len(onWorker["sim-dp-dp0"]) == 0 || len(onWorker["sim-dp-dp1"]) == 0); i++ {
		a1, _ := turnTwoFollowsTurnOne(t, ctx, routers[0], routers[1], fmt.Sprintf("dp-%d", i), 100+i, turnCheck{})
		onWorker[a1.worker] = append(onWorker[a1.worker], 100+i)
	}
	if len(onWorker["sim-dp-dp0"]) == 0 || len(onWorker["sim-dp-dp1"]) == 0 {
		t.Fatalf("sessions by worker %v: want some on each rank", onWorker)
	}

	// Straight to the engine: a session's system prompt is cached on its
	// rank only.
	for r, id := range []string{"sim-dp-dp0", "sim-dp-dp1"} {
		i := onWorker[id][0]
		c := chatRequest{Model: "llama3-8b", MaxTokens: 1, Messages: []message{{Role: "system", Content: systemPrompt(i)}, {Role: "user", Content: "Once more."}}}
		other, err := sendWith(ctx, dpURL, "", c, map[string]string{"X-data-parallel-rank": fmt.Sprint(1 - r)})
		if err != nil || other.status != http.StatusOK || other.cached != 0 {
			t.Fatalf("session %d (on rank %d) sent to rank %d: %v %+v, want 0 cached tokens", i, r, 1-r, err, other)
		}
		own, err := sendWith(ctx, dpURL, "", c, map[string]string{"X-data-parallel-rank": fmt.Sprint(r)})
		if err != nil || own.status != http.StatusOK || own.cached == 0 {
			t.Fatalf("session %d sent to its rank %d: %v %+v, want cached tokens", i, r, err, own)
		}
	}
}
