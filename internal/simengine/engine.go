package simengine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// Scheduler defaults (vLLM V1's).
const (
	DefaultMaxBatchedTokens = 8192
	DefaultMaxRunning       = 256
)

// VocabSize is the size of the vocabulary output tokens are drawn from
// (Llama 3's).
const VocabSize = 128256

// Finish reasons of a [Result].
const (
	FinishLength = "length" // MaxTokens tokens were generated
	FinishAbort  = "abort"  // the request was aborted
)

// Errors returned by [Engine.Submit] and [New].
var (
	ErrInvalidConfig  = errors.New("engine: invalid config")
	ErrInvalidRequest = errors.New("engine: invalid request")
	ErrDuplicateID    = errors.New("engine: request ID already in flight")
	ErrTooLong        = errors.New("engine: request does not fit in the KV cache")
)

// Config configures an Engine. Zero values take the defaults.
type Config struct {
	Profile          costmodel.Profile // timing model; required
	BlockSize        int               // tokens per KV block; default 16
	CapacityBlocks   int               // KV-cache blocks; required
	MaxBatchedTokens int               // token budget per step (max_num_batched_tokens); default 8192
	MaxRunning       int               // most running requests (max_num_seqs); default 256
	Seed             uint64            // seeds the block-hash roots and the generated tokens
	Shape            Shape             // how the events present the cache (see Shape); zero: plain vLLM
	// OffloadMedium, if set, keeps blocks evicted from the GPU cache on
	// an offload tier of OffloadBlocks blocks announced on that medium
	// (see offload.go), e.g. "CPU" (vLLM) or "CPU_TIER1" (SGLang).
	OffloadMedium string
	OffloadBlocks int
}

func (c Config) withDefaults() (Config, error) {
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = DefaultMaxRunning
	}
	switch {
	case c.BlockSize < 1 || c.BlockSize > MaxBlockSize:
		return c, fmt.Errorf("%w: BlockSize %d not in [1, %d]", ErrInvalidConfig, c.BlockSize, MaxBlockSize)
	case c.CapacityBlocks < 1:
		return c, fmt.Errorf("%w: CapacityBlocks %d, want > 0", ErrInvalidConfig, c.CapacityBlocks)
	case c.CapacityBlocks > MaxCacheTokens/c.BlockSize:
		return c, fmt.Errorf("%w: CapacityBlocks %d × BlockSize %d exceeds %d tokens", ErrInvalidConfig, c.CapacityBlocks, c.BlockSize, MaxCacheTokens)
	case c.MaxBatchedTokens < 1:
		return c, fmt.Errorf("%w: MaxBatchedTokens %d, want > 0", ErrInvalidConfig, c.MaxBatchedTokens)
	case c.MaxRunning < 1:
		return c, fmt.Errorf("%w: MaxRunning %d, want > 0", ErrInvalidConfig, c.MaxRunning)
	}
	if err := c.Profile.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := c.Shape.Validate(); err != nil {
		return c, err
	}
	if err := c.CheckOffload(); err != nil {
		return c, err
	}
	return c, nil
}

// Request is a generation request.
type Request struct {
	ID        string   // unique among requests in flight
	Tokens    []uint32 // prompt token ids; copied by Submit
	MaxTokens int      // tokens to generate (no EOS: exactly this many)
	Namespace string   // model, cache_salt, …: blocks are shared only within a namespace
	LoRAName  string   // LoRA adapter; part of the namespace, reported in BlockStored
	CacheSalt string   // the request's cache_salt, reported in the events (Namespace must include it)
	// LoRAID is the adapter's integer id (vLLM's lora_int_id, from 1),
	// reported as BlockStored's lora_id; 0 reports None. It is not part of
	// the namespace: vLLM hashes by the adapter's name.
	LoRAID int64
}

// Result is a finished request.
type Result struct {
	ID           string
	PromptTokens int
	CachedTokens int      // prompt tokens served from the prefix cache when first scheduled
	Output       []uint32 // generated token ids
	Arrival      time.Duration
	FirstToken   time.Duration // end of the step that completed the prefill; 0 if none
	Finish       time.Duration
	Preemptions  int
	FinishReason string // FinishLength or FinishAbort
}

// TTFT returns the time to first token, or 0 if no token was generated.
func (r Result) TTFT() time.Duration {
	if len(r.Output) == 0 {
		return 0
	}
	return r.FirstToken - r.Arrival
}

// Token is one generated token.
type Token struct {
	RequestID string
	Index     int    // position in the output, from 0
	ID        uint32 // token id
}

// StepResult describes one engine step.
type StepResult struct {
	Start, End    time.Duration
	Idle          bool // nothing to run: End == Start
	Scheduled     int  // requests in the batch
	PrefillTokens int  // tokens computed in prefill chunks
	DecodeTokens  int  // decode tokens (one per decoding request)
	Preempted     int  // requests preempted by this step
	Tokens        []Token
	Finished      []Result
}

// Stats is a snapshot of the engine's gauges and counters.
type Stats struct {
	Now             time.Duration // end of the last step
	Running         int
	Waiting         int
	KVUsage         float64 // fraction of blocks referenced
	UsedBlocks      int
	CapacityBlocks  int
	PrefixQueries   int64 // tokens looked up, at every admission (vLLM prefix_cache_queries)
	PrefixHits      int64 // tokens found (vLLM prefix_cache_hits)
	Preemptions     int64
	Steps           int64
	Finished        int64
	GeneratedTokens int64
}

// seq is a request in the engine.
type seq struct {
	id          string
	tokens      []uint32 // prompt then output
	promptLen   int
	maxTokens   int
	root        BlockHash
	lora        string
	loraID      int64
	salt        string
	swNext      []int       // per group: the first block a windowed group still holds (see slideWindows)
	mambaLast   int         // 1 + the block whose Mamba state this run stored last; 0 none (see mambaStore)
	hashes      []BlockHash // hashes of the full blocks of tokens computed so far
	blocks      []int32     // KV blocks for positions [0, len(blocks)·B)
	numComputed int         // tokens whose KV is computed (or scheduled)
	numStored   int         // leading blocks that are in the cache index
	rng         uint64
	arrival     time.Duration
	firstToken  time.Duration
	cached      int // prompt tokens hit when first scheduled; -1 before
	preemptions int
	meta        *reqMeta // with media: what its blocks carry into later events
	// readyAt, if set, is when the load of blocks [loadFirst, loadLast)
	// from the offload tier ends; the request is not scheduled before.
	readyAt             time.Duration
	loadFirst, loadLast int
}

func (s *seq) outputs() int { return len(s.tokens) - s.promptLen }

// scheduled is one request's share of a step.
type scheduled struct {
	s *seq
	n int
}

// Engine is a simulated vLLM V1 engine. It is not safe for concurrent use.
type Engine struct {
	cfg   Config
	cache *Cache
	sink  EventSink
	media *media // offload tier and block owners; nil without either (offload.go)
	subs  int64  // requests submitted

	waiting     []*seq // FCFS; waiting[head:] are queued
	head        int
	running     []*seq
	inFlight    map[string]*seq
	now         time.Duration
	batch       []scheduled
	hitBuf      []int32
	mambaHeld   map[BlockHash]int32 // Mamba state blocks stored and not yet removed
	link        time.Duration       // when the offload tier's link is free (offload.go)
	steps       int64
	preemptions int64
	finished    int64
	generated   int64
}

// New returns an engine. sink may be nil.
func New(cfg Config, sink EventSink) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:       cfg,
		cache:     newCache(cfg.CapacityBlocks, cfg.BlockSize),
		sink:      sink,
		inFlight:  make(map[string]*seq),
		mambaHeld: make(map[BlockHash]int32),
	}
	if cfg.OffloadMedium != "" || cfg.Shape.RemoteEvery > 0 || cfg.Shape.MMEvery > 0 {
		e.media = newMedia(e)
		e.cache.media = e.media
	}
	return e, nil
}

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Cache returns the engine's KV cache, for inspection.
func (e *Engine) Cache() *Cache { return e.cache }

// Now returns the end time of the last step.
func (e *Engine) Now() time.Duration { return e.now }

// Busy reports whether requests are running or waiting.
func (e *Engine) Busy() bool { return len(e.running) > 0 || len(e.waiting) > e.head }

// Submit queues a request that arrived at now.
func (e *Engine) Submit(now time.Duration, r Request) error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: empty ID", ErrInvalidRequest)
	case len(r.Tokens) == 0:
		return fmt.Errorf("%w %q: empty prompt", ErrInvalidRequest, r.ID)
	case r.MaxTokens < 1:
		return fmt.Errorf("%w %q: MaxTokens %d, want >= 1", ErrInvalidRequest, r.ID, r.MaxTokens)
	}
	if _, ok := e.inFlight[r.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateID, r.ID)
	}
	// The last generated token is never fed back, so its KV is never needed.
	capTokens := e.cfg.CapacityBlocks * e.cfg.BlockSize
	if r.MaxTokens-1 > capTokens-len(r.Tokens) {
		return fmt.Errorf("%w: request %q needs %d prompt + %d generated tokens of KV, capacity %d",
			ErrTooLong, r.ID, len(r.Tokens), r.MaxTokens-1, capTokens)
	}
	tokens := make([]uint32, len(r.Tokens), len(r.Tokens)+min(r.MaxTokens, 1<<16))
	copy(tokens, r.Tokens)
	s := &seq{
		id: r.ID, tokens: tokens, promptLen: len(r.Tokens), maxTokens: r.MaxTokens,
		root: namespaceRoot(e.cfg.Seed, r.Namespace, r.LoRAName), lora: r.LoRAName, loraID: r.LoRAID, salt: r.CacheSalt, swNext: e.newWindows(),
		hashes:  make([]BlockHash, 0, min(len(tokens)+r.MaxTokens, 1<<20)/e.cfg.BlockSize),
		arrival: now, cached: -1,
	}
	e.subs++
	s.meta = e.requestMeta(r)
	e.inFlight[r.ID] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// Step runs one engine iteration starting at now (or at the end of the
// previous step, if later): it schedules decodes for the running requests and
// prefill chunks within the token budget, preempting the most recently
// admitted requests if the cache runs out, advances the clock by the
// profile's step duration, samples one token for every request whose tokens
// are all computed, and retires the requests that reached MaxTokens. The
// step's cache events go to the sink as one batch stamped with its end.
// With nothing to run it returns an idle result at now.
func (e *Engine) Step(now time.Duration) StepResult {
	now = max(now, e.now)
	res := StepResult{Start: now, End: now}
	if !e.Busy() {
		res.Idle = true
		return res
	}
	e.batch = e.batch[:0]
	budget := e.cfg.MaxBatchedTokens
	cost := costmodel.NewStepCost(&e.cfg.Profile)

	// Running requests first, in admission order.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		if s.readyAt > now {
			continue // loading from the offload tier
		}
		if s.readyAt > 0 {
			e.finishLoad(s)
		}
		n := min(len(s.tokens)-s.numComputed, budget)
		ok := true
		for !e.fits(s, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			res.Preempted++
			if victim == s {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		e.schedule(s, n, &cost, &res)
		budget -= n
	}

	// Then waiting requests, FCFS, unless this step had to preempt.
	for res.Preempted == 0 && budget > 0 && len(e.running) < e.cfg.MaxRunning && len(e.waiting) > e.head {
		s := e.waiting[e.head]
		if !e.admit(s, budget, now) {
			break
		}
		e.waiting[e.head] = nil
		e.head++
		e.running = append(e.running, s)
		if s.readyAt > now {
			continue // its prefix loads first
		}
		n := min(len(s.tokens)-s.numComputed, budget)
		e.schedule(s, n, &cost, &res)
		budget -= n
	}
	e.compactWaiting()

	if len(e.batch) == 0 {
		// Only loads from the offload tier to wait for: the step waits for
		// the first to end. Otherwise unreachable: the first running
		// request, or the head of the queue on an idle engine, always
		// fits. Never spin.
		if t := e.nextReady(); t > now {
			res.End, e.now = t, t
			e.publish(t)
			return res
		}
		res.Idle = true
		return res
	}
	end := now + costmodel.MillisToDuration(cost.Millis())
	res.End = end
	e.now = end
	e.steps++

	// Sample and retire.
	finishedAny := false
	for _, b := range e.batch {
		s := b.s
		if s.numComputed < len(s.tokens) {
			continue // partial prefill
		}
		if s.outputs() == 0 {
			s.rng = e.outputSeed(s)
		}
		tok := uint32(splitmix64(&s.rng) % VocabSize)
		s.tokens = append(s.tokens, tok)
		idx := s.outputs() - 1
		if idx == 0 {
			s.firstToken = end
		}
		e.generated++
		res.Tokens = append(res.Tokens, Token{RequestID: s.id, Index: idx, ID: tok})
		if s.outputs() >= s.maxTokens {
			e.cache.release(s.blocks)
			s.blocks = nil
			delete(e.inFlight, s.id)
			e.finished++
			res.Finished = append(res.Finished, s.result(end, FinishLength))
			s.maxTokens = -1 // mark for removal from running
			finishedAny = true
		}
	}
	if finishedAny {
		e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.maxTokens < 0 })
	}
	e.publish(end)
	return res
}

// fits allocates what request s needs to compute n more tokens, if the cache
// has room, and caches its newly full blocks.
func (e *Engine) fits(s *seq, n int) bool {
	bs := e.cfg.BlockSize
	need := (s.numComputed+n+bs-1)/bs - len(s.blocks)
	if need > e.cache.NumFree() {
		return false
	}
	if need > 0 {
		s.blocks = e.cache.allocate(s.blocks, need)
	}
	return true
}

// admit looks up the prefix cache for waiting request s and allocates its
// first chunk; it reports false, changing nothing, if the cache is too full.
// A prefix it finds on the offload tier starts loading at now.
func (e *Engine) admit(s *seq, budget int, now time.Duration) bool {
	bs := e.cfg.BlockSize
	maxHit := (len(s.tokens) - 1) / bs // at least one token must be computed
	e.ensureHashes(s, maxHit)
	hits := e.cache.lookup(e.hitBuf[:0], s.hashes[:maxHit])
	e.hitBuf = hits
	loaded := 0 // blocks after hits that the offload tier holds
	if e.media != nil {
		loaded = e.media.tierHits(s.hashes[len(hits):maxHit])
		if loaded > 0 && !e.worthLoading(s, len(hits), loaded) {
			loaded = 0
		}
	}
	hitTokens := (len(hits) + loaded) * bs
	n := min(len(s.tokens)-hitTokens, budget)
	need := (hitTokens+n+bs-1)/bs - len(hits)
	if need+e.cache.evictableAmong(hits) > e.cache.NumFree() {
		return false
	}
	e.cache.touch(hits)
	s.blocks = append(s.blocks[:0], hits...)
	s.numComputed, s.numStored, s.mambaLast = hitTokens, len(hits), 0
	e.resetWindows(s)
	e.cache.events = e.appendReused(e.cache.events, s, len(hits))
	e.cache.queries += int64(len(s.tokens))
	e.cache.hits += int64(hitTokens)
	if s.cached < 0 {
		s.cached = min(hitTokens, s.promptLen)
	}
	if need > 0 {
		s.blocks = e.cache.allocate(s.blocks, need)
	}
	if loaded > 0 {
		e.startLoad(s, len(hits), len(hits)+loaded, now)
	}
	return true
}

// schedule adds n tokens of s to the step: it accounts their cost, advances
// s.numComputed and caches the blocks that become full (vLLM caches them when
// it schedules them, so later requests in the same step can hit them).
func (e *Engine) schedule(s *seq, n int, cost *costmodel.StepCost, res *StepResult) {
	before := s.numComputed
	if n == 1 && s.outputs() > 0 && before == len(s.tokens)-1 {
		cost.AddDecode(before + 1)
		res.DecodeTokens++
	} else {
		cost.AddChunk(n, before)
		res.PrefillTokens += n
	}
	res.Scheduled++
	s.numComputed += n
	e.batch = append(e.batch, scheduled{s: s, n: n})

	bs := e.cfg.BlockSize
	if full := e.storable(s); full > s.numStored {
		e.ensureHashes(s, full)
		first := s.numStored
		for i := first; i < full; i++ {
			var parent BlockHash
			if i > 0 {
				parent = s.hashes[i-1]
			}
			e.cache.store(s.blocks[i], s.hashes[i], parent, i > 0, s.tokens[i*bs:(i+1)*bs])
		}
		s.numStored = full
		if e.media != nil {
			e.media.noteStored(s, first, full)
		}
		e.cache.events = e.appendStored(e.cache.events, s, first, full)
	}
	e.cache.events = e.slideWindows(e.cache.events, s)
}

// outputSeed seeds the token generator of s from its namespace and prompt,
// so that identical prompts generate identical outputs, as greedy decoding
// would. The prompt's full blocks are hashed already.
func (e *Engine) outputSeed(s *seq) uint64 {
	full := s.promptLen / e.cfg.BlockSize
	e.ensureHashes(s, full)
	parent := s.root
	if full > 0 {
		parent = s.hashes[full-1]
	}
	return uint64(hashBlock(parent, s.tokens[full*e.cfg.BlockSize:s.promptLen])) ^ e.cfg.Seed
}

// ensureHashes computes the hashes of the first n full blocks of s.
func (e *Engine) ensureHashes(s *seq, n int) {
	bs := e.cfg.BlockSize
	for i := len(s.hashes); i < n; i++ {
		parent := s.root
		if i > 0 {
			parent = s.hashes[i-1]
		}
		s.hashes = append(s.hashes, hashBlock(parent, s.tokens[i*bs:(i+1)*bs]))
	}
}

// preempt frees the blocks of s (recompute preemption) and puts it at the
// front of the waiting queue; it keeps its generated tokens.
func (e *Engine) preempt(s *seq) {
	e.cache.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.numComputed, s.numStored, s.mambaLast = 0, 0, 0
	s.readyAt = 0
	e.resetWindows(s)
	s.preemptions++
	e.preemptions++
	if e.head > 0 {
		e.head--
		e.waiting[e.head] = s
		return
	}
	e.waiting = slices.Insert(e.waiting, 0, s)
}

// compactWaiting reclaims the consumed front of the waiting queue.
func (e *Engine) compactWaiting() {
	if e.head > 0 && e.head >= len(e.waiting)/2 {
		n := copy(e.waiting, e.waiting[e.head:])
		clear(e.waiting[n:])
		e.waiting = e.waiting[:n]
		e.head = 0
	}
}

func (e *Engine) publish(at time.Duration) {
	ev := e.groupRemovals(e.cache.takeEvents())
	if len(ev) > 0 && e.sink != nil {
		e.sink.Publish(EventBatch{Time: at, Events: ev})
	}
}

func (s *seq) result(at time.Duration, reason string) Result {
	r := Result{
		ID:           s.id,
		PromptTokens: s.promptLen,
		CachedTokens: max(s.cached, 0),
		Output:       s.tokens[s.promptLen:len(s.tokens):len(s.tokens)],
		Arrival:      s.arrival,
		Finish:       at,
		Preemptions:  s.preemptions,
		FinishReason: reason,
	}
	if s.outputs() > 0 {
		r.FirstToken = s.firstToken
	}
	return r
}

// Abort removes a running or waiting request, freeing its blocks (they stay
// cached). It reports false if no such request is in flight.
func (e *Engine) Abort(now time.Duration, id string) (Result, bool) {
	s, ok := e.inFlight[id]
	if !ok {
		return Result{}, false
	}
	delete(e.inFlight, id)
	if i := slices.Index(e.running, s); i >= 0 {
		e.running = slices.Delete(e.running, i, i+1)
		e.cache.release(s.blocks)
		s.blocks = nil
	} else if i := slices.Index(e.waiting[e.head:], s); i >= 0 {
		e.waiting = slices.Delete(e.waiting, e.head+i, e.head+i+1)
	}
	return s.result(max(now, e.now), FinishAbort), true
}

// Reset clears the prefix cache, as vLLM's reset_prefix_cache: every cached
// block is forgotten and AllBlocksCleared is published at now. It fails with
// ErrCacheBusy while requests are running (waiting requests hold no blocks
// and stay queued).
func (e *Engine) Reset(now time.Duration) error {
	if err := e.cache.reset(); err != nil {
		return err
	}
	clear(e.mambaHeld)
	e.publish(max(now, e.now))
	return nil
}

// Stats returns the engine's gauges and counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Now:             e.now,
		Running:         len(e.running),
		Waiting:         len(e.waiting) - e.head,
		KVUsage:         e.cache.Usage(),
		UsedBlocks:      e.cache.Capacity() - e.cache.NumFree(),
		CapacityBlocks:  e.cache.Capacity(),
		PrefixQueries:   e.cache.queries,
		PrefixHits:      e.cache.hits,
		Preemptions:     e.preemptions,
		Steps:           e.steps,
		Finished:        e.finished,
		GeneratedTokens: e.generated,
	}
}
