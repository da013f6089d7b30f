package agent

import (
	"log/slog"
	"testing"

	"github.com/kvdir/kvdir/internal/kvevents"
)

// FuzzTranslate feeds arbitrary payloads through the decoder and the
// translator: the agent must never panic on engine input.
func FuzzTranslate(f *testing.F) {
	p := kvevents.HashFromUint64(1)
	f.Add(kvevents.EncodeBatch(batch(stored(nil, tokens(testBS, 1), 1)), kvevents.FormArray))
	f.Add(kvevents.EncodeBatch(batch(stored(&p, tokens(2*testBS, 1), 2, 3),
		&kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{p}}, &kvevents.AllBlocksCleared{}), kvevents.FormMap))
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00})
	for _, b := range shapeBatches() {
		f.Add(kvevents.EncodeBatch(b, kvevents.FormArray))
		f.Add(kvevents.EncodeBatch(b, kvevents.FormMap))
	}
	tr := NewTranslator("m", 64, slog.New(slog.DiscardHandler))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, _, err := kvevents.DecodeBatch(data)
		if err != nil {
			return
		}
		evs, n := tr.Translate(nil, b)
		if n < 0 || (n > 0 && len(evs) == 0) {
			t.Fatalf("n=%d with %d events", n, len(evs))
		}
		if tr.Len() > 64 {
			t.Fatalf("map grew to %d", tr.Len())
		}
	})
}
