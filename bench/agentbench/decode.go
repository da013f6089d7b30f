package agentbench

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/kvdir/kvdir/internal/agent"
	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

const benchModel = "llama3-8b"

func newEngine(sink simengine.EventSink) (*simengine.Engine, error) {
	prof, err := costmodel.ProfileByName(benchModel)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	e, err := simengine.New(simengine.Config{Profile: prof, CapacityBlocks: 32768}, sink)
	if err != nil {
		return nil, fmt.Errorf("new engine: %w", err)
	}
	return e, nil
}

// wireBatch is an engine batch as a vLLM KVEventBatch, stamped with its
// engine time.
func wireBatch(b simengine.EventBatch) kvevents.Batch {
	return kvevents.Batch{TS: b.Time.Seconds(), Events: b.Events}
}

// corpus runs the engine model on a virtual clock over n requests and
// returns its event batches, msgpack-encoded as vLLM sends them.
func corpus(n int) ([][]byte, int, error) {
	var payloads [][]byte
	blocks := 0
	sink := simengine.SinkFunc(func(b simengine.EventBatch) {
		wb := wireBatch(b)
		for _, ev := range wb.Events {
			if s, ok := ev.(*kvevents.BlockStored); ok {
				blocks += len(s.BlockHashes)
			}
		}
		payloads = append(payloads, kvevents.EncodeBatch(wb, kvevents.FormArray))
	})
	e, err := newEngine(sink)
	if err != nil {
		return nil, 0, err
	}
	p := simengine.NewBenchPrompts()
	now, submitted, finished := time.Duration(0), 0, 0
	for finished < n {
		for submitted < n && submitted-finished < 256 {
			if err := e.Submit(now, simengine.Request{ID: strconv.Itoa(submitted), Tokens: p.Prompt(submitted),
				MaxTokens: 32, Namespace: benchModel}); err != nil {
				return nil, 0, fmt.Errorf("submit: %w", err)
			}
			submitted++
		}
		r := e.Step(now)
		now = r.End
		finished += len(r.Finished)
	}
	return payloads, blocks, nil
}

// benchDecode times DecodeBatch + Translator.Translate (content hashing and
// the engine-hash map) over the corpus, on one goroutine.
func benchDecode(log *slog.Logger, d time.Duration, res *Measures) error {
	payloads, blocks, err := corpus(4000)
	if err != nil {
		return fmt.Errorf("corpus: %w", err)
	}
	size := 0
	for _, p := range payloads {
		size += len(p)
	}
	res.DecodeBatches, res.DecodeBlocks, res.DecodeCorpusBytes = len(payloads), blocks, size
	res.DecodeMethod = "internal/simengine run (4,000 requests: 1,024-token shared system prompt, 256 tokens per 8-request conversation, 64 unique, 32 generated; block size 16) " +
		"encoded with kvevents.EncodeBatch (array form); timed: kvevents.DecodeBatch + agent.Translator.Translate (xxh3 content hash, engine-hash LRU map), one goroutine, whole corpus repeated"
	tr := agent.NewTranslator(benchModel, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var dst []*kvdirv1.Event
	pass := func() (int, error) {
		n := 0
		for _, p := range payloads {
			b, _, err := kvevents.DecodeBatch(p)
			if err != nil {
				return n, fmt.Errorf("decode: %w", err)
			}
			var k int
			dst, k = tr.Translate(dst[:0], b)
			_ = k
			for _, ev := range b.Events {
				if s, ok := ev.(*kvevents.BlockStored); ok {
					n += len(s.BlockHashes)
				}
			}
		}
		return n, nil
	}
	if _, err := pass(); err != nil { // warm up: fill the map
		return err
	}
	start := time.Now()
	total := 0
	for time.Since(start) < d {
		n, err := pass()
		if err != nil {
			return err
		}
		total += n
	}
	el := time.Since(start)
	res.DecodeHashBlocksPerSec = float64(total) / el.Seconds()
	st := tr.Stats()
	if len(st.Problems) > 0 {
		log.Warn("translator problems", "problems", st.Problems)
	}
	log.Info("decode+hash+map", "blocks_per_sec", int64(res.DecodeHashBlocksPerSec), "batches", len(payloads),
		"stored_blocks_per_pass", blocks, "bytes", size, "map_entries", st.MapEntries)
	return nil
}

// benchEngine runs the engine model on a virtual clock (time scale 0) and
// reports requests per second of wall time: the scheduler's own overhead.
func benchEngine(log *slog.Logger, n int, res *Measures) error {
	e, err := newEngine(nil)
	if err != nil {
		return err
	}
	p := simengine.NewBenchPrompts()
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = append([]uint32(nil), p.Prompt(i)...)
	}
	start := time.Now()
	now, submitted, finished := time.Duration(0), 0, 0
	for finished < n {
		for submitted < n && submitted-finished < 512 {
			if err := e.Submit(now, simengine.Request{ID: strconv.Itoa(submitted), Tokens: prompts[submitted],
				MaxTokens: 32, Namespace: benchModel}); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			submitted++
		}
		r := e.Step(now)
		now = r.End
		finished += len(r.Finished)
	}
	el := time.Since(start)
	res.EngineRequests = n
	res.EngineRequestsPerSec = float64(n) / el.Seconds()
	res.EngineModelledRPS = float64(n) / now.Seconds()
	res.EngineMethod = "internal/simengine (llama3-8b profile, 32,768 blocks) driven directly on a virtual clock (time scale 0, no HTTP, no events sink), " +
		"up to 512 requests in flight, 1,344-token prompts (1,280 shareable) and 32 generated tokens; prompts built before timing; wall-clock requests per second"
	log.Info("engine model at time scale 0", "requests", n, "req_per_sec", int64(res.EngineRequestsPerSec),
		"modelled_req_per_sec", int64(res.EngineModelledRPS))
	return nil
}
