package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// misconfigFleet is one engine with its agent, a directory and two routers
// that list the worker statically (--workers id=url@model) and match
// prefixes in the directory.
type misconfigFleet struct {
	f      *fleet.Fleet
	r0, r1 *fleet.Router
	dir    *dirclient.Client
	// agentModel is the model name the agent registered and hashes in.
	agentModel string
}

// startMisconfigFleet starts the fleet; agentModel, if set, is the model
// name the agent registers (and hashes) instead of the one the engine
// serves and the routers send.
func startMisconfigFleet(t *testing.T, agentModel string) *misconfigFleet {
	t.Helper()
	cfg := fleet.Config{Engines: 1, DirectoryNodes: 1,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"}}
	if agentModel != "" {
		cfg.AgentArgs = []string{"--model", agentModel} // the later --model wins
	}
	f := fleet.New(t, cfg)
	bin := testkit.Binary(t, "router")
	ports, err := testkit.LoopbackPorts(2)
	if err != nil {
		t.Fatal(err)
	}
	e := f.Engines[0]
	m := &misconfigFleet{f: f, agentModel: "llama3-8b"}
	if agentModel != "" {
		m.agentModel = agentModel
	}
	for i, port := range ports {
		r := &fleet.Router{URL: fmt.Sprintf("http://127.0.0.1:%d", port)}
		r.Proc, err = fleet.StartProc(fmt.Sprintf("router-%d", i), bin, "--addr", strings.TrimPrefix(r.URL, "http://"),
			"--directory", f.DirectoryAddrs(), "--workers", e.WorkerID+"="+e.URL+"@llama3-8b",
			"--policy", "kvdir", "--match-timeout", "50ms", "--share-intents=false", "--log-level", "info",
			"--explain", "open") // the test reads the predicted header
		if err != nil {
			t.Fatal(err)
		}
		r.Proc.Cleanup(t)
		if err := f.WaitRouterWorkers(context.Background(), r, 1, 60*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, r.Proc.Tail(20))
		}
		if i == 0 {
			m.r0 = r
		} else {
			m.r1 = r
		}
	}
	if m.dir, err = dirclient.New(dirclient.Config{Addrs: strings.Split(f.DirectoryAddrs(), ",")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.dir.Close() })
	return m
}

// heldBlocks returns how many leading blocks of conversation c (as the
// router renders it, with the generation prompt) the directory holds on
// the worker, hashed as its agent hashes them: in the agent's model name.
func (m *misconfigFleet) heldBlocks(t *testing.T, ctx context.Context, c chatRequest) (held, full int, err error) {
	t.Helper()
	var tm []tokenize.Message
	for _, msg := range c.Messages {
		tm = append(tm, tokenize.Message{Role: msg.Role, Content: tokenize.TextContent(msg.Content)})
	}
	ids, _ := chainOf(t, tm)
	resp, err := m.dir.MatchTokens(ctx, ids, &kvdirv1.Namespace{Model: m.agentModel, BlockSize: 16}, false)
	if err != nil {
		return 0, 0, err
	}
	for _, wm := range resp.GetMatches() {
		if wm.GetWorkerId() == m.f.Engines[0].WorkerID {
			held = int(wm.GetBlocks())
		}
	}
	return held, len(ids) / 16, nil
}

// converse runs sessions two-turn sessions: turn 1 through router 0, then,
// once the directory holds turn 1's blocks, turn 2 through router 1 (which
// has not seen the prompt, so only the directory can predict its cache).
// It checks that the engine served turn 2 from its cache and returns the
// predictions router 1 made.
func (m *misconfigFleet) converse(t *testing.T, ctx context.Context, sessions int) []string {
	t.Helper()
	var predicted []string
	for i := range sessions {
		sess := fmt.Sprintf("misconfig-%d", i)
		c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
			{Role: "system", Content: systemPrompt(100 + i)}, {Role: "user", Content: fmt.Sprintf("Question %d: what does a prefix cache save?", i)}}}
		a1, err := send(ctx, m.r0.URL, sess, c)
		if err != nil || a1.status != 200 {
			t.Fatalf("turn 1 of %s: %v %+v", sess, err, a1)
		}
		testkit.Eventually(t, 15*time.Second, "the directory to hold turn 1's blocks", func() (bool, string) {
			held, full, err := m.heldBlocks(t, ctx, c)
			return err == nil && held >= max(full-1, 1), fmt.Sprintf("%d of %d blocks held, %v", held, full, err)
		})
		c.Messages = append(c.Messages, message{Role: "assistant", Content: a1.content}, message{Role: "user", Content: "And what does it cost?"})
		a2, err := send(ctx, m.r1.URL, sess, c)
		if err != nil || a2.status != 200 {
			t.Fatalf("turn 2 of %s: %v %+v", sess, err, a2)
		}
		if a2.cached < 16 {
			t.Fatalf("%s: the engine served %d cached tokens of turn 2; the test needs it to cache", sess, a2.cached)
		}
		predicted = append(predicted, a2.predicted)
	}
	return predicted
}

// statusJSON runs the real kvdirctl status against the fleet's directory.
func (m *misconfigFleet) statusJSON(t *testing.T) (ctlview.Status, string) {
	t.Helper()
	out, errOut, code := ctl(t, "--directory", m.f.DirectoryAddrs(), "status", "-o", "json")
	if code != 0 {
		t.Fatalf("kvdirctl status: exit %d\n%s\n%s", code, out, errOut)
	}
	var st ctlview.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("kvdirctl status -o json: %v\n%s", err, out)
	}
	human, errOut, code := ctl(t, "--directory", m.f.DirectoryAddrs(), "status")
	if code != 0 {
		t.Fatalf("kvdirctl status: exit %d\n%s\n%s", code, human, errOut)
	}
	return st, human
}

// TestMisconfigWrongModelNameIsFlagged: the routers' static worker list
// says the worker serves llama3-8b (and the engine does serve it), while
// its agent registered it as llama3-8b-instruct. Requests succeed and the
// engine caches, but the router hashes under llama3-8b and the agent under
// llama3-8b-instruct, so no prediction ever matches: silent before the
// check (a directory-discovered router would refuse the request with "model
// does not exist" instead, which is loud). Within 30 s of traffic router 1's
// metric and log, and kvdirctl status, name the model name.
func TestMisconfigWrongModelNameIsFlagged(t *testing.T) {
	ctx := context.Background()
	m := startMisconfigFleet(t, "llama3-8b-instruct")
	start := time.Now()
	for _, p := range m.converse(t, ctx, 8) {
		if p != "0" {
			t.Fatalf("router 1 predicted %s cached tokens through a mismatched namespace", p)
		}
	}
	t.Logf("traffic took %v", time.Since(start))
	series := `kvdir_router_cache_mismatch{cause="model name",worker="sim-0"} 1`
	testkit.Eventually(t, 30*time.Second-time.Since(start), "router 1 to flag sim-0", func() (bool, string) {
		_, body, err := httpGet(m.r1.URL + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(body, series), "no " + series
	})
	t.Logf("router 1 flagged sim-0 %v after the traffic started", time.Since(start))
	log := m.r1.Proc.Log()
	if strings.Count(log, "router: cache mismatch:") != 1 || !strings.Contains(log, `likely_cause="model name"`) ||
		!strings.Contains(log, "registered_model=llama3-8b-instruct") || !strings.Contains(log, "request_model=llama3-8b") {
		t.Fatalf("router 1's log lacks one warning naming the model name:\n%s", log)
	}
	testkit.Eventually(t, 30*time.Second-time.Since(start), "kvdirctl status to flag sim-0", func() (bool, string) {
		st, human := m.statusJSON(t)
		if len(st.CacheMismatches) != 1 {
			return false, fmt.Sprintf("cache_mismatches %+v", st.CacheMismatches)
		}
		cm := st.CacheMismatches[0]
		ok := cm.Worker == "sim-0" && cm.Condition == "unmatched-events" && cm.LikelyCause == "model name" &&
			cm.UnpredictedHits >= 6 && strings.Contains(human, "MISMATCH: worker sim-0 (model llama3-8b-instruct)") &&
			strings.Contains(human, "likely cause: model name;")
		if ok {
			t.Logf("kvdirctl status:\n%s", human)
		}
		return ok, fmt.Sprintf("%+v\n%s", cm, human)
	})
}

// TestMisconfigCorrectFleetIsNotFlagged: the same deployment and traffic
// with the agent registering the model the routers send is not flagged,
// and the directory did predict turn 2's cache.
func TestMisconfigCorrectFleetIsNotFlagged(t *testing.T) {
	ctx := context.Background()
	m := startMisconfigFleet(t, "")
	for i, p := range m.converse(t, ctx, 8) {
		if p == "" || p == "0" {
			t.Fatalf("session %d: router 1 predicted %q cached tokens in a correct fleet", i, p)
		}
	}
	// The last session's records have reached the directory.
	testkit.Eventually(t, 10*time.Second, "the directory to count 8 predicted turns", func() (bool, string) {
		resp, err := m.dir.GetWorker(ctx, "sim-0", 0)
		if err != nil {
			return false, err.Error()
		}
		acc := resp.GetWorker().GetCacheAccounting()
		return acc.GetPredictedTurns() >= 8, fmt.Sprintf("accounting %v", acc)
	})
	for _, r := range []*fleet.Router{m.r0, m.r1} {
		_, body, err := httpGet(r.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(body, "kvdir_router_cache_mismatch{") {
			t.Fatalf("%s flags a correct fleet:\n%s", r.Proc.Name, body)
		}
		if strings.Contains(r.Proc.Log(), "cache mismatch") {
			t.Fatalf("%s logged a mismatch:\n%s", r.Proc.Name, r.Proc.Log())
		}
	}
	st, human := m.statusJSON(t)
	if len(st.CacheMismatches) != 0 || !strings.Contains(human, "no worker flagged") {
		t.Fatalf("kvdirctl status flags a correct fleet: %+v\n%s", st.CacheMismatches, human)
	}
}
