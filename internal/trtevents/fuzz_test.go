package trtevents

import (
	"testing"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// FuzzDecode checks that no body makes the decoder panic, and that what
// it returns keeps its invariants: events in wire order with their ids,
// stores whose tokens cover their blocks at the decoder's block size.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(fixtureSession), 4)
	f.Add([]byte(`[{"event_id":0,"data":{"type":"created"}},{}]`), 32)
	f.Add([]byte(`[{"event_id":1,"data":{"type":"removed","block_hashes":[1,-1,18446744073709551615]}}]`), 0)
	f.Add([]byte(`[{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":[{"block_hash":1,"tokens":[{"token_id":1,"token_extra_id":3}]}]}}]`), 0)
	f.Fuzz(func(t *testing.T, body []byte, bs int) {
		d := NewDecoder(bs % 1024)
		evs, st, err := d.Decode(body)
		if err != nil {
			if len(evs) != 0 {
				t.Fatalf("error with %d events", len(evs))
			}
			return
		}
		if len(evs) != st.Events {
			t.Fatalf("%d events, stats say %d", len(evs), st.Events)
		}
		for _, ev := range evs {
			s, ok := ev.Event.(*kvevents.BlockStored)
			if !ok {
				continue
			}
			if s.BlockSize < 1 || len(s.BlockHashes) == 0 || len(s.TokenIDs) != len(s.BlockHashes)*s.BlockSize {
				t.Fatalf("store of %d blocks of %d with %d tokens", len(s.BlockHashes), s.BlockSize, len(s.TokenIDs))
			}
			for _, x := range s.StrTokens {
				if x.Index < 0 || x.Index >= len(s.TokenIDs) {
					t.Fatalf("extra-id token at %d of %d", x.Index, len(s.TokenIDs))
				}
			}
		}
	})
}
