package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// workerSeries reads the series of one metric family labelled only by
// worker from url's /metrics, by worker.
func workerSeries(url, name string) (map[string]float64, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix := name + `{worker="`
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		worker, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, err
		}
		out[worker] = v
	}
	return out, sc.Err()
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// setSlow sets every engine's slow_factor: each response's first byte
// then comes that many times later than the engine produced it.
func setSlow(t *testing.T, f *fleet.Fleet, factor float64) {
	t.Helper()
	for _, e := range f.Engines {
		resp, err := http.Post(e.URL+"/admin/faults", "application/json", strings.NewReader(fmt.Sprintf(`{"slow_factor":%v}`, factor)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: set slow_factor: %s", e.WorkerID, resp.Status)
		}
	}
}

// herdPrefix is a shared prefix of about 3,000 tokens, distinct per tag.
func herdPrefix(tag int) string {
	return strings.Repeat(fmt.Sprintf("Runbook %d: the on-call engineer checks the queue, the cache hit rate and the error budget before paging anyone. ", tag), 150)
}

// sibling is request i of a burst: the shared prefix and a question of
// its own of about 400 tokens.
func sibling(tag, i int) chatRequest {
	return chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
		{Role: "system", Content: herdPrefix(tag)},
		{Role: "user", Content: fmt.Sprintf("Question %d of burst %d. ", i, tag) + strings.Repeat(fmt.Sprintf("Detail %d-%d about the incident. ", tag, i), 60)}}}
}

// burst warms the prefix tag on sim-0 (straight to the engine), then
// places n siblings of it through routers in turn, each once the one
// before it is in flight on its router and, with shared, counted by every
// other router as the other routers' intent; every response is held back
// (slow_factor) so that nothing leaves a queue meanwhile. It returns how
// many requests each worker got, from the routers' in-flight gauges,
// then cancels them all.
func burst(t *testing.T, f *fleet.Fleet, routers []string, shared bool, tag, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	setSlow(t, f, 1)
	warm := sibling(tag, -1)
	if a, err := send(ctx, f.Engines[0].URL, "", warm); err != nil || a.status != http.StatusOK {
		t.Fatalf("warm sim-0: %v %d %s", err, a.status, a.body)
	}
	for _, r := range routers {
		testkit.Eventually(t, 20*time.Second, r+" to see the prefix on sim-0", func() (bool, string) {
			e, err := explainWith(ctx, r, "", sibling(tag, 0), nil)
			if err != nil {
				return false, err.Error()
			}
			for _, w := range e.Workers {
				if w.Worker == "sim-0" {
					return w.MatchedBlocks*e.BlockSize >= 2900 && e.Fallback == "", fmt.Sprintf("%d blocks, fallback %q", w.MatchedBlocks, e.Fallback)
				}
			}
			return false, "sim-0 not a candidate"
		})
	}
	setSlow(t, f, 1000)
	sentTo := make([]int, len(routers))
	for i := range n {
		k := i % len(routers)
		go func() { _, _ = send(ctx, routers[k], "", sibling(tag, i)) }()
		sentTo[k]++
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("request %d in flight", i), func() (bool, string) {
			for j, r := range routers {
				own, err := workerSeries(r, "kvdir_router_inflight")
				if err != nil {
					return false, err.Error()
				}
				if int(sum(own)) != sentTo[j] {
					return false, fmt.Sprintf("%s: %v in flight, sent %d", r, own, sentTo[j])
				}
				if !shared {
					continue
				}
				peers, err := workerSeries(r, "kvdir_router_peer_inflight")
				if err != nil {
					return false, err.Error()
				}
				if int(sum(peers)) != i+1-sentTo[j] {
					return false, fmt.Sprintf("%s: peers' %v in flight, want %d", r, peers, i+1-sentTo[j])
				}
			}
			return true, ""
		})
	}
	got := map[string]int{}
	for _, r := range routers {
		own, err := workerSeries(r, "kvdir_router_inflight")
		if err != nil {
			t.Fatal(err)
		}
		for w, v := range own {
			got[w] += int(v)
		}
	}
	cancel()
	for _, r := range routers {
		testkit.Eventually(t, 20*time.Second, r+" to drain the burst", func() (bool, string) {
			own, err := workerSeries(r, "kvdir_router_inflight")
			return err == nil && sum(own) == 0, fmt.Sprint(own, err)
		})
	}
	return got
}

// TestSharedIntentsStopHerding places a burst of one session's sibling
// requests (a long shared prefix, warm on sim-0, and a different last
// message each) through one router, through two routers sharing their
// intents, and through two that do not. One router spills the burst to
// sim-1 once sim-0's queue costs more than its prefix saves; two sharing
// routers do the same, as one; two that do not each think sim-0 has only
// their own half of the burst queued, and pile it all there. Late binding
// is off: the burst is meant to reach the engines' queues at once, where
// placement alone decides who gets it (with it the routers hold the
// siblings while both engines are past their knee).
func TestSharedIntentsStopHerding(t *testing.T) {
	const n = 20
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 4,
		EngineArgs:    []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs:    []string{"--policy", "kvdir", "--match-timeout", "200ms", "--follow-log", "--admission-queue", "0"},
		PerRouterArgs: [][]string{{"--router-id", "shared-0"}, {"--router-id", "shared-1"}, {"--router-id", "alone-0", "--share-intents=false"}, {"--router-id", "alone-1", "--share-intents=false"}}})
	r := func(i int) string { return f.Routers[i].URL }
	single := burst(t, f, []string{r(0)}, false, 1, n)
	shared := burst(t, f, []string{r(0), r(1)}, true, 2, n)
	unshared := burst(t, f, []string{r(2), r(3)}, false, 3, n)
	t.Logf("burst of %d siblings, requests on the warm worker sim-0: one router %d, two sharing intents %d, two not sharing %d (sim-1: %d, %d, %d)",
		n, single["sim-0"], shared["sim-0"], unshared["sim-0"], single["sim-1"], shared["sim-1"], unshared["sim-1"])
	if single["sim-0"] >= n {
		t.Fatalf("one router placed all %d siblings on sim-0: the burst is too small to make it spill, the comparison shows nothing", n)
	}
	if shared["sim-0"] > single["sim-0"]+1 {
		t.Errorf("two routers sharing intents sent %d of the burst to sim-0, one router alone %d", shared["sim-0"], single["sim-0"])
	}
	if unshared["sim-0"] < single["sim-0"]+3 {
		t.Errorf("two routers without shared intents sent %d to sim-0, one router alone %d: expected them to pile on it", unshared["sim-0"], single["sim-0"])
	}

	// Traffic has stopped: kvdirctl status lists every router, each
	// with a replica whose digest agrees with its node's.
	testkit.Eventually(t, 30*time.Second, "kvdirctl status to list the four routers, agreeing", func() (bool, string) {
		out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "status", "-o", "json")
		if code != 0 {
			return false, errOut
		}
		var st ctlview.Status
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return false, err.Error()
		}
		// The DIGEST column is the index digest, as the nodes': equal at
		// the same applied index.
		nodeDigest := map[uint64]string{}
		for _, nd := range st.Nodes {
			nodeDigest[nd.AppliedIndex] = nd.Digest
		}
		var ids []string
		for _, rt := range st.Routers {
			if rt.Follows && rt.Synced && nodeDigest[rt.AppliedIndex] == rt.Digest {
				ids = append(ids, rt.ID)
			}
		}
		return len(ids) == 4 && st.RouterDigests != nil && st.RouterDigests.Agree, fmt.Sprint(ids, st.RouterDigests)
	})
	out, errOut, code := ctl(t, "--directory", f.DirectoryAddrs(), "status")
	if code != 0 {
		t.Fatalf("kvdirctl status: exit %d: %s", code, errOut)
	}
	t.Logf("kvdirctl status:\n%s", out)
	for _, want := range []string{"ROUTER", "shared-0", "shared-1", "alone-0", "alone-1", "routers:  agree: 4 router(s)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("kvdirctl status lacks %q:\n%s", want, out)
		}
	}
}
