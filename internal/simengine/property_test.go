package simengine

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// randomWorkload runs a random workload (shared prefixes, several namespaces,
// a tiny cache, small budgets, aborts and resets) and, after every engine
// call, checks that the cache content implied by the events equals the
// cache, block by block, and that reference counts match the running
// requests. It returns a digest of everything observable.
func randomWorkload(t *testing.T, seed uint64) (uint64, coverage) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	bs := []int{1, 2, 4, 8, 16}[rng.IntN(5)]
	capBlocks := 4 + rng.IntN(40)
	cfg := Config{
		Profile:          mustProfile(t, []string{"llama3-8b", "llama3-70b"}[rng.IntN(2)]),
		BlockSize:        bs,
		CapacityBlocks:   capBlocks,
		MaxBatchedTokens: 1 + rng.IntN(96),
		MaxRunning:       1 + rng.IntN(8),
		Seed:             rng.Uint64(),
	}
	rec := &recorder{}
	e := mustEngine(t, cfg, rec)
	model := newEventModel(bs)
	digest := fnv.New64a()

	docs := make([][]uint32, 3)
	for i := range docs {
		docs[i] = randTokens(rng, 1+rng.IntN(4*bs+8), 20)
	}
	type arrival struct {
		at time.Duration
		r  Request
	}
	capTokens := capBlocks * bs
	var arrivals []arrival
	for i := range 20 + rng.IntN(60) {
		doc := docs[rng.IntN(len(docs))]
		prompt := append(slices.Clone(doc[:rng.IntN(len(doc)+1)]), randTokens(rng, rng.IntN(2*bs+3), 20)...)
		if len(prompt) == 0 {
			prompt = []uint32{7}
		}
		prompt = prompt[:min(len(prompt), capTokens)]
		maxTokens := min(1+rng.IntN(30), capTokens-len(prompt)+1)
		arrivals = append(arrivals, arrival{
			at: time.Duration(rng.IntN(400)) * time.Millisecond,
			r: Request{
				ID: fmt.Sprintf("r%03d", i), Tokens: prompt, MaxTokens: maxTokens,
				Namespace: []string{"", "m2"}[rng.IntN(2)], LoRAName: []string{"", "lora"}[rng.IntN(2)],
			},
		})
	}
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return int(a.at - b.at) })
	want := make(map[string]int) // ID → MaxTokens
	for _, a := range arrivals {
		want[a.r.ID] = a.r.MaxTokens
	}

	var inFlight []string
	finished := map[string]Result{}
	lastBatch := time.Duration(-1)
	verify := func(what string) {
		t.Helper()
		for _, b := range rec.batches {
			if b.Time < lastBatch {
				t.Fatalf("seed %d %s: batch time went back", seed, what)
			}
			lastBatch = b.Time
			fmt.Fprintf(digest, "batch %d\n%s", b.Time, dumpEvents(b.Events))
		}
		for _, ev := range rec.take() {
			if err := model.apply(ev); err != nil {
				t.Fatalf("seed %d %s: %v", seed, what, err)
			}
		}
		if err := model.check(e.cache); err != nil {
			t.Fatalf("seed %d %s: %v", seed, what, err)
		}
		if err := checkRefs(e); err != nil {
			t.Fatalf("seed %d %s: %v", seed, what, err)
		}
		if st := e.Stats(); st.Running+st.Waiting != len(inFlight) {
			t.Fatalf("seed %d %s: %d running + %d waiting, %d in flight", seed, what, st.Running, st.Waiting, len(inFlight))
		}
	}
	retire := func(r Result) {
		t.Helper()
		finished[r.ID] = r
		inFlight = slices.DeleteFunc(inFlight, func(id string) bool { return id == r.ID })
		fmt.Fprintf(digest, "%s %s %d %d %d %d %v\n", r.ID, r.FinishReason, r.CachedTokens, r.FirstToken, r.Finish, r.Preemptions, r.Output)
	}

	now := time.Duration(0)
	for steps := 0; ; steps++ {
		if steps > 200000 {
			t.Fatalf("seed %d: no progress", seed)
		}
		for len(arrivals) > 0 && arrivals[0].at <= now {
			a := arrivals[0]
			arrivals = arrivals[1:]
			if err := e.Submit(max(a.at, 0), a.r); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			inFlight = append(inFlight, a.r.ID)
		}
		switch x := rng.IntN(100); {
		case x < 2 && len(inFlight) > 0:
			id := inFlight[rng.IntN(len(inFlight))]
			r, ok := e.Abort(now, id)
			if !ok || r.FinishReason != FinishAbort {
				t.Fatalf("seed %d: abort %s failed", seed, id)
			}
			retire(r)
			verify("abort")
		case x < 4:
			err := e.Reset(now)
			if busy := e.Stats().Running > 0; busy != errors.Is(err, ErrCacheBusy) || (!busy && err != nil) {
				t.Fatalf("seed %d: reset with %d running: %v", seed, e.Stats().Running, err)
			}
			verify("reset")
		}
		res := e.Step(now)
		for _, f := range res.Finished {
			if len(f.Output) != want[f.ID] || f.FirstToken < f.Arrival || f.Finish < f.FirstToken || f.FinishReason != FinishLength {
				t.Fatalf("seed %d: bad result %+v", seed, f)
			}
			retire(f)
		}
		verify("step")
		if res.Idle {
			if e.Busy() {
				t.Fatalf("seed %d: idle while busy", seed)
			}
			if len(arrivals) == 0 {
				break
			}
			now = arrivals[0].at
			continue
		}
		now = res.End
	}
	if len(finished) != len(want) {
		t.Fatalf("seed %d: %d of %d requests retired", seed, len(finished), len(want))
	}
	st := e.Stats()
	fmt.Fprintf(digest, "%+v\n", st)
	cov := coverage{
		stores: model.stores, dupStores: model.dupStores, removes: model.removes, clears: model.clears,
		preemptions: int(st.Preemptions), hits: int(st.PrefixHits),
	}
	for _, r := range finished {
		if r.FinishReason == FinishAbort {
			cov.aborts++
		}
	}
	return digest.Sum64(), cov
}

// coverage counts what a workload exercised.
type coverage struct {
	stores, dupStores, removes, clears, preemptions, hits, aborts int
}

func (c *coverage) add(o coverage) {
	c.stores += o.stores
	c.dupStores += o.dupStores
	c.removes += o.removes
	c.clears += o.clears
	c.preemptions += o.preemptions
	c.hits += o.hits
	c.aborts += o.aborts
}

func TestPropertyEventsMatchCache(t *testing.T) {
	n := uint64(200)
	if testing.Short() {
		n = 50
	}
	var total coverage
	for seed := range n {
		_, cov := randomWorkload(t, seed)
		total.add(cov)
	}
	t.Logf("coverage over %d workloads: %+v", n, total)
	if total.dupStores == 0 || total.removes == 0 || total.clears == 0 || total.preemptions == 0 || total.hits == 0 || total.aborts == 0 {
		t.Fatalf("workloads do not exercise everything: %+v", total)
	}
}

func TestDeterminism(t *testing.T) {
	for _, seed := range []uint64{3, 17, 99} {
		a, _ := randomWorkload(t, seed)
		b, _ := randomWorkload(t, seed)
		if a != b {
			t.Fatalf("seed %d: digests differ: %x vs %x", seed, a, b)
		}
	}
	if a, _ := randomWorkload(t, 3); a == func() uint64 { b, _ := randomWorkload(t, 4); return b }() {
		t.Fatal("different seeds, same digest")
	}
}
