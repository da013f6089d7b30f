package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// groupWorkers returns the ids and models of the workers node n lists.
func groupWorkers(ctx context.Context, n *fleet.DirNode) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	lw, err := kvdirv1.NewDirectoryServiceClient(n.Conn()).ListWorkers(ctx, &kvdirv1.ListWorkersRequest{IncludeGone: true})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, w := range lw.Workers {
		out[w.GetSpec().GetId()] = w.GetSpec().GetModel()
	}
	return out, nil
}

// TestDirectoryGroups runs two directory groups as processes: group a (one
// node, --models model-a) with two engines of model-a, group b (three
// nodes, --models model-b) with one engine of model-b, and one router given
// both with --directory-group. An agent of model-a pointed at group b is
// refused, says why, and never appears in group b. The router sends
// model-a only to a's workers, a session's second turn where its first
// went (matched in a), and model-b to b's worker. Killing group b's leader
// does not disturb model-a: its requests keep succeeding, placed with a's
// directory (no fallback), while b re-elects. At the end every node of a
// group lists the same workers, all of its own model.
func TestDirectoryGroups(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Routers: 1,
		Groups: []fleet.GroupConfig{
			{Name: "a", Nodes: 1, Model: "model-a", Engines: 2},
			{Name: "b", Nodes: 3, Model: "model-b", Engines: 1},
		},
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "200ms"}})
	ga, gb := f.Groups[0], f.Groups[1]
	r := f.Routers[0].URL
	workersOf := map[string][]string{}
	for _, e := range f.Engines {
		workersOf[e.Model] = append(workersOf[e.Model], e.WorkerID)
	}

	// An agent of model-a pointed at group b: refused, with the reason.
	stray, err := fleet.StartProc("agent-stray", f.Bin("agent"), "--directory", gb.Directory.Addrs(), "--worker-id", "stray-a",
		"--worker-address", f.Engines[0].URL, "--model", "model-a", "--engine-kind", "enginesim",
		"--kv-events-endpoint", "tcp://127.0.0.1:1", "--http-addr", "127.0.0.1:0", "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stray.Terminate(5 * time.Second) })
	testkit.Eventually(t, 20*time.Second, "the stray agent to log why group b refuses it", func() (bool, string) {
		l := stray.Log()
		return strings.Contains(l, "this group serves model-b") && strings.Contains(l, "that model belongs to another group"), stray.Tail(5)
	})

	chat := func(model, session string, turn int) chatRequest {
		msgs := []message{{Role: "system", Content: systemPrompt(len(session))}, {Role: "user", Content: "question one of " + session}}
		if turn == 2 {
			msgs = append(msgs, message{Role: "assistant", Content: "an answer"}, message{Role: "user", Content: "question two"})
		}
		return chatRequest{Model: model, Messages: msgs, MaxTokens: 4}
	}
	for i := range 4 {
		for _, m := range []string{"model-a", "model-b"} {
			s := fmt.Sprintf("%s-session-%d", m, i)
			a1, err := send(ctx, r, s, chat(m, s, 1))
			if err != nil || a1.status != 200 || !slices.Contains(workersOf[m], a1.worker) || a1.fallback != "" {
				t.Fatalf("%s turn 1: %v %d worker %q fallback %q %s", m, err, a1.status, a1.worker, a1.fallback, a1.body)
			}
			var a2 answer
			testkit.Eventually(t, 10*time.Second, s+" turn 2 on turn 1's worker, cached", func() (bool, string) {
				a2, err = send(ctx, r, s, chat(m, s, 2))
				return err == nil && a2.status == 200 && a2.worker == a1.worker && a2.cached > 0 && a2.fallback == "",
					fmt.Sprintf("%v %d worker %q (turn 1 %q) cached %d fallback %q", err, a2.status, a2.worker, a1.worker, a2.cached, a2.fallback)
			})
		}
	}

	// Group b loses its leader; model-a must not notice.
	leader, err := gb.Directory.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fallbacksA, err := labelledSum(r, "kvdir_router_fallbacks_total", `group="a"`)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var bad []string
	sentA := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			s := fmt.Sprintf("during-%d", n%8)
			a, err := send(ctx, r, s, chat("model-a", s, 1+n%2))
			mu.Lock()
			sentA++
			if err != nil || a.status != 200 || !slices.Contains(workersOf["model-a"], a.worker) || a.fallback != "" {
				bad = append(bad, fmt.Sprintf("%v %d worker %q fallback %q", err, a.status, a.worker, a.fallback))
			}
			mu.Unlock()
		}
	}()
	gb.Directory.Nodes[leader].Kill9()
	if _, err := gb.Directory.WaitLeader(30 * time.Second); err != nil {
		t.Fatalf("group b after its leader died: %v", err)
	}
	// Model-b is served again through b's new leader.
	testkit.Eventually(t, 20*time.Second, "model-b placed with its group's directory again", func() (bool, string) {
		a, err := send(ctx, r, "after-b", chat("model-b", "after-b", 1))
		return err == nil && a.status == 200 && a.worker == workersOf["model-b"][0] && a.fallback == "",
			fmt.Sprintf("%v %d %q fallback %q", err, a.status, a.worker, a.fallback)
	})
	close(stop)
	wg.Wait()
	if sentA < 5 || len(bad) > 0 {
		t.Fatalf("model-a while group b re-elected: %d requests, %d bad: %v", sentA, len(bad), bad[:min(len(bad), 5)])
	}
	t.Logf("model-a requests while group b re-elected: %d, all placed with group a's directory", sentA)
	if now, err := labelledSum(r, "kvdir_router_fallbacks_total", `group="a"`); err != nil || now != fallbacksA {
		t.Fatalf("group a's fallbacks went from %v to %v (%v)", fallbacksA, now, err)
	}

	// Invariants: the nodes of a group agree, and hold only their model.
	for _, g := range []*fleet.Group{ga, gb} {
		testkit.Eventually(t, 20*time.Second, "group "+g.Name+"'s running nodes to list the same workers", func() (bool, string) {
			var first map[string]string
			for _, n := range g.Directory.Nodes {
				if !n.Running() {
					continue
				}
				ws, err := groupWorkers(ctx, n)
				if err != nil {
					return false, fmt.Sprintf("%s: %v", n.ID, err)
				}
				for id, m := range ws {
					if m != g.Model {
						t.Fatalf("group %s node %s lists worker %s of model %s", g.Name, n.ID, id, m)
					}
				}
				if first == nil {
					first = ws
				} else if fmt.Sprint(first) != fmt.Sprint(ws) {
					return false, fmt.Sprintf("%v vs %s's %v", first, n.ID, ws)
				}
			}
			return len(first) == len(workersOf[g.Model]), fmt.Sprint(first)
		})
	}
}
