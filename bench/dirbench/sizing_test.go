package dirbench

import (
	"testing"

	"github.com/kvdir/kvdir/internal/costmodel"
)

// TestSizingEventRates derives from the engine timing model (the built-in
// H200 profiles) the block events per second one busy replica sends the
// directory, the input of the directory's sizing notes: a replica computing
// prefill back to back (2,048-token chunks, no cached prefix) stores
// tokens/16 blocks a second and, with its cache full, evicts as many; one
// decoding a batch of 128 sequences of 4,096 tokens fills a block every 16
// tokens of each. Run with -v for the figures.
func TestSizingEventRates(t *testing.T) {
	const block, chunk, batch, ctx = 16, 2048, 128, 4096
	for _, name := range []string{"llama3-8b", "llama3-70b"} {
		p, err := costmodel.ProfileByName(name)
		if err != nil {
			t.Fatal(err)
		}
		prefillMs := p.Prefill.Millis(chunk, 0)
		prefill := chunk / prefillMs * 1000
		decodeMs := p.Decode.Millis(batch, batch*ctx)
		decode := batch / decodeMs * 1000
		// Stored plus removed: at steady state every stored block evicts one.
		prefillEvents, decodeEvents := 2*prefill/block, 2*decode/block
		t.Logf("%-10s prefill %4.0f ms per %d tokens = %6.0f tokens/s -> %5.0f block events/s; decode batch %d x %d: %4.1f ms/step = %5.0f tokens/s -> %4.0f block events/s",
			name, prefillMs, chunk, prefill, prefillEvents, batch, ctx, decodeMs, decode, decodeEvents)
		if prefillEvents <= decodeEvents || prefillEvents <= 0 {
			t.Errorf("%s: prefill %v events/s, decode %v: prefill must be the busier", name, prefillEvents, decodeEvents)
		}
	}
}
