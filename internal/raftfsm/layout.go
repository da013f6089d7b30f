package raftfsm

import (
	"fmt"
	"slices"

	"github.com/kvdir/kvdir/internal/blockhash"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Bounds of a worker's layout (Worker.layout): its agent records at most
// 16 block sizes and 64 groups, and kind names are short.
const (
	MaxLayoutBlockSizes = 16
	MaxLayoutGroups     = 64
	maxKindLen          = 128
)

// checkLayout validates a layout event: block sizes ascending, distinct and
// in 1..blockhash.MaxBlockSize; at most MaxLayoutGroups groups, each with a
// block size of 0 (unknown) or in range and a kind of at most 128 bytes.
func checkLayout(l *kvdirv1.WorkerLayout) error {
	if l == nil {
		return fmt.Errorf("empty layout event")
	}
	if n := len(l.BlockSizes); n > MaxLayoutBlockSizes {
		return fmt.Errorf("layout: %d block sizes, limit %d", n, MaxLayoutBlockSizes)
	}
	for i, bs := range l.BlockSizes {
		if bs < 1 || bs > blockhash.MaxBlockSize {
			return fmt.Errorf("layout: block size %d not in [1, %d]", bs, blockhash.MaxBlockSize)
		}
		if i > 0 && bs <= l.BlockSizes[i-1] {
			return fmt.Errorf("layout: block sizes %v not ascending and distinct", l.BlockSizes)
		}
	}
	if n := len(l.Groups); n > MaxLayoutGroups {
		return fmt.Errorf("layout: %d groups, limit %d", n, MaxLayoutGroups)
	}
	for i, g := range l.Groups {
		switch {
		case g == nil:
			return fmt.Errorf("layout: group %d is empty", i)
		case g.BlockSize > blockhash.MaxBlockSize:
			return fmt.Errorf("layout: group %d block size %d not in [0, %d]", g.Index, g.BlockSize, blockhash.MaxBlockSize)
		case len(g.Kind) > maxKindLen:
			return fmt.Errorf("layout: group %d kind longer than %d bytes", g.Index, maxKindLen)
		}
	}
	return nil
}

// engineBlockSize is the block size a session record hashed in bs is
// compared with by the misconfiguration check: bs itself when the worker's
// layout names it (a worker may index several sizes), else the layout's
// first, else the registered one (0: not told).
func engineBlockSize(w *kvdirv1.Worker, bs uint32) int {
	if l := w.GetLayout().GetBlockSizes(); len(l) > 0 {
		if slices.Contains(l, bs) {
			return int(bs)
		}
		return int(l[0])
	}
	return int(w.GetSpec().GetBlockSize())
}
