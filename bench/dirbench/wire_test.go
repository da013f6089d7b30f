package dirbench

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestFollowWireBytes measures what one block event costs on a router's
// Follow stream (a FollowResponse carrying the committed entry exactly as
// the state machine applied it), for batches shaped as agents send them,
// and checks the wire format's floor: 8 bytes per hash (packed fixed64)
// once pieces are long, and a bounded overhead per batch. Run with -v for
// the table the directory's sizing notes quote.
func TestFollowWireBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	hashes := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = r.Uint64()
		}
		return out
	}
	for _, c := range []struct {
		batches, pieces, perPiece int
		maxPerEvent               float64
	}{
		{1, 1, 1, 100},    // one decode block, alone in its entry
		{64, 1, 1, 60},    // 64 engines' single blocks in one group commit
		{1, 1, 16, 16},    // a 256-token piece
		{64, 2, 8, 12},    // 64 engines storing and evicting 8 blocks each
		{1, 1, 256, 8.5},  // a 4,096-token prefill
		{8, 1, 256, 8.25}, // eight of them in one group commit
	} {
		cmd := &kvdirv1.PublishCommand{}
		events := 0
		for b := range c.batches {
			eb := &kvdirv1.EventBatch{WorkerId: fmt.Sprintf("engine-%04d", b), Epoch: 1234567, FirstSeq: 987654, LastSeq: 987654 + uint64(c.pieces) - 1}
			for p := range c.pieces {
				ev := &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Parent: r.Uint64(), Hashes: hashes(c.perPiece)}}}
				if p%2 == 1 {
					ev = &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: hashes(c.perPiece)}}}
				}
				eb.Events = append(eb.Events, ev)
				events += c.perPiece
			}
			cmd.Batches = append(cmd.Batches, eb)
		}
		data, err := raftfsm.Encode(kvdirv1.CommandType_COMMAND_TYPE_PUBLISH, cmd, 1_700_000_000_000_000_000)
		if err != nil {
			t.Fatal(err)
		}
		resp := &kvdirv1.FollowResponse{CommitIndex: 123456789, Payload: &kvdirv1.FollowResponse_Entries{Entries: &kvdirv1.FollowEntries{
			Entries: []*kvdirv1.FollowEntry{{Index: 123456789, Term: 12, Data: data}}}}}
		n := proto.Size(resp)
		per := float64(n) / float64(events)
		t.Logf("%2d batches x %d pieces x %3d hashes = %4d events: entry %5d B, Follow message %5d B, %.2f B/event", c.batches, c.pieces, c.perPiece, events, len(data), n, per)
		if per < 8 || per > c.maxPerEvent {
			t.Errorf("%d batches x %d pieces x %d hashes: %.2f B/event, want 8 to %v", c.batches, c.pieces, c.perPiece, per, c.maxPerEvent)
		}
	}
}
