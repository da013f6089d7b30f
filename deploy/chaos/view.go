package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"sync"
	"time"
)

// Served is a request an engine ran: its worker, its prompt, when the
// worker was known to have it (At) and when it completed (Done, zero if it
// did not complete).
type Served struct {
	Worker string
	Prompt []uint32
	At     time.Time
	Done   time.Time
}

// Model is what the test knows of each engine's prefix cache: every prompt
// each engine ran since its last restart. The engines' caches are far larger
// than the test's load (the harness starts them with 524,288 blocks of 16
// tokens each, KVDIR_KV_BLOCKS), so nothing is
// evicted: an engine holds every full block of every prompt it ran since it
// started, and the blocks of a prompt p it holds are the leading blocks p
// shares with one of those prompts.
type Model struct {
	BlockSize int

	mu       sync.Mutex
	restarts map[string]time.Time // worker -> its engine's last restart
	direct   []Served             // requests the test sent to engines itself
}

// NewModel returns an empty Model.
func NewModel(blockSize int) *Model {
	return &Model{BlockSize: blockSize, restarts: map[string]time.Time{}}
}

// Restarted records that the worker's engine restarted (empty cache) at t.
func (m *Model) Restarted(worker string, t time.Time) {
	m.mu.Lock()
	m.restarts[worker] = t
	m.mu.Unlock()
}

// AddDirect records a request the test sent straight to an engine.
func (m *Model) AddDirect(s Served) {
	m.mu.Lock()
	m.direct = append(m.direct, s)
	m.mu.Unlock()
}

// FromRecords turns the balancer's records into served requests.
func FromRecords(recs []Record) []Served {
	var out []Served
	for _, r := range recs {
		if r.Worker == "" || len(r.Prompt) == 0 || r.Header.IsZero() {
			continue
		}
		s := Served{Worker: r.Worker, Prompt: r.Prompt, At: r.Header}
		if !r.End.IsZero() && !r.Failed() {
			s.Done = r.End
		}
		out = append(out, s)
	}
	return out
}

// Expectation is the range of blocks of a prompt a worker may hold: at
// least Min (from the requests that completed on it), at most Max (from
// every request it started, some of which may have stopped part-way).
type Expectation struct{ Min, Max int }

// Expect returns, for each worker, how many leading blocks of p its engine
// holds according to the requests in served plus the direct ones: Min
// counts requests completed by asOf, Max every request.
func (m *Model) Expect(p []uint32, served []Served, asOf time.Time) map[string]Expectation {
	return m.index(served).expect(p, asOf)
}

// expectIndex is the requests a Model knows of, by their first block: only
// a request sharing a prompt's first block can hold any block of it.
type expectIndex struct {
	bs      int
	byFirst map[uint64][]Served
}

// firstBlock keys a prompt's first block (ok false if it has none).
func firstBlock(p []uint32, bs int) (uint64, bool) {
	if len(p) < bs {
		return 0, false
	}
	h := fnv.New64a()
	for _, t := range p[:bs] {
		_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64(), true
}

// index indexes served and the direct requests, leaving out those an
// engine's restart has since dropped.
func (m *Model) index(served []Served) *expectIndex {
	m.mu.Lock()
	all := append(append([]Served(nil), served...), m.direct...)
	restarts := make(map[string]time.Time, len(m.restarts))
	for k, v := range m.restarts {
		restarts[k] = v
	}
	m.mu.Unlock()
	ix := &expectIndex{bs: m.BlockSize, byFirst: map[uint64][]Served{}}
	for _, s := range all {
		if s.At.Before(restarts[s.Worker]) {
			continue // run by the engine's previous incarnation
		}
		if k, ok := firstBlock(s.Prompt, m.BlockSize); ok {
			ix.byFirst[k] = append(ix.byFirst[k], s)
		}
	}
	return ix
}

func (ix *expectIndex) expect(p []uint32, asOf time.Time) map[string]Expectation {
	out := map[string]Expectation{}
	k, ok := firstBlock(p, ix.bs)
	if !ok {
		return out
	}
	for _, s := range ix.byFirst[k] {
		n := commonBlocks(p, s.Prompt, ix.bs)
		e := out[s.Worker]
		e.Max = max(e.Max, n)
		if !s.Done.IsZero() && !s.Done.After(asOf) {
			e.Min = max(e.Min, n)
		}
		out[s.Worker] = e
	}
	return out
}

// commonBlocks is the number of leading full blocks of bs tokens a and b
// share.
func commonBlocks(a, b []uint32, bs int) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return i / bs
}

// Mismatch is a worker whose directory view of a prompt is outside what its
// engine holds.
type Mismatch struct {
	Prompt int // index in the probe list
	Worker string
	Got    int // blocks the directory says it holds
	Want   Expectation
}

func (x Mismatch) String() string {
	if x.Want.Min == x.Want.Max {
		return fmt.Sprintf("prompt %d on %s: directory %d blocks, engine %d", x.Prompt, x.Worker, x.Got, x.Want.Min)
	}
	return fmt.Sprintf("prompt %d on %s: directory %d blocks, engine %d..%d", x.Prompt, x.Worker, x.Got, x.Want.Min, x.Want.Max)
}

// CompareView asks the directory node for every probe prompt's matches
// (sixteen at a time) and compares them, for each of workers, with the
// model's expectation.
func (m *Model) CompareView(ctx context.Context, dir *Directory, node, model string, probes [][]uint32, served []Served, asOf time.Time, workers []string) ([]Mismatch, error) {
	got := make([]map[string]int, len(probes))
	errs := make([]error, len(probes))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			got[i], errs[i] = dir.Match(ctx, node, model, m.BlockSize, p)
		}()
	}
	wg.Wait()
	var out []Mismatch
	ix := m.index(served)
	for i, p := range probes {
		if errs[i] != nil {
			return nil, fmt.Errorf("match probe %d: %w", i, errs[i])
		}
		want := ix.expect(p, asOf)
		for _, w := range workers {
			if g, e := got[i][w], want[w]; g < e.Min || g > e.Max {
				out = append(out, Mismatch{Prompt: i, Worker: w, Got: g, Want: e})
			}
		}
		for w, g := range got[i] {
			if g > 0 && !contains(workers, w) {
				out = append(out, Mismatch{Prompt: i, Worker: w, Got: g})
			}
		}
	}
	return out, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Probes returns the distinct prompts of served, in order.
func Probes(served []Served) [][]uint32 {
	seen := map[uint64]bool{}
	var out [][]uint32
	for _, s := range served {
		h := fnv.New64a()
		for _, t := range s.Prompt {
			_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
		}
		k := h.Sum64()
		if !seen[k] {
			seen[k] = true
			out = append(out, s.Prompt)
		}
	}
	return out
}

// AskEngine sends prompt to an engine directly (one output token) and
// returns how many of its tokens the engine served from its prefix cache,
// by the engine's own account (usage.prompt_tokens_details.cached_tokens).
func AskEngine(ctx context.Context, hc *http.Client, engineURL, model string, prompt []uint32) (int, error) {
	body, err := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, engineURL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("engine %s: %w", engineURL, err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("engine %s: %s", engineURL, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("engine %s: decoding the answer: %w", engineURL, err)
	}
	return out.Usage.Details.Cached, nil
}

// EngineCachedTokens is what an engine reports as cached for a prompt of n
// tokens of which it holds the first held blocks: vLLM (and enginesim)
// always compute the prompt's last token, so at most (n-1)/bs blocks count.
func EngineCachedTokens(held, n, bs int) int {
	return min(held, (n-1)/bs) * bs
}
