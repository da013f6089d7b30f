package simengine

import "github.com/kvdir/kvdir/internal/kvevents"

// WireEvents converts engine events to vLLM's wire form (kvevents), as the
// engine simulator publishes them and the benchmark simulator feeds them to
// the agent's translator. Engine block hashes become 8-byte wire hashes.
func WireEvents(evs []Event) []kvevents.Event {
	out := make([]kvevents.Event, 0, len(evs))
	for _, ev := range evs {
		switch e := ev.(type) {
		case *BlockStored:
			ws := &kvevents.BlockStored{
				BlockHashes: wireHashes(e.BlockHashes), TokenIDs: e.TokenIDs,
				BlockSize: e.BlockSize, Medium: e.Medium, LoRAName: e.LoRAName,
			}
			if e.HasParent {
				h := kvevents.HashFromUint64(uint64(e.ParentBlockHash))
				ws.Parent = &h
			}
			out = append(out, ws)
		case *BlockRemoved:
			out = append(out, &kvevents.BlockRemoved{BlockHashes: wireHashes(e.BlockHashes), Medium: e.Medium})
		case *AllBlocksCleared:
			out = append(out, &kvevents.AllBlocksCleared{})
		}
	}
	return out
}

func wireHashes(hs []BlockHash) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = kvevents.HashFromUint64(uint64(h))
	}
	return out
}
