package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// metricsTRTLLM is the --metrics-format of trtllm-serve's JSON stats.
const metricsTRTLLM = "trtllm"

// trtBlockSize is TensorRT-LLM's default tokens_per_block, the block size
// with --kv-events-pull unless --block-size is given.
const trtBlockSize = 32

// trtPriority is the retention priority TensorRT-LLM gives blocks by
// default (KvCacheRetentionConfig's default priority).
const trtPriority = 35

// trtEvents is the event queue of trtllm-serve's POST /kv_cache_events:
// events numbered by event_id, consecutive from 0 (a "created" event), in
// the JSON shape of KVCacheEventSerializer (tensorrt_llm/_utils.py),
// drained on every read. The queue is bounded (TensorRT-LLM's
// event_buffer_max_size): when full, the oldest events are dropped, so a
// poller sees a gap in event_id.
type trtEvents struct {
	mu      sync.Mutex
	max     int
	window  int
	blocks  int
	next    uint64
	queue   []json.RawMessage
	dropped uint64
}

func newTRTEvents(max, window, blocks int) *trtEvents {
	q := &trtEvents{max: max, window: window, blocks: blocks}
	q.restart()
	return q
}

// restart empties the queue and numbers from 0 again with a created event,
// as a new engine's KV cache manager does.
func (q *trtEvents) restart() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue, q.next = nil, 0
	q.appendLocked(q.created())
}

func (q *trtEvents) created() map[string]any {
	return map[string]any{"type": "created", "num_blocks_per_cache_level": []int{q.blocks, 0}}
}

// push queues the events of one engine batch. AllBlocksCleared (a
// /reset_prefix_cache, which trtllm-serve does not have) is sent as a
// created event: the cache is new and empty.
func (q *trtEvents) push(evs []kvevents.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ev := range evs {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			q.appendLocked(trtStored(e))
		case *kvevents.BlockRemoved:
			hs := make([]uint64, len(e.BlockHashes))
			for i, h := range e.BlockHashes {
				hs[i] = h.Key()
			}
			q.appendLocked(map[string]any{"type": "removed", "block_hashes": hs})
		case *kvevents.AllBlocksCleared:
			q.appendLocked(q.created())
		}
	}
}

// trtStored writes a store as KVCacheEventSerializer does: one
// stored_block per block with its tokens as unique_token objects (and,
// for a LoRA request, its lora_id).
func trtStored(e *kvevents.BlockStored) map[string]any {
	var parent any
	if e.Parent != nil {
		parent = e.Parent.Key()
	}
	blocks := make([]map[string]any, 0, len(e.BlockHashes))
	for i, h := range e.BlockHashes {
		toks := make([]map[string]any, 0, e.BlockSize)
		for _, t := range e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize] {
			toks = append(toks, map[string]any{"type": "unique_token", "token_id": t, "token_extra_id": 0})
		}
		b := map[string]any{"type": "stored_block", "block_hash": h.Key(), "tokens": toks,
			"cache_level": 0, "priority": trtPriority}
		if e.LoRAID != nil {
			// Upstream's serializer leaves lora_id out (a TODO in
			// tensorrt_llm/_utils.py); it is written here so that an
			// adapter's blocks do not pass for the base model's.
			b["lora_id"] = *e.LoRAID
		}
		blocks = append(blocks, b)
	}
	return map[string]any{"type": "stored", "parent_hash": parent, "blocks": blocks}
}

func (q *trtEvents) appendLocked(data map[string]any) {
	ev, err := json.Marshal(map[string]any{"event_id": q.next, "data": data, "window_size": q.window})
	if err != nil {
		return // cannot happen: maps of numbers, strings and slices
	}
	q.next++
	q.queue = append(q.queue, ev)
	if over := len(q.queue) - q.max; over > 0 {
		q.queue = append(q.queue[:0], q.queue[over:]...)
		q.dropped += uint64(over)
	}
}

// drain returns the queued events as a JSON array and empties the queue.
func (q *trtEvents) drain() []byte {
	q.mu.Lock()
	evs := q.queue
	q.queue = nil
	q.mu.Unlock()
	if len(evs) == 0 {
		return []byte("[]")
	}
	out, err := json.Marshal(evs)
	if err != nil {
		return []byte("[]")
	}
	return out
}

// handleKVCacheEvents serves POST /kv_cache_events.
func (s *server) handleKVCacheEvents(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.trt.drain())
}

// trtStats is the drain state of trtllm-serve's GET /metrics.
type trtStats struct {
	mu        sync.Mutex
	lastSteps int64
	lastRun   *instance
}

// handleTRTMetrics serves GET /metrics as trtllm-serve does: a JSON array
// of the iteration stats gathered since the last read (here at most one
// entry, the engine's state now, and none when no step ran since), each
// shaped as the executor's IterationStats.
func (s *server) handleTRTMetrics(w http.ResponseWriter, _ *http.Request) {
	in := s.current()
	st := in.runner.Stats()
	s.trtStats.mu.Lock()
	fresh := in != s.trtStats.lastRun || st.Steps > s.trtStats.lastSteps
	s.trtStats.lastRun, s.trtStats.lastSteps = in, st.Steps
	s.trtStats.mu.Unlock()
	out := []map[string]any{}
	if fresh {
		bs := int64(s.cfg.blockSize)
		reused := st.PrefixHits / bs
		missed := max(st.PrefixQueries-st.PrefixHits, 0) / bs
		hitRate := 0.0
		if reused+missed > 0 {
			hitRate = float64(reused) / float64(reused+missed)
		}
		out = append(out, map[string]any{
			"timestamp":            time.Now().UTC().Format("01-02-2006 15:04:05"),
			"iter":                 st.Steps,
			"numActiveRequests":    st.Running,
			"numQueuedRequests":    st.Waiting,
			"numCompletedRequests": st.Finished,
			"maxNumActiveRequests": s.cfg.maxRunning,
			"kvCacheStats": map[string]any{
				"maxNumBlocks": st.CapacityBlocks, "freeNumBlocks": st.CapacityBlocks - st.UsedBlocks,
				"usedNumBlocks": st.UsedBlocks, "tokensPerBlock": s.cfg.blockSize,
				"allocTotalBlocks": st.UsedBlocks, "allocNewBlocks": 0,
				"reusedBlocks": reused, "missedBlocks": missed, "cacheHitRate": hitRate,
			},
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// checkPull checks --kv-events-pull's settings: TensorRT-LLM's JSON events
// have no KV-cache groups and no other engine's encoding.
func (c *config) checkPull() error {
	if !c.kvEventsPull {
		return nil
	}
	if c.trtQueueSize < 1 {
		return fmt.Errorf("--kv-events-queue-size %d, want >= 1", c.trtQueueSize)
	}
	if c.dpSize > 1 {
		return fmt.Errorf("--kv-events-pull with --data-parallel-size %d: the pull endpoint serves one engine", c.dpSize)
	}
	if c.kvCacheGroups != "" || c.eventsDialect != "vllm" || c.speculativeBigrams {
		return errors.New("--kv-events-pull writes TensorRT-LLM's JSON events: --kv-cache-groups, --kv-events-dialect and --speculative-bigrams do not apply")
	}
	return nil
}
