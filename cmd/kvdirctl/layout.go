package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// defaultBlockSize is what routers assume for a worker whose block size is
// neither learned nor registered (their --block-size default).
const defaultBlockSize = 16

// layoutView fills v's learned block sizes and groups from w's layout.
func layoutView(v *ctlview.Worker, w *kvdirv1.Worker) {
	l := w.GetLayout()
	v.BlockSizes = slices.Clone(l.GetBlockSizes())
	for _, g := range l.GetGroups() {
		v.Groups = append(v.Groups, ctlview.KVGroup{Index: g.GetIndex(), Kind: g.GetKind(), BlockSize: g.GetBlockSize(),
			SlidingWindow: g.GetSlidingWindow(), Indexed: g.GetIndexed()})
	}
}

// effectiveBlockSize is the block size routers hash w's prompts in first:
// the smallest learned, else the registered one, else the default.
func effectiveBlockSize(w *kvdirv1.Worker) uint32 {
	if bs := w.GetLayout().GetBlockSizes(); len(bs) > 0 {
		return bs[0]
	}
	if bs := w.GetSpec().GetBlockSize(); bs > 0 {
		return bs
	}
	return defaultBlockSize
}

// viewBlockSize is effectiveBlockSize of a worker view.
func viewBlockSize(v ctlview.Worker) uint32 {
	if len(v.BlockSizes) > 0 {
		return v.BlockSizes[0]
	}
	if v.BlockSize > 0 {
		return v.BlockSize
	}
	return defaultBlockSize
}

// holdsBlockSize reports whether w publishes blocks of size bs (learned, or
// registered while nothing is learned).
func holdsBlockSize(w *kvdirv1.Worker, bs uint32) bool {
	if l := w.GetLayout().GetBlockSizes(); len(l) > 0 {
		return slices.Contains(l, bs)
	}
	return effectiveBlockSize(w) == bs
}

// blockSizesText shows a worker's block sizes: the learned ones, or the
// registered one marked as not confirmed by events ("16?"), or "-".
func blockSizesText(v ctlview.Worker) string {
	if len(v.BlockSizes) > 0 {
		return joinU32(v.BlockSizes, ",")
	}
	if v.BlockSize > 0 {
		return strconv.FormatUint(uint64(v.BlockSize), 10) + "?"
	}
	return "-"
}

// groupsText shows a worker's KV-cache groups on one line.
func groupsText(v ctlview.Worker) string {
	if len(v.Groups) == 0 {
		return "none seen yet"
	}
	var parts []string
	for _, g := range v.Groups {
		kind := g.Kind
		if kind == "" {
			kind = "unnamed"
		}
		s := fmt.Sprintf("%d: %s, block size %d", g.Index, kind, g.BlockSize)
		if g.SlidingWindow > 0 {
			s += fmt.Sprintf(", window %d", g.SlidingWindow)
		}
		if g.Indexed {
			s += ", indexed"
		} else {
			s += ", not indexed"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func joinU32(xs []uint32, sep string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatUint(uint64(x), 10)
	}
	return strings.Join(parts, sep)
}

// blockSizeMismatch says whether w's agent registered a block size its
// events do not show, and names the cause.
func blockSizeMismatch(w *kvdirv1.Worker) (ctlview.BlockSizeMismatch, bool) {
	reg, learned := w.GetSpec().GetBlockSize(), w.GetLayout().GetBlockSizes()
	if reg == 0 || len(learned) == 0 || slices.Contains(learned, reg) {
		return ctlview.BlockSizeMismatch{}, false
	}
	sends := joinU32(learned, " and ")
	fix := strconv.FormatUint(uint64(learned[0]), 10)
	return ctlview.BlockSizeMismatch{
		Worker: w.GetSpec().GetId(), Registered: reg, Learned: slices.Clone(learned),
		Detail: fmt.Sprintf("agent --block-size %d, engine sends %s: set --block-size %s or leave it unset "+
			"(routers hash with the learned size, so routing works; the agent counts kvdir_agent_problems_total{kind=\"block_size_mismatch\"})",
			reg, sends, fix),
	}, true
}

// blockSizeMismatches lists the live workers with a block size mismatch;
// an error of the listing leaves the list empty (status still answers).
func (a *app) blockSizeMismatches(ctx context.Context) []ctlview.BlockSizeMismatch {
	c, err := a.dir()
	if err != nil {
		return nil
	}
	resp, err := c.ListWorkers(ctx, "", false)
	if err != nil {
		return nil
	}
	var out []ctlview.BlockSizeMismatch
	for _, w := range resp.Workers {
		if m, ok := blockSizeMismatch(w); ok {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(x, y ctlview.BlockSizeMismatch) int { return strings.Compare(x.Worker, y.Worker) })
	return out
}

// blockSizeLine describes a worker's block sizes for "workers get".
func blockSizeLine(v ctlview.Worker) string {
	reg := "not told"
	if v.BlockSize > 0 {
		reg = strconv.FormatUint(uint64(v.BlockSize), 10)
	}
	if len(v.BlockSizes) == 0 {
		return fmt.Sprintf("%d assumed (registered: %s; none learned from events yet)", viewBlockSize(v), reg)
	}
	return fmt.Sprintf("%s learned from events (registered: %s)", joinU32(v.BlockSizes, ", "), reg)
}

// effectiveLearned is the first block size learned from w's events (0:
// none).
func effectiveLearned(w *kvdirv1.Worker) uint32 {
	if bs := w.GetLayout().GetBlockSizes(); len(bs) > 0 {
		return bs[0]
	}
	return 0
}
