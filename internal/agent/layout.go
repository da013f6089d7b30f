package agent

import (
	"math"

	"github.com/kvdir/kvdir/internal/blockhash"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Proto returns the layout as the directory stores it (Worker.layout).
// Values the directory would refuse are left out: a group's block size
// outside 1..blockhash.MaxBlockSize becomes 0 (unknown), a group without an
// index (-1) is group 0.
func (l Layout) Proto() *kvdirv1.WorkerLayout {
	p := &kvdirv1.WorkerLayout{}
	for _, bs := range l.BlockSizes {
		if bs >= 1 && bs <= blockhash.MaxBlockSize {
			p.BlockSizes = append(p.BlockSizes, uint32(bs))
		}
	}
	for _, g := range l.Groups {
		kg := &kvdirv1.KVGroup{Index: clampU32(g.Group), Kind: g.Kind, SlidingWindow: clampU32(g.SlidingWindow), Indexed: g.Indexed}
		if g.BlockSize >= 1 && g.BlockSize <= blockhash.MaxBlockSize {
			kg.BlockSize = uint32(g.BlockSize)
		}
		p.Groups = append(p.Groups, kg)
	}
	return p
}

// clampU32 maps v into [0, MaxUint32].
func clampU32(v int) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

// layoutEvent returns a directory event carrying the whole current layout
// and marks it sent.
func (t *Translator) layoutEvent() *kvdirv1.Event {
	t.layoutDirty = false
	return &kvdirv1.Event{Kind: &kvdirv1.Event_Layout{Layout: t.Layout().Proto()}}
}

// LayoutChange returns the layout event to put before evs (the events a
// Translate call just produced) when the layout changed since the last
// layout event and evs store blocks, else nil. A change seen only in events
// that stored nothing waits for the next store, so that bad input does not
// send layouts.
func (t *Translator) LayoutChange(evs []*kvdirv1.Event) *kvdirv1.Event {
	if !t.layoutDirty {
		return nil
	}
	for _, e := range evs {
		if e.GetStored() != nil {
			return t.layoutEvent()
		}
	}
	return nil
}

// LayoutEvent returns the event that tells the directory the current
// layout, or nil while no store was seen. The agent puts it at the start of
// every epoch's (and every resynchronisation's) first batch, since the
// directory forgets the layout at each registration.
func (t *Translator) LayoutEvent() *kvdirv1.Event {
	if len(t.groups) == 0 && len(t.blockSizes) == 0 {
		return nil
	}
	return t.layoutEvent()
}
