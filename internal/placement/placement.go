// Package placement chooses the worker for a request.
//
// The router asks the directory how many leading blocks of the request's
// prefix each worker holds, adds its view of each worker's load, and hands
// the resulting [Candidate] list to a [Policy]. Policies are selected by
// name through [New]: "round-robin", "random", "least-load", "session-hash"
// (bounded-load consistent hashing, HAProxy's hash-balance-factor), "prefix"
// (longest match) and "kvdir" (lowest expected time to first token, see
// [KVDir]; "kvdir-displace" adds its displacement term), plus baselines of peers' published policies: "llm-d" and
// "llm-d-sticky" ([LLMD]), "sglang" ([SGLang]) and "dynamo" ([Dynamo]).
//
// kvdir prices prefills and decode interference with an engine timing model
// ([costmodel.Profile]); the package depends on no engine simulator.
//
// Every policy is safe for concurrent use and, given the same seed and the
// same sequence of calls, makes the same decisions.
package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// Load is a worker's load as the router sees it.
type Load struct {
	Running             int     // sequences the engine is running (vllm:num_requests_running)
	Waiting             int     // requests queued in the engine (vllm:num_requests_waiting)
	KVUsage             float64 // KV-cache usage, 0..1 (vllm:kv_cache_usage_perc)
	QueuedPrefillTokens int     // uncached prompt tokens routed here and not yet started (router accounting)
	InFlight            int     // requests this router sent and has not seen finish
	// Busy is the fraction of the recent past during which a request routed
	// here was waiting for its first token (router accounting, [BusyMeter]).
	Busy float64
	// CapacityTokens is the worker's KV cache size in tokens (vLLM's
	// cache_config_info: num_gpu_blocks × block_size); 0 when not known.
	CapacityTokens int
}

// Candidate is one worker that may take the request.
//
// MatchedBlocks counts the leading blocks held on any medium. HostBlocks and
// DiskBlocks say how many of them are not in GPU memory and must be loaded
// before the prefill, as an engine with a KV offloading tier does (vLLM's
// offloading connector copies them back to the GPU, then computes the
// rest): the first [Candidate.GPUBlocks] are on the GPU, the next
// HostBlocks in host memory, the last DiskBlocks on disk or further away.
// Both zero, every matched block counts as on the GPU. Only kvdir prices
// the split; the other policies use MatchedBlocks alone.
type Candidate struct {
	Worker        string // worker identity, unique within a call
	MatchedBlocks int    // leading blocks of the request's chain it holds (from the directory)
	HostBlocks    int    // of MatchedBlocks, blocks after the GPU-held run that load from host memory
	DiskBlocks    int    // of MatchedBlocks, the blocks after those that load from disk (or slower)
	Load          Load
}

// GPUBlocks returns the leading matched blocks already in GPU memory.
func (c *Candidate) GPUBlocks() int { return c.MatchedBlocks - c.HostBlocks - c.DiskBlocks }

// TierSplit splits a directory match into the candidate's tiers: matched
// leading blocks on any medium, of which the leading gpu are on the GPU and
// the leading fast on the GPU or in host memory (radix.WorkerMatch's
// GPUOrCPU; from per-medium runs alone, max(gpu, cpu) is a lower bound).
// Blocks after the GPU run and within fast load from host memory; the
// rest, up to matched, from disk or a remote store, which we price at the
// disk link (the slowest the profile knows).
func TierSplit(matched, gpu, fast int) (host, disk int) {
	gpu = min(max(gpu, 0), max(matched, 0))
	host = min(max(fast-gpu, 0), matched-gpu)
	return host, max(matched-gpu-host, 0)
}

// Request is what a policy knows about the request being placed.
type Request struct {
	SessionKey   string   // stable session identity; may be empty
	PromptTokens int      // prompt length in tokens
	BlockSize    int      // tokens per KV block
	ChainPrefix  []uint64 // first block hashes of the prompt, for hashing without a session key
}

// Score is one candidate's cost breakdown under the kvdir model (the
// "explain" view). Times are modelled milliseconds.
type Score struct {
	Worker         string
	MatchedTokens  int     // min(MatchedBlocks·BlockSize, PromptTokens−1)
	Retain         float64 // probability the matched blocks survive until the request runs
	CachedTokens   float64 // expected cached tokens: MatchedTokens·Retain, less the tier tokens it is cheaper to recompute
	LoadedTokens   float64 // of CachedTokens, those loaded from host memory or disk first
	TransferMs     float64 // the load's time, before the prefill (in TotalMs, not in PrefillMs)
	QueueMs        float64 // prefill of the work already queued on the worker
	KVWaitMs       float64 // wait for running requests to free the KV blocks the queued work and ours need
	InterferenceMs float64 // running decodes riding along with the queued and new prefill
	WaitMs         float64 // max(QueueMs, KVWaitMs) + InterferenceMs
	PrefillMs      float64 // our prefill with the expected cache
	ColdPrefillMs  float64 // our prefill with no cache
	ExtraMs        float64 // delay our recomputation (prefill beyond the best candidate's) imposes on the requests waiting there
	FutureMs       float64 // expected queueing of the session's later requests, which follow their prefix here
	DisplaceMs     float64 // recomputation of the other sessions' cache content this placement pushes out
	TotalMs        float64 // cost: expected time to first token (WaitMs + TransferMs + PrefillMs) plus ExtraMs, FutureMs and DisplaceMs
}

// Decision is a policy's choice.
type Decision struct {
	Worker                string  // chosen worker
	Index                 int     // its index in the candidate slice
	PredictedCachedTokens int     // prompt tokens expected from its cache (kvdir: discounted by Retain)
	Scores                []Score // per-candidate breakdown in candidate order (kvdir only)
}

// Policy places requests on workers.
type Policy interface {
	// Name returns the policy's registry name.
	Name() string
	// Pick chooses one of cands for req. It fails when cands is empty or
	// the request is malformed.
	Pick(req Request, cands []Candidate) (Decision, error)
}

// ScorePicker is a Policy that can write its per-candidate breakdown
// into a buffer of the caller's (KVDir), so that a caller placing
// requests one after another over many candidates (the router) reuses one
// buffer instead of allocating one per request. PickInto is Pick with
// Decision.Scores written into scores when it has the capacity (else
// allocated); the caller must not reuse scores while it still reads that
// Decision's Scores.
type ScorePicker interface {
	Policy
	PickInto(req Request, cands []Candidate, scores []Score) (Decision, error)
}

// Options configure a policy. Zero values select the defaults.
type Options struct {
	// Seed seeds the random choices (random policy and tie breaks).
	Seed int64
	// Profile is the timing model for kvdir (default
	// costmodel.DefaultProfileName).
	Profile costmodel.Profile
	// LiveProfile, if set, overrides Profile: kvdir reads its current
	// profile at every Pick and Score (a costmodel.Calibrator, fitted online
	// to the engines' measured prefills).
	LiveProfile ProfileSource
	// HashBalanceFactor is session-hash's bound in percent of the average
	// in-flight load (default 150; at least 100; negative disables the bound).
	HashBalanceFactor int
	// VirtualNodes is the number of ring points per worker for session-hash
	// (default 512).
	VirtualNodes int
	// TieTolerance is kvdir's relative tie band (default 0.01: costs within
	// 1 % of the best are ties, broken at random).
	TieTolerance float64
	// ChunkTokens is the engine's prefill chunk (token budget per step) used
	// by kvdir's decode-interference term (default 2048).
	ChunkTokens int
	// DecodeContext is the assumed context length of each running sequence
	// for the decode-interference term (default DefaultDecodeContext).
	DecodeContext int
	// Displace adds kvdir's displacement term (policy "kvdir-displace"):
	// a placement pays for the other sessions' cache content it pushes out
	// (see KVDir).
	Displace bool
}

// DefaultDecodeContext is kvdir's default assumed context length of each
// running sequence, in tokens (Options.DecodeContext).
const DefaultDecodeContext = 4096

// ProfileSource is a timing model that changes as it learns, such as a
// costmodel.Calibrator. Profile must be cheap, safe for concurrent use and
// always return a valid profile.
type ProfileSource interface {
	Profile() costmodel.Profile
}

// ErrNoCandidates is returned by Pick when there is no candidate.
var ErrNoCandidates = errors.New("placement: no candidate workers")

// ErrUnknownPolicy is returned by New for a name that is not registered.
var ErrUnknownPolicy = errors.New("placement: unknown policy")

var policyNames = []string{"round-robin", "random", "least-load", "session-hash", "prefix", "kvdir", "kvdir-displace", "llm-d", "llm-d-sticky", "sglang", "dynamo"}

// Names returns the registered policy names.
func Names() []string { return append([]string(nil), policyNames...) }

// New returns the policy registered under name.
func New(name string, opts Options) (Policy, error) {
	switch name {
	case "round-robin":
		return &roundRobin{}, nil
	case "random":
		return &randomPolicy{rng: newRand(opts.Seed)}, nil
	case "least-load":
		return &leastLoad{rng: newRand(opts.Seed)}, nil
	case "prefix":
		return &prefixPolicy{rng: newRand(opts.Seed)}, nil
	case "session-hash":
		return NewSessionHash(opts)
	case "kvdir":
		return NewKVDir(opts)
	case "kvdir-displace":
		opts.Displace = true
		return NewKVDir(opts)
	case "llm-d":
		return NewLLMD(opts, false), nil
	case "llm-d-sticky":
		return NewLLMD(opts, true), nil
	case "sglang":
		return NewSGLang(opts), nil
	case "dynamo":
		return NewDynamo(opts), nil
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownPolicy, name, strings.Join(policyNames, ", "))
}

// newRand returns a deterministic generator for seed.
func newRand(seed int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
}

// validate checks the inputs every policy shares.
func validate(req Request, cands []Candidate) error {
	if len(cands) == 0 {
		return ErrNoCandidates
	}
	if req.PromptTokens < 0 || req.BlockSize < 0 {
		return fmt.Errorf("placement: invalid request: prompt %d tokens, block size %d", req.PromptTokens, req.BlockSize)
	}
	for i := range cands {
		c := &cands[i]
		if c.MatchedBlocks < 0 || c.HostBlocks < 0 || c.DiskBlocks < 0 || c.GPUBlocks() < 0 {
			return fmt.Errorf("placement: candidate %q: matched blocks %d (host %d, disk %d): negative, or fewer than the tiers' sum",
				c.Worker, c.MatchedBlocks, c.HostBlocks, c.DiskBlocks)
		}
	}
	return nil
}

// matchedTokens returns the prompt tokens c can serve from cache: its matched
// blocks, capped one short of the prompt (an engine always computes at least
// the last token).
func matchedTokens(req Request, c *Candidate) int {
	m := c.MatchedBlocks * req.BlockSize
	if lim := req.PromptTokens - 1; m > lim {
		m = lim
	}
	return max(m, 0)
}

// decide builds a Decision for cands[i] without a cost breakdown.
func decide(req Request, cands []Candidate, i int) Decision {
	return Decision{Worker: cands[i].Worker, Index: i, PredictedCachedTokens: matchedTokens(req, &cands[i])}
}
