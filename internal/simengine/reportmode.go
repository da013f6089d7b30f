package simengine

import (
	"fmt"
	"strconv"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// Report modes and Mamba groups, as vLLM publishes them:
//
//   - kv_cache_report_mode is a per-request setting (read from the
//     request's extra_args in vllm/v1/request.py). With "full",
//     KVCacheManager.get_computed_blocks (vllm/v1/core/kv_cache_manager.py)
//     calls BlockPool.emit_cached_block_events (vllm/v1/core/block_pool.py)
//     for every KV-cache group with hit blocks: one BlockStored per group
//     announcing the whole hit prefix from block 0 (parent None), built by
//     the same _build_block_stored_event as cache_full_blocks' stores, so
//     the events are identical to a first store and marked by no field.
//     Block state is not touched and no removal is ever sent for them.
//   - Mamba groups (kv_cache_spec_kind "mamba", MambaSpec in
//     vllm/v1/kv_cache_interface.py) do publish BlockStored: with Mamba
//     prefix caching ("align" mode, MambaManager in
//     vllm/v1/core/single_type_kv_cache_manager.py) a request keeps only
//     the state block of the last computed position, the others are null
//     blocks, and cache_full_blocks skips null blocks, so a Mamba store
//     names one hash (the last block that became full) while its token_ids
//     cover every block that became full. The previous state block is freed
//     when the next is allocated and its BlockRemoved (with the group's
//     group_idx) follows when the freed block is evicted; the simulator
//     removes it at once, as it does for sliding windows.

// ReportMode is vLLM's kv_cache_report_mode, applied to every request.
type ReportMode uint8

const (
	// ReportIncremental (vLLM's default) announces each block once, when
	// it becomes full.
	ReportIncremental ReportMode = iota
	// ReportFull also re-announces a request's prefix-cache hits when it
	// is admitted: per group, one BlockStored of blocks [0, hits),
	// identical to a first store, with no removal.
	ReportFull
)

// String names the mode as ParseReportMode reads it.
func (m ReportMode) String() string {
	switch m {
	case ReportIncremental:
		return "incremental"
	case ReportFull:
		return "full"
	}
	return "report_mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseReportMode reads "incremental" (or "") or "full".
func ParseReportMode(s string) (ReportMode, error) {
	switch s {
	case "incremental", "":
		return ReportIncremental, nil
	case "full":
		return ReportFull, nil
	}
	return 0, fmt.Errorf("%w: KV-cache report mode %q, want incremental or full", ErrInvalidConfig, s)
}

// checkReportMode validates the report mode of sh.
func (sh Shape) checkReportMode() error {
	switch {
	case sh.ReportMode > ReportFull:
		return fmt.Errorf("%w: unknown KV-cache report mode %d", ErrInvalidConfig, sh.ReportMode)
	case sh.ReportMode == ReportFull && sh.Dialect != DialectVLLM:
		return fmt.Errorf("%w: report mode full is vLLM's kv_cache_report_mode; the %s dialect has none", ErrInvalidConfig, sh.Dialect)
	}
	return nil
}

// mamba reports whether the group is a Mamba group.
func (g KVGroup) mamba() bool { return g.Kind == kvevents.SpecKindMamba }

// appendReused appends, in ReportFull mode, the re-announcement of the
// first hits blocks of s, just hit in the prefix cache: the events of a
// store of blocks [0, hits), every group naming every hit block (the hit
// list of a sparse group is as long as the prefix, null blocks included).
func (e *Engine) appendReused(dst []kvevents.Event, s *seq, hits int) []kvevents.Event {
	if e.cfg.Shape.ReportMode != ReportFull || hits == 0 {
		return dst
	}
	return e.appendStoredAs(dst, s, 0, hits, true)
}

// mambaStore narrows a Mamba group's store of blocks [first, full) of s to
// the one state block vLLM keeps, the last, and appends the removal of the
// state block s stored before it in this run. ev is the group's copy of
// the store.
func (e *Engine) mambaStore(dst []kvevents.Event, ev *kvevents.BlockStored, g int, s *seq, full int) []kvevents.Event {
	ev.BlockHashes = wireHashes(s.hashes[full-1 : full])
	if ev.ExtraKeys != nil {
		ev.ExtraKeys = ev.ExtraKeys[len(ev.ExtraKeys)-1:]
	}
	dst = append(dst, ev)
	if g != e.firstMamba() {
		return dst // one state per block, whatever the number of Mamba groups
	}
	if s.mambaLast > 0 {
		prev := s.hashes[s.mambaLast-1]
		dst = append(dst, e.mambaRemovals(prev)...)
		e.mambaHeld[prev]--
		if e.mambaHeld[prev] <= 0 {
			delete(e.mambaHeld, prev)
		}
	}
	e.mambaHeld[s.hashes[full-1]]++
	s.mambaLast = full
	return dst
}

// mambaRemovals returns the removal of h from every Mamba group.
func (e *Engine) mambaRemovals(h BlockHash) []kvevents.Event {
	var out []kvevents.Event
	for g, grp := range e.cfg.Shape.Groups {
		if grp.mamba() {
			out = append(out, &kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h.Wire()}, Medium: MediumGPU, GroupIdx: ptrInt(g)})
		}
	}
	return out
}

// mambaEvicted appends the Mamba groups' removal of the evicted block rm
// (a prefix-cache eviction, one hash) if a Mamba group still holds it.
func (e *Engine) mambaEvicted(dst []kvevents.Event, rm *kvevents.BlockRemoved) []kvevents.Event {
	if len(e.mambaHeld) == 0 {
		return dst
	}
	for _, wh := range rm.BlockHashes {
		h := BlockHash(wh.Key()) // the engine's hashes are integers
		if e.mambaHeld[h] <= 0 {
			continue
		}
		dst = append(dst, e.mambaRemovals(h)...)
		if e.mambaHeld[h]--; e.mambaHeld[h] <= 0 {
			delete(e.mambaHeld, h)
		}
	}
	return dst
}

// firstMamba returns the index of the first Mamba group, -1 if none.
func (e *Engine) firstMamba() int {
	for g, grp := range e.cfg.Shape.Groups {
		if grp.mamba() {
			return g
		}
	}
	return -1
}
