package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const workerID = "enginesim-0"

func benchE2E(ctx context.Context, log *slog.Logger, cfg Options, dir string, res *Measures) (err error) {
	bins, err := testkit.Build(dir, "directory", "enginesim", "agent")
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	simBin, agentBin := bins["enginesim"], bins["agent"]
	c, err := fleet.StartDirectory(bins["directory"], dir, 3, "--log-level", "warn")
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	var procs []*testkit.Proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].Terminate(10 * time.Second)
			if err != nil {
				fmt.Fprintf(os.Stderr, "---- %s\n%s\n", procs[i].Name, procs[i].Tail(30))
			}
		}
		c.Stop()
		if err != nil {
			fmt.Fprint(os.Stderr, c.Logs(20))
		}
	}()
	leader, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	follower := c.Nodes[(leader+1)%3]
	log.Info("cluster up", "leader", c.Nodes[leader].ID, "follower", follower.ID)

	ports, err := testkit.LoopbackPorts(4)
	if err != nil {
		return fmt.Errorf("free ports: %w", err)
	}
	simAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	sim, err := fleet.StartProc("enginesim", simBin, "--addr", simAddr, "--model", benchModel,
		"--time-scale", fmt.Sprint(cfg.TimeScale),
		"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", ports[1]),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", ports[2]))
	if err != nil {
		return err
	}
	procs = append(procs, sim)
	if err := waitHTTP("http://"+simAddr+"/health", 30*time.Second); err != nil {
		return fmt.Errorf("enginesim: %w", err)
	}
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.API)
	}
	ag, err := fleet.StartProc("agent", agentBin, "--directory", strings.Join(addrs, ","), "--worker-id", workerID,
		"--worker-address", "http://"+simAddr, "--model", benchModel, "--engine-kind", "enginesim",
		"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", ports[1]),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", ports[2]),
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", ports[3]), "--log-level", "warn")
	if err != nil {
		return err
	}
	procs = append(procs, ag)
	dirc := kvdirv1.NewDirectoryServiceClient(follower.Conn())
	if err := waitWorker(dirc, 30*time.Second); err != nil {
		return err
	}
	log.Info("agent registered", "worker", workerID)

	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	system := "You are a careful assistant for an LLM serving team. Answer briefly, cite the relevant metric, " +
		"and say when a question cannot be answered from the data given. " + words(rand.New(rand.NewPCG(7, 7)), 120)
	client := &http.Client{Timeout: 60 * time.Second}
	simURL := "http://" + simAddr + "/v1/chat/completions"
	// Warm up: the shared system prompt and the connections.
	for i := range 3 {
		if _, _, err := timeRequest(client, dirc, tmpl, simURL, system, fmt.Sprintf("warm-up %d: %s", i, words(rand.New(rand.NewPCG(9, uint64(i))), 20))); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	var (
		mu       sync.Mutex
		lags     []time.Duration
		tokens   int
		timeouts int
		firstErr error
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(i)))
				user := fmt.Sprintf("Question %d. %s", i, words(rng, 150+rng.IntN(300)))
				lag, n, err := timeRequest(client, dirc, tmpl, simURL, system, user)
				mu.Lock()
				switch {
				case errors.Is(err, errNotVisible):
					timeouts++
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				default:
					lags = append(lags, lag)
					tokens += n
				}
				mu.Unlock()
			}
		}()
	}
	for i := range cfg.Requests {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(lags) == 0 {
		return errors.New("no request became visible")
	}
	slices.Sort(lags)
	res.E2ERequests, res.E2EConcurrency, res.E2ETimeScale, res.E2ETimeouts = len(lags), cfg.Concurrency, cfg.TimeScale, timeouts
	res.E2EPromptTokens = float64(tokens) / float64(len(lags))
	res.E2ELagP50ms = pct(lags, 0.50)
	res.E2ELagP99ms = pct(lags, 0.99)
	res.E2ELagMaxms = float64(lags[len(lags)-1]) / 1e6
	res.E2EMethod = fmt.Sprintf("3 cmd/directory processes (dircluster), one cmd/enginesim (--time-scale %g, llama3-8b profile) and one cmd/agent (default 10 ms batch interval) on loopback; "+
		"%d clients send streaming chat requests (shared ~200-token system prompt, unique 150-450-word user message, max_tokens 16); "+
		"t0 = arrival of the first content chunk (the engine publishes the prefill step's events just before it delivers that token); "+
		"then DirectoryService.Match (TokenQuery: locally rendered ChatML/cl100k prompt, namespace model=%s block_size=16) is polled on a follower every 0.5 ms "+
		"until the worker holds every full prompt block; lag = return time of that Match - t0", cfg.TimeScale, cfg.Concurrency, benchModel)
	log.Info("end to end", "requests", len(lags), "p50_ms", res.E2ELagP50ms, "p99_ms", res.E2ELagP99ms, "max_ms", res.E2ELagMaxms, "timeouts", timeouts)
	return nil
}

var errNotVisible = errors.New("prompt blocks not visible in time")

var vocabulary = strings.Fields("cache prefix block token engine worker router latency throughput replica model " +
	"request session batch memory eviction schedule queue directory shard leader follower commit index hash chain " +
	"prompt system user answer question metric gauge counter histogram node cluster region zone tenant budget")

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
		if rng.IntN(10) == 0 {
			fmt.Fprintf(&b, " %d", rng.IntN(100000))
		}
	}
	return b.String()
}

// timeRequest sends one streaming chat request, takes the arrival of its
// first content chunk as the end of the prefill, and polls Match on the
// directory until the prompt's full blocks are held by the worker.
func timeRequest(client *http.Client, dirc kvdirv1.DirectoryServiceClient, tmpl *tokenize.ChatML, url, system, user string) (time.Duration, int, error) {
	msgs := []tokenize.Message{{Role: "system", Content: tokenize.TextContent(system)}, {Role: "user", Content: tokenize.TextContent(user)}}
	toks, err := tmpl.RenderChat(msgs, true)
	if err != nil {
		return 0, 0, fmt.Errorf("render: %w", err)
	}
	want := uint32(len(toks) / 16)
	body, err := json.Marshal(map[string]any{"model": benchModel, "messages": msgs, "max_tokens": 16, "stream": true})
	if err != nil {
		return 0, 0, fmt.Errorf("marshal: %w", err)
	}
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0, fmt.Errorf("chat: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("chat: status %s", resp.Status)
	}
	r := bufio.NewReader(resp.Body)
	var t0 time.Time
	for data := 0; data < 2; {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, 0, fmt.Errorf("read stream: %w", err)
		}
		if strings.HasPrefix(line, "data: ") {
			data++
		}
		t0 = time.Now()
	}
	drained := make(chan struct{})
	go func() { r.WriteTo(discard{}); close(drained) }()
	defer func() { <-drained }()
	q := &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{TokenIds: toks,
		Namespace: &kvdirv1.Namespace{Model: benchModel, BlockSize: 16}}}}
	deadline := t0.Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		m, err := dirc.Match(ctx, q)
		cancel()
		if err != nil {
			return 0, 0, fmt.Errorf("match: %w", err)
		}
		for _, wm := range m.Matches {
			if wm.WorkerId == workerID && wm.Blocks >= want {
				return time.Since(t0), len(toks), nil
			}
		}
		time.Sleep(500 * time.Microsecond)
	}
	return 0, 0, errNotVisible
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func waitHTTP(url string, timeout time.Duration) error {
	c := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := c.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not healthy within %v", url, timeout)
}

func waitWorker(dirc kvdirv1.DirectoryServiceClient, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		lw, err := dirc.ListWorkers(ctx, &kvdirv1.ListWorkersRequest{})
		cancel()
		if err == nil {
			for _, w := range lw.Workers {
				if w.GetSpec().GetId() == workerID {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("worker %s not listed within %v", workerID, timeout)
}

func pct(ds []time.Duration, q float64) float64 {
	i := int(q * float64(len(ds)))
	if i >= len(ds) {
		i = len(ds) - 1
	}
	return float64(ds[i]) / 1e6
}
