package indexbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"

	goradix "github.com/armon/go-radix"

	"github.com/kvdir/kvdir/internal/radix"
	"github.com/kvdir/kvdir/internal/radix/radixtest"
)

// GoRadixComparison compares the specialised tree with
// github.com/armon/go-radix on the same contents: go-radix is keyed by the
// chain prefix up to each block (8 bytes per block), valued by the bitmask of
// workers holding that block.
type GoRadixComparison struct {
	Entries              int64   `json:"entries"`
	DistinctBlocks       int64   `json:"distinct_blocks"`
	ChainBlocks          int     `json:"match_chain_blocks"`
	TreeBytesPerEntry    float64 `json:"tree_bytes_per_entry"`
	GoRadixBytesPerEntry float64 `json:"goradix_bytes_per_entry"`
	GoRadixKeyBytes      int64   `json:"goradix_key_bytes"`
	TreeMatchP50us       float64 `json:"tree_match_p50_us"`
	GoRadixMatchP50us    float64 `json:"goradix_match_p50_us"`
	TreeBuildSeconds     float64 `json:"tree_build_seconds"`
	GoRadixBuildSeconds  float64 `json:"goradix_build_seconds"`
}

func compareGoRadix(shape radixtest.Shape, chainBlocks int) (*GoRadixComparison, error) {
	wl := radixtest.Generate(shape)
	chains := longChains(wl, chainBlocks)
	if len(chains) == 0 {
		return nil, errors.New("go-radix comparison: no chain long enough")
	}
	cmp := &GoRadixComparison{ChainBlocks: chainBlocks}

	base := liveHeap()
	start := time.Now()
	x := radix.New(radix.Options{})
	if _, err := wl.Populate(x); err != nil {
		return nil, fmt.Errorf("go-radix comparison: build the tree: %w", err)
	}
	cmp.TreeBuildSeconds = time.Since(start).Seconds()
	st := x.Stats()
	cmp.Entries, cmp.DistinctBlocks = st.Entries, st.Blocks
	cmp.TreeBytesPerEntry = float64(liveHeap()-base) / float64(st.Entries)
	var treeLat []time.Duration
	var dst []radix.WorkerMatch
	for i := range 2000 {
		t := time.Now()
		dst, _ = x.MatchInto(dst, chains[i%len(chains)])
		treeLat = append(treeLat, time.Since(t))
	}
	cmp.TreeMatchP50us = pct(treeLat, 0.5)
	want := dst
	x = nil

	base = liveHeap()
	start = time.Now()
	t := goradix.New()
	// add records worker as holding chain[from:], keyed by full prefixes.
	add := func(chain []uint64, from, worker int) {
		key := make([]byte, 0, 8*len(chain))
		for i, h := range chain {
			key = binary.BigEndian.AppendUint64(key, h)
			if i < from {
				continue
			}
			k := string(key)
			var mask uint64
			if v, ok := t.Get(k); ok {
				mask = v.(uint64)
			}
			cmp.GoRadixKeyBytes += int64(len(k))
			t.Insert(k, mask|1<<worker)
		}
	}
	for i, sys := range wl.Systems {
		for _, h := range wl.SystemHolders[i] {
			add(sys, 0, h)
		}
	}
	for i := range wl.Sessions {
		full := wl.Chain(i, 1<<30)
		from := len(wl.Systems[wl.Sessions[i].System])
		for _, h := range wl.Sessions[i].Holders {
			add(full, from, h)
		}
	}
	cmp.GoRadixBuildSeconds = time.Since(start).Seconds()
	cmp.GoRadixBytesPerEntry = float64(liveHeap()-base) / float64(cmp.Entries)

	var grLat []time.Duration
	var got []int
	for i := range 2000 {
		c := chains[i%len(chains)]
		key := make([]byte, 0, 8*len(c))
		for _, h := range c {
			key = binary.BigEndian.AppendUint64(key, h)
		}
		t0 := time.Now()
		got = goRadixMatch(t, string(key))
		grLat = append(grLat, time.Since(t0))
	}
	cmp.GoRadixMatchP50us = pct(grLat, 0.5)
	// Both must give the same answer for the last chain.
	if len(got) != len(want) {
		return nil, fmt.Errorf("go-radix matched %d workers, the tree %d", len(got), len(want))
	}
	return cmp, nil
}

// goRadixMatch returns each matching worker's depth (in blocks) along key.
func goRadixMatch(t *goradix.Tree, key string) []int {
	var alive uint64
	depth := make(map[int]int)
	next := 1
	t.WalkPath(key, func(k string, v any) bool {
		if len(k)/8 != next {
			return true // a gap: nobody holds the block between
		}
		mask := v.(uint64)
		if next == 1 {
			alive = mask
		}
		for gone := alive &^ mask; gone != 0; gone &= gone - 1 {
			depth[bits.TrailingZeros64(gone)] = next - 1
		}
		alive &= mask
		if alive == 0 {
			return true
		}
		next++
		return false
	})
	for ; alive != 0; alive &= alive - 1 {
		depth[bits.TrailingZeros64(alive)] = next - 1
	}
	var out []int
	for _, d := range depth {
		if d > 0 {
			out = append(out, d)
		}
	}
	return out
}
