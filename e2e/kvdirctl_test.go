package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const (
	testModel = "llama3-8b"
	workerA   = "enginesim-a"
	workerB   = "enginesim-b"
)

// testEnv is the shared cluster: three directory processes, two enginesims
// and their agents.
type testEnv struct {
	cluster *fleet.Directory
	addrs   string // every node's API address, comma-separated
	sims    map[string]string
	router  string // the router's base URL
	client  *dirclient.Client
}

func startEnv(t *testing.T) *testEnv {
	t.Helper()
	bins := testkit.Binaries(t, "directory", "enginesim", "agent", "router", "kvdirctl")
	c, err := fleet.StartDirectory(bins["directory"], filepath.Join(t.TempDir(), "cluster"), 3, "--log-level", "warn", "--load-interval", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{cluster: c, sims: map[string]string{}}
	t.Cleanup(func() {
		if e.client != nil {
			e.client.Close()
		}
		c.Stop()
		if t.Failed() || os.Getenv("TEST_DUMP_LOGS") != "" {
			t.Log(c.Logs(20))
		}
	})
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.addrs = c.Addrs()
	for _, id := range []string{workerA, workerB} {
		ports := testkit.FreeAddrs(t, 4)
		sim := ports[0]
		testkit.StartProc(t, id+"/enginesim", bins["enginesim"], "--addr", sim, "--model", testModel,
			"--time-scale", "0", "--log-level", "warn",
			"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", testkit.Port(ports[1])),
			"--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", testkit.Port(ports[2])))
		testkit.Eventually(t, 30*time.Second, id+" enginesim healthy", func() (bool, string) {
			resp, err := http.Get("http://" + sim + "/health")
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, resp.Status
		})
		testkit.StartProc(t, id+"/agent", bins["agent"], "--directory", e.addrs, "--worker-id", id,
			"--worker-address", "http://"+sim, "--model", testModel, "--engine-kind", "enginesim",
			"--kv-events-endpoint", "tcp://"+ports[1],
			"--kv-events-replay-endpoint", "tcp://"+ports[2],
			"--http-addr", ports[3], "--heartbeat-interval", "100ms", "--log-level", "warn")
		e.sims[id] = "http://" + sim
	}
	e.router = "http://" + testkit.FreeAddrs(t, 1)[0]
	// The router's explain is private, as by default with a token: the
	// explain tests pass the operator's token.
	tokenFile := filepath.Join(t.TempDir(), "explain-token")
	if err := os.WriteFile(tokenFile, []byte(explainToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.StartProc(t, "router", bins["router"], "--addr", strings.TrimPrefix(e.router, "http://"),
		// The default 5 ms match deadline is for production; a loaded
		// test machine misses it and the router falls back to hashing.
		"--directory", e.addrs, "--seed", "1", "--match-timeout", "200ms", "--log-level", "warn",
		"--explain-token-file", tokenFile)
	testkit.Eventually(t, 30*time.Second, "router ready", func() (bool, string) {
		resp, err := http.Get(e.router + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if e.client, err = dirclient.New(dirclient.Config{Addrs: strings.Split(e.addrs, ",")}); err != nil {
		t.Fatal(err)
	}
	return e
}

// explainToken is the test router's operator token for explain.
const explainToken = "e2e-operator"

// kvdirctl's exit codes.
const (
	exitError = 1
	exitUsage = 2
)

// ctl runs the kvdirctl binary with args, no KVDIR* variable in its
// environment, and returns its stdout, stderr and exit status.
func ctl(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(testkit.Binary(t, "kvdirctl"), args...)
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("kvdirctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// cleanEnv is the test's environment without kvdir's own variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVDIR") {
			env = append(env, kv)
		}
	}
	return env
}

// ctlOK runs kvdirctl against the cluster and fails the test unless it
// exits 0.
func (e *testEnv) ctlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := ctl(t, append([]string{"--directory", e.addrs}, args...)...)
	if code != 0 {
		t.Fatalf("kvdirctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// ctlJSON runs kvdirctl with -o json and decodes its output into v.
func (e *testEnv) ctlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := e.ctlOK(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kvdirctl %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// usage is what an engine reports for a completion.
type usage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chat sends a chat request straight to an engine and returns its usage.
func chat(t *testing.T, engineURL string, msgs []tokenize.Message) usage {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "max_tokens": 4})
	resp, err := http.Post(engineURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: status %s, %v", resp.Status, err)
	}
	return out.Usage
}

// engineMetric reads one series of an engine's /metrics.
func engineMetric(t *testing.T, engineURL, name string) float64 {
	t.Helper()
	resp, err := http.Get(engineURL + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("engine %s has no metric %s", engineURL, name)
	return 0
}

func indexOfWorker(x router.Explanation, id string) int {
	for i, w := range x.Workers {
		if w.Worker == id {
			return i
		}
	}
	return -1
}

// checkRow finds the table row whose first cell is first and checks its
// next cells.
func checkRow(t *testing.T, table, first string, cells ...string) {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != first {
			continue
		}
		if len(f) < len(cells)+1 || strings.Join(f[1:len(cells)+1], " ") != strings.Join(cells, " ") {
			t.Errorf("row %s: %q, want it to start with %q\n%s", first, f, cells, table)
		}
		return
	}
	t.Errorf("no row %s in\n%s", first, table)
}

func msgs(pairs ...string) []tokenize.Message {
	var out []tokenize.Message
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, tokenize.Message{Role: pairs[i], Content: tokenize.TextContent(pairs[i+1])})
	}
	return out
}

func writeJSON(t *testing.T, v any) string {
	t.Helper()
	b, _ := json.Marshal(v)
	p := filepath.Join(t.TempDir(), "req.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// chainOf renders and hashes a conversation as a router does.
func chainOf(t *testing.T, m []tokenize.Message) ([]uint32, []uint64) {
	t.Helper()
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tmpl.RenderChat(m, true)
	if err != nil {
		t.Fatal(err)
	}
	h, err := blockhash.New(blockhash.Namespace{Model: testModel, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	return ids, h.Chain(nil, ids, nil)
}

// The operator CLI against a real cluster: three cmd/directory processes,
// two cmd/enginesim engines with their cmd/agent. Chat requests go straight
// to the engines; sessions are recorded as the router records them; every
// command's table and JSON output is checked against what the engines
// report.
func TestKvdirctlCluster(t *testing.T) {
	e := startEnv(t)
	simA, simB := e.sims[workerA], e.sims[workerB]

	var workers ctlview.WorkerList
	byID := func() map[string]ctlview.Worker {
		m := map[string]ctlview.Worker{}
		for _, w := range workers.Workers {
			m[w.ID] = w
		}
		return m
	}
	testkit.Eventually(t, 30*time.Second, "both workers ACTIVE", func() (bool, string) {
		e.ctlJSON(t, &workers, "workers")
		m := byID()
		return m[workerA].State == "ACTIVE" && m[workerB].State == "ACTIVE", ""
	})

	system := "You are a concise assistant for an LLM serving team. Answer in one sentence, and name the metric that shows it."
	turn1 := msgs("system", system, "user", "What does a prefix cache save, and how would I see it on a dashboard?")
	turn2 := append(append([]tokenize.Message{}, turn1...), msgs(
		"assistant", "It saves recomputing the shared prefix; watch the prefix-cache hit counter over the query counter.",
		"user", "And what happens to that saving when a router spreads one chat session over eight replicas at random?")...)
	other := msgs("system", "You are a code reviewer. Be brief.", "user", "Review this Go function for races: func inc() { counter++ } called from many goroutines.")
	ids1, chain1 := chainOf(t, turn1)
	ids2, chain2 := chainOf(t, turn2)
	_, chainOther := chainOf(t, other)

	// Turn 1 runs on both engines; another session on B.
	for _, sim := range []string{simA, simB} {
		if u := chat(t, sim, turn1); u.PromptTokens != len(ids1) || u.Details.CachedTokens != 0 {
			t.Fatalf("turn 1: usage %+v, want %d prompt tokens, none cached", u, len(ids1))
		}
	}
	uOther := chat(t, simB, other)

	var match ctlview.Match
	file1 := writeJSON(t, map[string]any{"model": testModel, "messages": turn1})
	testkit.Eventually(t, 10*time.Second, "turn 1's blocks in the directory", func() (bool, string) {
		e.ctlJSON(t, &match, "match", "--messages", file1)
		return len(match.Workers) == 2 && match.Workers[0].MatchedBlocks == uint32(len(chain1)) && match.Workers[1].MatchedBlocks == uint32(len(chain1)), ""
	})

	t.Run("match", func(t *testing.T) {
		// The turn-2 prompt: each worker holds turn 1's blocks, and the
		// engine then reports exactly the HIT-TOKENS match predicted.
		var m ctlview.Match
		e.ctlJSON(t, &m, "match", "--model", testModel, "--messages", writeJSON(t, turn2))
		if m.PromptTokens != len(ids2) || len(m.Workers) != 2 {
			t.Fatalf("match: %+v, want %d prompt tokens and 2 workers", m, len(ids2))
		}
		hit := map[string]ctlview.MatchRow{}
		for _, r := range m.Workers {
			hit[r.Worker] = r
			if r.ChainBlocks != len(chain2) || r.MatchedBlocks != uint32(len(chain1)) || r.MatchedTokens != uint64(16*len(chain1)) {
				t.Errorf("%s: %+v, want %d of %d blocks", r.Worker, r, len(chain1), len(chain2))
			}
		}
		u := chat(t, simA, turn2)
		if u.PromptTokens != len(ids2) || uint64(u.Details.CachedTokens) != hit[workerA].HitTokens {
			t.Fatalf("turn 2 on %s: engine usage %+v, kvdirctl match said %d hit tokens", workerA, u, hit[workerA].HitTokens)
		}
		// As a table, and with --chat/--system for a one-turn prompt.
		out := e.ctlOK(t, "match", "--model", testModel, "--system", system, "--chat", turn1[1].Content.Text)
		want := fmt.Sprintf("prompt: %d tokens (chat, 2 message(s), ChatML over cl100k), model %s", len(ids1), testModel)
		if !strings.Contains(out, want) {
			t.Errorf("match table lacks %q:\n%s", want, out)
		}
		for _, w := range []string{workerA, workerB} {
			checkRow(t, out, w, "ACTIVE", "16", fmt.Sprintf("%d/%d", len(chain1), len(chain1)), fmt.Sprint(16*len(chain1)))
		}
		// Record the sessions as the router will: the turn's chain tail, its
		// length, and the engine's usage.
		_, err := e.client.RecordSessions(context.Background(), []*kvdirv1.SessionRecord{
			{SessionId: "chat-7f3a", Tail: chain2[len(chain2)-1], Blocks: uint32(len(chain2)), PromptTokens: uint32(u.PromptTokens),
				CachedTokens: uint32(u.Details.CachedTokens), WorkerId: workerA, BlockSize: 16},
			{SessionId: "review-01", Tail: chainOther[len(chainOther)-1], Blocks: uint32(len(chainOther)), PromptTokens: uint32(uOther.PromptTokens),
				CachedTokens: uint32(uOther.Details.CachedTokens), WorkerId: workerB, BlockSize: 16},
		})
		if err != nil {
			t.Fatalf("record sessions: %v", err)
		}
		var sess ctlview.SessionList
		// Reads are served by any node from its applied state: wait until
		// the node that answers has applied the record.
		testkit.Eventually(t, 10*time.Second, "the sessions on the node read", func() (bool, string) {
			e.ctlJSON(t, &sess, "sessions")
			return sess.Total == 2 && len(sess.Sessions) == 2, ""
		})
		for _, s := range sess.Sessions {
			if s.ID == "chat-7f3a" && (s.Worker != workerA || int(s.CachedTokens) != u.Details.CachedTokens || int(s.PromptTokens) != u.PromptTokens || s.Blocks != uint32(len(chain2))) {
				t.Errorf("session chat-7f3a: %+v, engine usage %+v", s, u)
			}
		}
		out = e.ctlOK(t, "sessions", "--worker", workerA)
		checkRow(t, out, "chat-7f3a", workerA, fmt.Sprintf("%d/%d", u.Details.CachedTokens, u.PromptTokens))
		if strings.Contains(out, "review-01") {
			t.Errorf("sessions --worker %s lists review-01:\n%s", workerA, out)
		}
		out = e.ctlOK(t, "sessions", "--prefix", "review")
		checkRow(t, out, "review-01", workerB, fmt.Sprintf("%d/%d", uOther.Details.CachedTokens, uOther.PromptTokens))
		if strings.Contains(out, "chat-7f3a") {
			t.Errorf("sessions --prefix review lists chat-7f3a:\n%s", out)
		}
	})
	if t.Failed() {
		return
	}
	testkit.Eventually(t, 10*time.Second, "turn 2's blocks on "+workerA, func() (bool, string) {
		var m ctlview.Match
		e.ctlJSON(t, &m, "match", "--messages", writeJSON(t, map[string]any{"model": testModel, "messages": turn2}))
		return len(m.Workers) > 0 && m.Workers[0].Worker == workerA && m.Workers[0].MatchedBlocks == uint32(len(chain2)), ""
	})

	t.Run("explain", func(t *testing.T) {
		// The real router scores the turn-2 prompt: A holds all of it, B
		// turn 1's blocks; both are idle, so A wins on prefill.
		file2 := writeJSON(t, map[string]any{"model": testModel, "messages": turn2})
		var x router.Explanation
		// Without the token the router refuses, and kvdirctl says what to pass.
		if out, errOut, code := ctl(t, "--directory", e.addrs, "explain", "--router", e.router, "--messages", file2); code != exitError ||
			!strings.Contains(errOut, "403") || !strings.Contains(errOut, "--explain-token") {
			t.Fatalf("explain without the token: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		e.ctlJSON(t, &x, "explain", "--router", e.router, "--explain-token", explainToken, "--messages", file2, "--session", "chat-7f3a")
		if x.Model != testModel || x.SessionID != "chat-7f3a" || x.Policy != "kvdir" || x.PromptTokens != len(ids2) ||
			x.BlockSize != 16 || x.ChainBlocks != len(chain2) || x.Fallback != "" || x.Pick != workerA || len(x.Workers) != 2 {
			t.Fatalf("explanation %+v", x)
		}
		for _, w := range x.Workers {
			want := 16 * len(chain1)
			if w.Worker == workerA {
				want = min(16*len(chain2), len(ids2)-1)
			}
			if w.MatchedTokens != want || w.TotalMs <= 0 || w.ColdPrefillMs < w.PrefillMs {
				t.Errorf("%s: %+v, want %d matched tokens", w.Worker, w, want)
			}
		}
		out := e.ctlOK(t, "explain", "--router", e.router, "--explain-token", explainToken, "--messages", file2, "--session", "chat-7f3a")
		if !strings.Contains(out, fmt.Sprintf("model %s, session chat-7f3a, policy kvdir: %d prompt tokens", testModel, len(ids2))) ||
			!strings.HasSuffix(strings.Split(out, "\n")[3+indexOfWorker(x, workerA)], "pick") {
			t.Errorf("explain table:\n%s", out)
		}
	})

	t.Run("who-holds", func(t *testing.T) {
		var v ctlview.WhoHolds
		e.ctlJSON(t, &v, "who-holds", "chat-7f3a")
		if len(v.Holders) != 2 || v.Holders[0].Worker != workerA || v.Holders[0].Blocks != uint32(len(chain2)) || v.Holders[0].Percent != 100 {
			t.Fatalf("holders %+v, want %s with all %d blocks first", v.Holders, workerA, len(chain2))
		}
		b := v.Holders[1]
		if b.Worker != workerB || b.Blocks != uint32(len(chain1)) || b.Tokens != uint64(16*len(chain1)) {
			t.Fatalf("holder %+v, want %s with turn 1's %d blocks", b, workerB, len(chain1))
		}
		if v.Pick != workerA || len(v.Placement) != 2 || !v.Placement[0].Pick || !v.Placement[0].Current ||
			v.Placement[1].Worker != workerB || v.Placement[1].VsPickMs <= 0 || v.Placement[1].TTFTMs <= v.Placement[0].TTFTMs {
			t.Fatalf("placement: pick %s, %+v", v.Pick, v.Placement)
		}
		// The engine agrees with the directory about what B holds: turn 2 on
		// B hits exactly B's share of the chain.
		u := chat(t, simB, turn2)
		if want := min(int(b.Blocks), (u.PromptTokens-1)/16) * 16; u.Details.CachedTokens != want {
			t.Fatalf("turn 2 on %s: cached %d, who-holds says %d blocks (%d tokens)", workerB, u.Details.CachedTokens, b.Blocks, want)
		}
		out := e.ctlOK(t, "who-holds", "chat-7f3a")
		checkRow(t, out, workerA, "ACTIVE", fmt.Sprint(len(chain2)), fmt.Sprint(16*len(chain2)), "100.0%")
		for _, want := range []string{
			fmt.Sprintf("session chat-7f3a: latest turn on %s, %d prompt tokens", workerA, len(ids2)),
			"pick, current",
			fmt.Sprintf("pick: %s, where the session is. Moving it costs +", workerA),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("who-holds table lacks %q:\n%s", want, out)
			}
		}
		var pv ctlview.WhoHoldsList
		e.ctlJSON(t, &pv, "who-holds", "--prefix", "review")
		if len(pv.Sessions) != 1 || pv.Sessions[0].Session.ID != "review-01" || len(pv.Sessions[0].Holders) != 1 || pv.Sessions[0].Holders[0].Worker != workerB {
			t.Errorf("who-holds --prefix review: %+v", pv.Sessions)
		}
		_, errOut, code := ctl(t, "--directory", e.addrs, "who-holds", "no-such-session")
		if code != exitError || !strings.Contains(errOut, `session "no-such-session" is not recorded`) || !strings.Contains(errOut, "kvdirctl sessions") {
			t.Errorf("unknown session: exit %d, %q", code, errOut)
		}
	})

	t.Run("workers", func(t *testing.T) {
		// The load in the directory is what the engines' /metrics say, once
		// the agents' heartbeats have carried it over.
		var want map[string][2]uint64
		testkit.Eventually(t, 15*time.Second, "the engines' prefix-cache counters in the directory", func() (bool, string) {
			want = map[string][2]uint64{}
			for id, sim := range e.sims {
				want[id] = [2]uint64{uint64(engineMetric(t, sim, "vllm:prefix_cache_queries_total")), uint64(engineMetric(t, sim, "vllm:prefix_cache_hits_total"))}
			}
			e.ctlJSON(t, &workers, "workers")
			m := byID()
			for id, w := range want {
				if m[id].PrefixQueries != w[0] || m[id].PrefixHits != w[1] {
					return false, ""
				}
			}
			return true, ""
		})
		m := byID()
		for id, sim := range e.sims {
			w := m[id]
			// The agents are not told a block size (0): the directory learns
			// the engine's 16 from its events.
			if w.Address != sim || w.Model != testModel || w.BlockSize != 0 || fmt.Sprint(w.BlockSizes) != "[16]" || w.Epoch != 1 || w.Blocks == 0 || w.HeartbeatAge == nil ||
				float64(w.Running) != engineMetric(t, sim, "vllm:num_requests_running") || float64(w.Waiting) != engineMetric(t, sim, "vllm:num_requests_waiting") {
				t.Errorf("%s: %+v", id, w)
			}
		}
		out := e.ctlOK(t, "workers")
		for id, sim := range e.sims {
			w := want[id]
			checkRow(t, out, id, sim, testModel, "ACTIVE", "1", fmt.Sprint(m[id].Blocks), "0.0%", "0", "0",
				fmt.Sprintf("%.1f%%", 100*float64(w[1])/float64(w[0])))
		}
		// get: the longest chain is turn 2's, ending where chat-7f3a ends.
		var g ctlview.WorkerDetail
		e.ctlJSON(t, &g, "workers", "get", workerA, "--top", "3")
		tail := fmt.Sprintf("%016x", chain2[len(chain2)-1])
		if g.Worker.ID != workerA || len(g.Chains) == 0 || g.Chains[0].Tail != tail || g.Chains[0].Blocks != uint32(len(chain2)) ||
			g.Chains[0].Tokens != uint64(16*len(chain2)) || fmt.Sprint(g.Chains[0].Sessions) != "[chat-7f3a]" {
			t.Errorf("workers get %s: %+v", workerA, g)
		}
		out = e.ctlOK(t, "workers", "get", workerA)
		if !strings.Contains(out, fmt.Sprintf("%d of %d prompt tokens hit", want[workerA][1], want[workerA][0])) {
			t.Errorf("workers get table lacks the prefix-cache counters:\n%s", out)
		}
		checkRow(t, out, "1", tail, fmt.Sprint(len(chain2)), fmt.Sprint(16*len(chain2)), "chat-7f3a")
		if y := e.ctlOK(t, "workers", "-o", "yaml"); !strings.Contains(y, "id: "+workerA) || !strings.Contains(y, "state: ACTIVE") {
			t.Errorf("yaml:\n%s", y)
		}
	})

	t.Run("status", func(t *testing.T) {
		leader, err := e.cluster.WaitLeader(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var st ctlview.Status
		testkit.Eventually(t, 10*time.Second, "comparable digests", func() (bool, string) {
			e.ctlJSON(t, &st, "status")
			return st.Digests.Comparable, ""
		})
		if st.Leader != e.cluster.Nodes[leader].ID || st.LeaderAddress != e.cluster.Nodes[leader].API || len(st.Nodes) != 3 ||
			!st.Digests.Agree || st.Digests.Nodes != 3 || st.Counters == nil || st.Counters.Sessions != 2 {
			t.Fatalf("status %+v", st)
		}
		for i, n := range st.Nodes {
			if n.APIAddress != e.cluster.Nodes[i].API || n.Error != "" || n.Lag < 0 || n.Lag > 10 || n.AppliedIndex == 0 || n.Digest != st.Nodes[0].Digest {
				t.Errorf("node %+v", n)
			}
		}
		out := e.ctlOK(t, "status")
		for _, want := range []string{"Leader", "Follower", "digests:  agree: 3 node(s) at applied index",
			fmt.Sprintf("leader:   %s (%s)", st.Leader, st.LeaderAddress)} {
			if !strings.Contains(out, want) {
				t.Errorf("status table lacks %q:\n%s", want, out)
			}
		}
		var mem ctlview.MemberList
		e.ctlJSON(t, &mem, "members", "list")
		leaders := 0
		for i, m := range mem.Members {
			if m.APIAddress != e.cluster.Nodes[i].API || m.RaftAddress != e.cluster.Nodes[i].RaftAddr || !m.Voter {
				t.Errorf("member %+v", m)
			}
			if m.Leader {
				leaders++
			}
		}
		if len(mem.Members) != 3 || leaders != 1 {
			t.Errorf("members %+v", mem.Members)
		}
		var snaps ctlview.SnapshotList
		e.ctlJSON(t, &snaps, "snapshot")
		if len(snaps.Snapshots) != 3 {
			t.Fatalf("snapshot: %+v", snaps)
		}
		for _, s := range snaps.Snapshots {
			if s.Error != "" || s.Index == 0 {
				t.Errorf("snapshot %+v", s)
			}
		}
	})

	t.Run("watch", func(t *testing.T) {
		cmd := exec.Command(testkit.Binary(t, "kvdirctl"), "--directory", e.addrs, "status", "--watch", "--interval", "100ms", "-o", "json")
		cmd.Env = cleanEnv()
		var out, errb testkit.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		testkit.Eventually(t, 10*time.Second, "two refreshes", func() (bool, string) { return strings.Count(out.String(), `"digests"`) >= 2, "" })
		// SIGTERM ends the watch as cancelling its context does.
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatal("the watch did not stop within 10s of SIGTERM")
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("watch: exit %d, %s", code, errb.String())
		}
		dec := json.NewDecoder(strings.NewReader(out.String()))
		for n := 0; ; n++ {
			var st ctlview.Status
			if err := dec.Decode(&st); err != nil {
				if n < 2 {
					t.Fatalf("watch output: document %d: %v", n, err)
				}
				break
			}
		}
	})

	t.Run("failover-and-errors", func(t *testing.T) {
		dead := testkit.FreeAddrs(t, 2)
		d1, d2 := dead[0], dead[1]
		out, errOut, code := ctl(t, "--directory", d1+","+e.addrs, "workers")
		if code != 0 || !strings.Contains(out, workerA) || !strings.Contains(out, workerB) {
			t.Fatalf("first address down: exit %d\n%s\n%s", code, out, errOut)
		}
		start := time.Now()
		out, errOut, code = ctl(t, "--directory", d1+","+d2, "--timeout", "1s", "sessions")
		if code != exitError || out != "" {
			t.Fatalf("unreachable cluster: exit %d, stdout %q", code, out)
		}
		for _, want := range []string{"no directory node answered within --timeout 1s", d1 + ": Unavailable", d2 + ": Unavailable", "--directory"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("unreachable cluster: stderr lacks %q:\n%s", want, errOut)
			}
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("unreachable cluster took %v with --timeout 1s", took)
		}
		_, errOut, code = ctl(t, "--directory", e.addrs, "workers", "get", "no-such-worker")
		if code != exitError || !strings.Contains(errOut, `worker "no-such-worker" is not known`) {
			t.Errorf("unknown worker: exit %d, %q", code, errOut)
		}
		_, errOut, code = ctl(t, "--directory", e.addrs, "match", "--chat", "hi", "--model")
		if code != exitUsage {
			t.Errorf("match --model without value: exit %d, %q", code, errOut)
		}
	})

	t.Run("drain-expire", func(t *testing.T) {
		if out := e.ctlOK(t, "drain", workerB); !strings.Contains(out, "drained "+workerB+" (raft index") {
			t.Errorf("drain: %q", out)
		}
		testkit.Eventually(t, 10*time.Second, workerB+" DRAINING on the node read", func() (bool, string) {
			e.ctlJSON(t, &workers, "workers")
			return byID()[workerB].State == "DRAINING", ""
		})
		// A draining worker keeps its blocks but is no candidate.
		var v ctlview.WhoHolds
		e.ctlJSON(t, &v, "who-holds", "chat-7f3a")
		if len(v.Holders) != 2 || v.Holders[1].State != "DRAINING" || len(v.Placement) != 1 || v.Placement[0].Worker != workerA {
			t.Errorf("after drain: holders %+v placement %+v", v.Holders, v.Placement)
		}
		if out := e.ctlOK(t, "expire", workerB); !strings.Contains(out, "expired "+workerB) {
			t.Errorf("expire: %q", out)
		}
		// Its agent registers it again in a new epoch and rebuilds its
		// view from the engine's replay, without new traffic.
		testkit.Eventually(t, 10*time.Second, workerB+" registered again", func() (bool, string) {
			e.ctlJSON(t, &workers, "workers", "--all")
			w := byID()[workerB]
			return w.Epoch >= 2 && w.State == "ACTIVE", ""
		})
		testkit.Eventually(t, 10*time.Second, workerB+"'s blocks rebuilt", func() (bool, string) {
			e.ctlJSON(t, &v, "who-holds", "chat-7f3a")
			return len(v.Holders) == 2, fmt.Sprintf("holders %+v", v.Holders)
		})
	})

	t.Run("leader-transfer-and-dead-node", func(t *testing.T) {
		var st ctlview.Status
		e.ctlJSON(t, &st, "status")
		target := ""
		for _, n := range st.Nodes {
			if n.State == "Follower" {
				target = n.ID
				break
			}
		}
		if out := e.ctlOK(t, "leader", "transfer", target); !strings.Contains(out, "leadership transferred "+target) {
			t.Fatalf("leader transfer: %q", out)
		}
		testkit.Eventually(t, 10*time.Second, "the new leader in status", func() (bool, string) {
			e.ctlJSON(t, &st, "status")
			return st.Leader == target, ""
		})
		// Kill the first node listed in --directory (a follower or the
		// leader): reads fail over, status names it unreachable.
		first := e.cluster.Nodes[0]
		first.Kill9()
		out := e.ctlOK(t, "sessions")
		if !strings.Contains(out, "chat-7f3a") {
			t.Errorf("sessions with %s down:\n%s", first.ID, out)
		}
		testkit.Eventually(t, 15*time.Second, "a leader among the two left", func() (bool, string) {
			e.ctlJSON(t, &st, "status")
			return st.Leader != "" && st.Leader != first.ID && st.Digests.Comparable, ""
		})
		if st.Nodes[0].State != "unreachable" || st.Nodes[0].Error == "" || !st.Digests.Agree || st.Digests.Nodes != 2 {
			t.Errorf("status with %s killed: %+v", first.ID, st)
		}
		if out := e.ctlOK(t, "status"); !strings.Contains(out, "warning:  "+first.ID+" is unreachable") {
			t.Errorf("status table with %s killed:\n%s", first.ID, out)
		}
	})
}
