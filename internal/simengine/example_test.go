package simengine_test

import (
	"fmt"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
)

// A discrete-event loop on a virtual clock: requests arrive at given times,
// the engine steps from one step end to the next and jumps to the next
// arrival when idle.
func Example() {
	profile, err := costmodel.ProfileByName("llama3-8b")
	if err != nil {
		fmt.Println(err)
		return
	}
	stored := 0
	sink := simengine.SinkFunc(func(b simengine.EventBatch) {
		for _, ev := range b.Events {
			if s, ok := ev.(*kvevents.BlockStored); ok {
				stored += len(s.BlockHashes)
			}
		}
	})
	e, err := simengine.New(simengine.Config{Profile: profile, CapacityBlocks: 8192}, sink)
	if err != nil {
		fmt.Println(err)
		return
	}
	system := make([]uint32, 4200)
	for i := range system {
		system[i] = uint32(i)
	}
	arrivals := []struct {
		at time.Duration
		r  simengine.Request
	}{
		{0, simengine.Request{ID: "a", Tokens: append(system[:4200:4200], 1, 2, 3), MaxTokens: 8}},
		{500 * time.Millisecond, simengine.Request{ID: "b", Tokens: append(system[:4200:4200], 4, 5, 6), MaxTokens: 8}},
	}
	now := time.Duration(0)
	for len(arrivals) > 0 || e.Busy() {
		for len(arrivals) > 0 && arrivals[0].at <= now {
			if err := e.Submit(arrivals[0].at, arrivals[0].r); err != nil {
				fmt.Println(err)
				return
			}
			arrivals = arrivals[1:]
		}
		res := e.Step(now)
		if res.Idle {
			now = arrivals[0].at
			continue
		}
		now = res.End
		for _, f := range res.Finished {
			fmt.Printf("%s: cached %d of %d, TTFT %.1f ms\n", f.ID, f.CachedTokens, f.PromptTokens, float64(f.TTFT())/1e6)
		}
	}
	st := e.Stats()
	fmt.Printf("prefix hits %d of %d tokens, %d blocks stored\n", st.PrefixHits, st.PrefixQueries, stored)
	// Output:
	// a: cached 0 of 4203, TTFT 109.1 ms
	// b: cached 4192 of 4203, TTFT 7.6 ms
	// prefix hits 4192 of 8406 tokens, 264 blocks stored
}
