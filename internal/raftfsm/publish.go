package raftfsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/radix"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// publish applies one event batch if it is the next of its worker's
// current epoch, and says what became of it and whether the worker's layout
// changed (which watchers of the registry are told). cut is how many of its
// blocks the leader cut past the quota before proposing it
// (PublishCommand.quota_cut): counted as dropped if the batch applies.
func (f *FSM) publish(b *kvdirv1.EventBatch, cut uint64, index uint64) (*kvdirv1.PublishResponse, bool) {
	resp := &kvdirv1.PublishResponse{
		WorkerId: b.WorkerId, Epoch: b.Epoch, FirstSeq: b.FirstSeq, LastSeq: b.LastSeq, RaftIndex: index,
	}
	w := f.st.workers[b.WorkerId]
	if w == nil || !alive(w) {
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER
		resp.Message = "worker is not registered; register it again"
		return resp, false
	}
	resp.CurrentEpoch, resp.AppliedSeq = w.Epoch, w.AppliedSeq
	switch {
	case b.Epoch < w.Epoch:
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH
		resp.Message = fmt.Sprintf("epoch %d was fenced by a registration at epoch %d", b.Epoch, w.Epoch)
		return resp, false
	case b.Epoch > w.Epoch:
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED
		resp.Message = fmt.Sprintf("epoch %d was never issued (current %d)", b.Epoch, w.Epoch)
		return resp, false
	case CheckSeqRange(b) != nil:
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED
		resp.Message = CheckSeqRange(b).Error()
		return resp, false
	case b.LastSeq <= w.AppliedSeq:
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE
		return resp, false
	case b.FirstSeq != w.AppliedSeq+1:
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_GAP
		resp.Message = fmt.Sprintf("expected sequence %d, batch starts at %d", w.AppliedSeq+1, b.FirstSeq)
		return resp, false
	}
	if err := f.checkEvents(b); err != nil {
		resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED
		resp.Message = err.Error()
		return resp, false
	}
	var conflicts int
	dropped := cut
	var layoutChanged bool
	x := f.st.index
	for _, ev := range b.Events {
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Stored:
			hashes := k.Stored.Hashes
			if w.BlockQuota > 0 {
				hashes = fitQuota(x, b.WorkerId, w.BlockQuota, hashes)
				dropped += uint64(len(k.Stored.Hashes) - len(hashes))
			}
			err := x.Insert(b.WorkerId, k.Stored.Parent, hashes, medium(k.Stored.Medium))
			if errors.Is(err, radix.ErrParentMismatch) {
				conflicts++ // a hash collision or an engine bug; the rest applies
			}
			f.opts.Metrics.events("stored", len(hashes))
		case *kvdirv1.Event_Removed:
			m := medium(k.Removed.Medium)
			if k.Removed.AllMedia {
				m = radix.AnyMedium
			}
			_ = x.Remove(b.WorkerId, k.Removed.Hashes, m) // validated by checkEvents
			f.opts.Metrics.events("removed", len(k.Removed.Hashes))
		case *kvdirv1.Event_Cleared:
			x.ClearWorker(b.WorkerId)
			f.opts.Metrics.events("cleared", 1)
		case *kvdirv1.Event_Layout:
			if !proto.Equal(w.Layout, k.Layout) {
				w.Layout = proto.Clone(k.Layout).(*kvdirv1.WorkerLayout)
				layoutChanged = true
			}
			f.opts.Metrics.events("layout", 1)
		}
	}
	w.AppliedSeq = b.LastSeq
	resp.AppliedSeq = w.AppliedSeq
	resp.Status = kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED
	if conflicts > 0 {
		resp.Message = fmt.Sprintf("%d stored pieces conflicted with blocks indexed under another parent and were cut short", conflicts)
	}
	if dropped > 0 {
		if w.DroppedBlocks == 0 {
			f.opts.Logger.Warn("worker is over its block quota: blocks past it are not stored",
				"worker", b.WorkerId, "epoch", w.Epoch, "quota", w.BlockQuota)
			// Watchers learn that it went over; not of every later drop,
			// so that a flooding worker does not flood them too.
			layoutChanged = true
		}
		w.DroppedBlocks += dropped
		f.markOverQuota(w)
		f.opts.Metrics.quotaDropped(b.WorkerId, dropped)
		if resp.Message != "" {
			resp.Message += "; "
		}
		resp.Message += fmt.Sprintf("%d blocks past the worker's quota of %d were not stored", dropped, w.BlockQuota)
	}
	return resp, layoutChanged
}

// CheckSeqRange refuses a batch whose sequence range is not 1 <= first_seq
// <= last_seq, or spans more numbers than the batch has events (at least
// one, so that an empty batch may carry one number). Without the bound a
// single batch claiming last_seq 2^64-1 would make every later honest batch
// of the worker a DUPLICATE until it registers again.
func CheckSeqRange(b *kvdirv1.EventBatch) error {
	if b.FirstSeq < 1 || b.LastSeq < b.FirstSeq {
		return fmt.Errorf("bad sequence range %d..%d", b.FirstSeq, b.LastSeq)
	}
	if span, n := b.LastSeq-b.FirstSeq, uint64(max(len(b.Events), 1)); span >= n {
		return fmt.Errorf("sequence range %d..%d spans more numbers than the batch's %d events", b.FirstSeq, b.LastSeq, len(b.Events))
	}
	return nil
}

// CheckBatch refuses a batch the state machine would refuse whatever the
// state: a bad sequence range (CheckSeqRange), too many events or blocks,
// a chain over the limit, an unknown medium, the reserved hash or a bad
// layout. A node checks it before proposing, so that such batches do not
// reach the log.
func (f *FSM) CheckBatch(b *kvdirv1.EventBatch) error {
	if err := CheckSeqRange(b); err != nil {
		return err
	}
	return f.checkEvents(b)
}

// checkEvents validates a batch before any of it is applied, so that a
// malformed batch changes nothing. It reads only the options, never the
// state.
func (f *FSM) checkEvents(b *kvdirv1.EventBatch) error {
	if len(b.Events) > f.opts.MaxBatchEvents {
		return fmt.Errorf("%d events, limit %d", len(b.Events), f.opts.MaxBatchEvents)
	}
	maxChain := f.index.Load().Options().MaxChain
	blocks := 0
	for i, ev := range b.Events {
		var hashes []uint64
		var m kvdirv1.Medium
		switch k := ev.Kind.(type) {
		case *kvdirv1.Event_Stored:
			if k.Stored == nil {
				return fmt.Errorf("event %d: empty stored event", i)
			}
			hashes, m = k.Stored.Hashes, k.Stored.Medium
		case *kvdirv1.Event_Removed:
			if k.Removed == nil {
				return fmt.Errorf("event %d: empty removed event", i)
			}
			hashes, m = k.Removed.Hashes, k.Removed.Medium
		case *kvdirv1.Event_Cleared:
			continue
		case *kvdirv1.Event_Layout:
			if err := checkLayout(k.Layout); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
			continue
		default:
			return fmt.Errorf("event %d: no kind set", i)
		}
		if len(hashes) > maxChain {
			return fmt.Errorf("event %d: %d blocks, limit %d per piece", i, len(hashes), maxChain)
		}
		if _, ok := kvdirv1.Medium_name[int32(m)]; !ok {
			return fmt.Errorf("event %d: unknown medium %d", i, m)
		}
		for _, h := range hashes {
			if h == radix.Root {
				return fmt.Errorf("event %d: block hash 0 is reserved", i)
			}
		}
		if blocks += len(hashes); blocks > f.opts.MaxBatchBlocks {
			return fmt.Errorf("more than %d blocks in the batch", f.opts.MaxBatchBlocks)
		}
	}
	return nil
}

// medium maps the API's medium to the index's. Unspecified means GPU.
func medium(m kvdirv1.Medium) radix.Medium {
	switch m {
	case kvdirv1.Medium_MEDIUM_CPU:
		return radix.CPU
	case kvdirv1.Medium_MEDIUM_DISK:
		return radix.Disk
	case kvdirv1.Medium_MEDIUM_REMOTE:
		return radix.Remote
	default:
		return radix.GPU
	}
}
