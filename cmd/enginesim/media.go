package main

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
)

// mediaFlags are the switches for media beyond the GPU cache and for
// TensorRT-LLM's ZMQ events (internal/simengine: offload.go,
// trtllm_wire.go).
type mediaFlags struct {
	offloadMedium string
	offloadBlocks int
	remoteEvery   int
	mmEvery       int
}

// declareMediaFlags declares the flags of m in the KV events group.
func declareMediaFlags(fs *pflag.FlagSet, m *mediaFlags) {
	fs.StringVar(&m.offloadMedium, "kv-offload-medium", "", "keep blocks evicted from the GPU cache on an offload tier of this `MEDIUM`, announced with BlockStored/BlockRemoved on it: CPU, Disk, STORAGE, FS, OBJ (vllm dialect) or CPU_PINNED, CPU_TIER1, CPU_TIER2, DISK, EXTERNAL (sglang); a prefix found there counts as cached (free: no load time is modelled); empty: no tier")
	fs.IntVar(&m.offloadBlocks, "kv-offload-blocks", 32768, "with --kv-offload-medium: the tier's capacity in `blocks`; when full it drops its least recently used block")
	fs.IntVar(&m.remoteEvery, "trtllm-remote-every", 0, "trtllm dialect: announce the blocks of every `N`th request with locality REMOTE (a pool shared with other workers); 0: none")
	fs.IntVar(&m.mmEvery, "trtllm-mm-tokens", 0, "trtllm dialect: every `N`th request is multimodal: the first token of its second block is announced as a string placeholder \"<mm:HASH>\" with the block's mm_keys; 0: none")
}

// checkMedia refuses media settings the other flags rule out.
func (c *config) checkMedia() error {
	m := c.media
	if c.kvEventsPull && (m.offloadMedium != "" || m.remoteEvery != 0 || m.mmEvery != 0) {
		return errors.New("--kv-events-pull: --kv-offload-medium, --trtllm-remote-every and --trtllm-mm-tokens are not emulated in TensorRT-LLM's JSON events (use --kv-events-dialect trtllm over ZMQ)")
	}
	return nil
}

// offloadConfig returns the engine's tier settings.
func (m mediaFlags) offloadConfig() (medium string, blocks int) {
	if m.offloadMedium == "" {
		return "", 0
	}
	return m.offloadMedium, m.offloadBlocks
}

// publishTRTLLM publishes b in TensorRT-LLM's ZMQ encoding, its
// data_parallel_rank the configured rank (its publisher fills it in).
func (s *server) publishTRTLLM(b kvevents.Batch) error {
	rank := s.cfg.dpRank
	b.DPRank = &rank
	payload, err := simengine.EncodeTRTLLMBatch(b)
	if err != nil {
		return fmt.Errorf("encode trtllm batch: %w", err)
	}
	_, err = s.pub.PublishPayload(payload)
	return err
}
