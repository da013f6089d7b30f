package agent

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// One engine event naming more blocks than the directory takes in one
// piece (a 70k-token prompt at block size 1 is 70k blocks) is cut and
// indexed whole, and an undecodable batch is skipped and counted: neither
// makes the agent register again, which would empty the worker's view.
func TestLongEventAndUndecodableBatchKeepTheView(t *testing.T) {
	r := newRig(t)
	r.startAgent()
	epoch := r.agent.Epoch()
	const n = 70_000
	long := &kvevents.BlockStored{TokenIDs: tokens(n*itBS, 3), BlockSize: itBS, Medium: "GPU"}
	for i := range n {
		long.BlockHashes = append(long.BlockHashes, eh(uint64(i+1)*1_000_003))
	}
	if _, err := r.pub.Publish(batch(long)); err != nil {
		t.Fatal(err)
	}
	blocks := func(want uint64) func() (bool, string) {
		return func() (bool, string) {
			w, ok := r.nodes[0].FSM().Worker(itWorker)
			if !ok {
				return false, "worker unknown"
			}
			return w.Blocks == want && w.Epoch == epoch, fmt.Sprintf("%d blocks at epoch %d", w.Blocks, w.Epoch)
		}
	}
	testkit.Eventually(t, 20*time.Second, "the long event to be indexed at the first epoch", blocks(n))

	// 0xc1 is never used in msgpack.
	if _, err := r.pub.PublishPayload([]byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	last := long.BlockHashes[n-1]
	next := &kvevents.BlockStored{Parent: &last, TokenIDs: tokens(itBS, 99), BlockSize: itBS, Medium: "GPU",
		BlockHashes: []kvevents.Hash{eh(7)}}
	if _, err := r.pub.Publish(batch(next)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the next event to add to the view", blocks(n+1))
	if v := metricValue(t, r.agent, "kvdir_agent_decode_errors_total", ""); v < 1 {
		t.Fatalf("decode errors %v, want the undecodable batch counted", v)
	}
	if e := r.agent.Epoch(); e != epoch {
		t.Fatalf("epoch %d, want %d: the agent registered again", e, epoch)
	}
}

// Cut pieces keep the chain (each parent is the last block before it) and
// the medium; chunks respect both bounds and keep the order.
func TestSplitPiecesAndChunks(t *testing.T) {
	ev := &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{
		Parent: 9, Hashes: []uint64{1, 2, 3, 4, 5}, Medium: kvdirv1.Medium_MEDIUM_CPU}}}
	got := splitPieces([]*kvdirv1.Event{ev}, 2)
	parents, hashes := storedHashes(got)
	if len(got) != 3 || !slices.Equal(parents, []uint64{9, 2, 4}) || !slices.Equal(hashes, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("pieces: parents %v hashes %v (%d events)", parents, hashes, len(got))
	}
	for _, e := range got {
		if e.GetStored().Medium != kvdirv1.Medium_MEDIUM_CPU {
			t.Fatalf("piece lost its medium: %v", e)
		}
	}
	chunks := chunkBatches(got, 10, 4)
	if len(chunks) != 2 || len(chunks[0]) != 2 || len(chunks[1]) != 1 {
		t.Fatalf("chunks by blocks: %v", chunks)
	}
	if chunks := chunkBatches(got, 1, 100); len(chunks) != 3 {
		t.Fatalf("chunks by events: %d, want 3", len(chunks))
	}
}
