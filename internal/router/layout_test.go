package router

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// sizedMatcher answers per block size: blocks[bs][worker].
type sizedMatcher struct {
	blocks map[uint32]map[string]uint32
	asked  []uint32
}

func (f *sizedMatcher) MatchChain(_ context.Context, hashes []uint64, bs uint32, _ bool) (*kvdirv1.MatchResponse, error) {
	f.asked = append(f.asked, bs)
	resp := &kvdirv1.MatchResponse{ChainBlocks: uint32(len(hashes))}
	for id, b := range f.blocks[bs] {
		resp.Matches = append(resp.Matches, &kvdirv1.WorkerMatch{WorkerId: id, Blocks: min(b, uint32(len(hashes)))})
	}
	return resp, nil
}

func TestBlockSizeOf(t *testing.T) {
	s := decisionServer(t, &fakeMatcher{})
	s.cfg.BlockSize = 32
	w := &worker{}
	if got := s.blockSizesOf(w); !slices.Equal(got, []int{32}) {
		t.Fatalf("nothing known: %v, want the configured 32", got)
	}
	w.blockSize.Store(16)
	if got := s.blockSizeOf(w); got != 16 {
		t.Fatalf("registered 16: %d", got)
	}
	w.setLearned([]int{64, 528})
	if got := s.blockSizesOf(w); !slices.Equal(got, []int{64, 528}) || s.blockSizeOf(w) != 64 {
		t.Fatalf("learned 64 and 528: %v, first %d", got, s.blockSizeOf(w))
	}
	w.setLearned(nil)
	if got := s.blockSizeOf(w); got != 16 {
		t.Fatalf("learned cleared: %d, want the registered 16", got)
	}
	// From the directory's worker record.
	dw := &kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "a"}, Layout: &kvdirv1.WorkerLayout{BlockSizes: []uint32{64, 0, 1 << 20, 16}}}
	if got := learnedSizes(dw); !slices.Equal(got, []int{16, 64}) {
		t.Fatalf("learnedSizes: %v, want [16 64] (out-of-range sizes dropped)", got)
	}
}

// TestDecisionHashesWithLearnedBlockSize checks that a worker registered
// with 16 whose events showed 64 is matched in 64-token blocks (and found),
// and that a worker indexing two sizes is credited with the better one.
func TestDecisionHashesWithLearnedBlockSize(t *testing.T) {
	req := longChat(t)
	m := &sizedMatcher{blocks: map[uint32]map[string]uint32{
		64: {"a": 1000, "c": 2},
		16: {"b": 1, "c": 3},
	}}
	s := decisionServer(t, &fakeMatcher{})
	s.groups[0].matcher = m
	s.pool.replace([]workerSpec{
		{ID: "a", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16, BlockSizes: []int{64}},
		{ID: "b", Address: "http://127.0.0.1:2", Model: "m", BlockSize: 16},
		{ID: "c", Address: "http://127.0.0.1:3", Model: "m", BlockSizes: []int{16, 64}},
	})
	d, aerr := s.decide(t.Context(), req, nil)
	if aerr != nil {
		t.Fatal(aerr)
	}
	slices.Sort(m.asked)
	if !slices.Equal(m.asked, []uint32{16, 64}) {
		t.Fatalf("asked the directory for sizes %v, want 16 and 64 once each", m.asked)
	}
	if !slices.Equal(d.bs, []int{64, 16, 64}) {
		t.Fatalf("block sizes used %v, want [64 16 64]", d.bs)
	}
	if d.pick.Worker != "a" {
		t.Fatalf("picked %s, want a (holds the prompt in 64-token blocks)", d.pick.Worker)
	}
	if d.dir[0] == 0 || d.dir[1] != 1 || d.dir[2] != 2 {
		t.Fatalf("directory blocks %v", d.dir)
	}
	// c: 3 blocks of 16 = 48 tokens, 2 blocks of 64 = 128 tokens: 64 wins,
	// expressed in d.blockSize (a's 64) units.
	if d.blockSize != 64 || d.cands[2].MatchedBlocks != 2 {
		t.Fatalf("d.blockSize %d, c matched %d blocks, want 64 and 2", d.blockSize, d.cands[2].MatchedBlocks)
	}
	e := s.explain(req, d)
	for i, want := range []int{64, 16, 64} {
		if e.Workers[i].BlockSize != want {
			t.Fatalf("explain: worker %s block size %d, want %d", e.Workers[i].Worker, e.Workers[i].BlockSize, want)
		}
	}
}

// TestStaticWorkerTakesDirectoryLayout checks that a static worker takes
// the block sizes the directory learned for the directory worker of the
// same id.
func TestStaticWorkerTakesDirectoryLayout(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	dir := dirClientFor(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dir,
		Static: []StaticWorker{{ID: "x", Address: "http://127.0.0.1:1", Model: "m"}, {ID: "y", Address: "http://127.0.0.1:2", Model: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- s.Run(rctx) }()
	defer func() { stop(); <-done }()

	reg, err := dir.Register(ctx, &kvdirv1.WorkerSpec{Id: "x", Address: "http://127.0.0.1:1", Model: "m", BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	pub := dir.NewPublisher("x", reg.Epoch)
	defer pub.Close()
	if _, err := pub.Send(ctx, []*kvdirv1.Event{{Kind: &kvdirv1.Event_Layout{Layout: &kvdirv1.WorkerLayout{BlockSizes: []uint32{64}}}}}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "static worker x to take block size 64", func() (bool, string) {
		w := s.pool.snapshot()["x"]
		return w != nil && s.blockSizeOf(w) == 64, ""
	})
	if bs := s.blockSizeOf(s.pool.snapshot()["y"]); bs != DefaultBlockSize {
		t.Fatalf("static worker y without a directory worker: block size %d, want %d", bs, DefaultBlockSize)
	}
}
