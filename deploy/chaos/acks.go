package chaos

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Acknowledged event batches.
//
// An agent's publisher numbers its batches 1, 2, ... within an epoch (one
// registration) and drops a batch from its queue when the directory
// acknowledges it: APPLIED or DUPLICATE, answered by the leader only once
// the batch's Raft entry is committed and applied. Every node's registry
// then holds applied_seq, the last sequence number applied for the worker
// in its current epoch. An acknowledged batch is lost if the directory
// later holds a lower applied_seq for that worker in that epoch. Two
// observers catch that:
//
//   - SeqMonitor polls every node's worker registry and keeps, per
//     (worker, epoch), the highest applied_seq any node ever reported: a
//     value a node reported is committed, so at least as far as anything
//     acknowledged when it was read. Once the nodes agree again, every
//     node must be at or above that mark in the worker's current epoch,
//     and no node may be in an older epoch than one already seen.
//   - The agents themselves: an agent whose acknowledged batches the
//     directory lost would have its next batch refused with GAP (its
//     first_seq is more than one past the directory's applied_seq), which
//     it logs with both numbers. GapRefusals parses those log lines.

// SeqMonitor tracks the highest applied_seq of every (worker, epoch).
type SeqMonitor struct {
	dir *Directory

	mu        sync.Mutex
	high      map[workerEpoch]uint64
	maxEpoch  map[string]uint64
	lastError string
}

type workerEpoch struct {
	worker string
	epoch  uint64
}

// NewSeqMonitor returns a monitor of dir's nodes.
func NewSeqMonitor(dir *Directory) *SeqMonitor {
	return &SeqMonitor{dir: dir, high: map[workerEpoch]uint64{}, maxEpoch: map[string]uint64{}}
}

// Run polls every node every interval until ctx ends.
func (m *SeqMonitor) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		m.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll reads every reachable node's registry once and returns the answers
// by container name.
func (m *SeqMonitor) Poll(ctx context.Context) map[string][]*kvdirv1.Worker {
	out := map[string][]*kvdirv1.Worker{}
	var omu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range m.dir.Names() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws, err := m.dir.Workers(ctx, name)
			if err != nil {
				m.mu.Lock()
				m.lastError = err.Error()
				m.mu.Unlock()
				return
			}
			m.observe(ws)
			omu.Lock()
			out[name] = ws
			omu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (m *SeqMonitor) observe(ws []*kvdirv1.Worker) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range ws {
		id := w.GetSpec().GetId()
		k := workerEpoch{id, w.Epoch}
		m.high[k] = max(m.high[k], w.AppliedSeq)
		m.maxEpoch[id] = max(m.maxEpoch[id], w.Epoch)
	}
}

// Lost compares the nodes' registries with the high-water marks until no
// node is below one or the timeout passes (a node may still be applying
// the last entries), and returns the number of batches below a mark
// (summed over workers and nodes) and a line per problem. Call it once the
// load has stopped.
func (m *SeqMonitor) Lost(ctx context.Context, timeout time.Duration) (int, []string) {
	var lost int
	var why []string
	_ = testkit.Poll(ctx, timeout, "every acknowledged sequence number to be held", func() (bool, string) {
		lost, why = m.lostNow(ctx)
		return len(why) == 0, strings.Join(why, "; ")
	})
	return lost, why
}

func (m *SeqMonitor) lostNow(ctx context.Context) (int, []string) {
	nodes := m.Poll(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	lost := 0
	var why []string
	for _, name := range m.dir.Names() {
		ws, ok := nodes[name]
		if !ok {
			why = append(why, fmt.Sprintf("%s: registry unreadable (%s)", name, m.lastError))
			continue
		}
		for _, w := range ws {
			id := w.GetSpec().GetId()
			if w.Epoch < m.maxEpoch[id] {
				why = append(why, fmt.Sprintf("%s: worker %s in epoch %d, but epoch %d was seen", name, id, w.Epoch, m.maxEpoch[id]))
				continue
			}
			if h := m.high[workerEpoch{id, w.Epoch}]; w.AppliedSeq < h {
				lost += int(h - w.AppliedSeq)
				why = append(why, fmt.Sprintf("%s: worker %s epoch %d applied_seq %d, but %d was seen", name, id, w.Epoch, w.AppliedSeq, h))
			}
		}
	}
	sort.Strings(why)
	return lost, why
}

// gapLine matches the agent's log of a GAP refusal (dirclient.RefusedError).
var gapLine = regexp.MustCompile(`batch (\d+)\.\.(\d+) refused: PUBLISH_STATUS_GAP: the directory applied up to sequence (\d+)`)

// GapRefusals returns how many GAP refusals an agent's log shows and how
// many acknowledged batches they imply were lost (first_seq - 1 -
// applied_seq each).
func GapRefusals(log string) (refusals, lost int) {
	for _, m := range gapLine.FindAllStringSubmatch(log, -1) {
		first, _ := strconv.Atoi(m[1])
		applied, _ := strconv.Atoi(m[3])
		refusals++
		lost += max(0, first-1-applied)
	}
	return refusals, lost
}
