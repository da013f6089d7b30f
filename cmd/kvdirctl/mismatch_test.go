package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestMismatchesOfUsesTheSharedRule(t *testing.T) {
	bad := &kvdirv1.CacheAccounting{}
	good := &kvdirv1.CacheAccounting{}
	bs := &kvdirv1.CacheAccounting{}
	seed := &kvdirv1.CacheAccounting{}
	for range cachecheck.MinTurns {
		cachecheck.Add(bad, cachecheck.Turn{Reported: 64, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true, ModelDiffers: true})
		cachecheck.Add(seed, cachecheck.Turn{Reported: 64, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true})
		cachecheck.Add(good, cachecheck.Turn{Predicted: 64, Reported: 64, BlockSize: 16, RegisteredBlockSize: 16, DirHoldsBlocks: true})
		cachecheck.Add(bs, cachecheck.Turn{Reported: 64, BlockSize: 16, RegisteredBlockSize: 32, DirHoldsBlocks: true})
	}
	ws := []*kvdirv1.Worker{
		{Spec: &kvdirv1.WorkerSpec{Id: "bad", Model: "llama3-8b-instruct", BlockSize: 16}, CacheAccounting: bad},
		{Spec: &kvdirv1.WorkerSpec{Id: "good", Model: "llama3-8b", BlockSize: 16}, CacheAccounting: good},
		{Spec: &kvdirv1.WorkerSpec{Id: "bs", Model: "llama3-8b", BlockSize: 32}, CacheAccounting: bs},
		{Spec: &kvdirv1.WorkerSpec{Id: "new", Model: "llama3-8b", BlockSize: 16}},
		{Spec: &kvdirv1.WorkerSpec{Id: "seed", Model: "llama3-8b", BlockSize: 16}, CacheAccounting: seed},
	}
	ms := mismatchesOf(ws)
	if len(ms) != 3 || ms[0].Worker != "bad" || ms[1].Worker != "bs" || ms[2].Worker != "seed" {
		t.Fatalf("flagged %+v, want bad, bs and seed", ms)
	}
	// The routers' session records say the model differed on bad's turns
	// and on none of seed's: the directory names the cause as exactly.
	if ms[2].LikelyCause != string(cachecheck.CauseHashSeed) {
		t.Fatalf("seed: %+v", ms[2])
	}
	if ms[0].LikelyCause != string(cachecheck.CauseModelName) || ms[0].UnpredictedHits != cachecheck.MinTurns {
		t.Fatalf("bad: %+v", ms[0])
	}
	if ms[1].LikelyCause != string(cachecheck.CauseBlockSize) || ms[1].HashedBlockSize != 16 || ms[1].BlockSize != 32 {
		t.Fatalf("bs: %+v", ms[1])
	}
	var out bytes.Buffer
	writeMismatches(&out, &ctlview.Status{CacheMismatches: ms})
	for _, want := range []string{"MISMATCH: worker bad (model llama3-8b-instruct): unmatched-events", "likely cause: model name",
		"MISMATCH: worker bs", "likely cause: block size", "6 with cached tokens reported, 6 of them unpredicted"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	writeMismatches(&out, &ctlview.Status{CacheMismatches: mismatchesOf(ws[1:2])})
	if !strings.Contains(out.String(), "no worker flagged") {
		t.Fatalf("healthy output:\n%s", out.String())
	}
}
