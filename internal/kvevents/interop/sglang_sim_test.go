package interop

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
)

// TestSimulatorSGLangEncoding checks that enginesim's SGLang encoding
// (simengine.EncodeSGLangBatch) writes every sglang_* payload of
// testdata/engine_shapes.py byte for byte: the legacy array layout for
// sglang_* and the tagged-map layout for sglang_map_*.
func TestSimulatorSGLangEncoding(t *testing.T) {
	if testing.Short() {
		t.Skip("starts /usr/bin/python3 (Debian's python3-msgpack); skipped under -short")
	}
	got := pythonShapes(t)
	n := 0
	for name, c := range shapeCases(t) {
		if !strings.HasPrefix(name, "sglang_") {
			continue
		}
		n++
		form := kvevents.FormArray
		if strings.HasPrefix(name, "sglang_map_") {
			form = kvevents.FormMap
		}
		t.Run(name, func(t *testing.T) {
			enc, err := simengine.EncodeSGLangBatch(c.want, form)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, got[name]) {
				t.Fatalf("%v encoding differs from Python's:\n got %x\nwant %x", form, enc, got[name])
			}
		})
	}
	if n < 5 {
		t.Fatalf("only %d sglang_* cases", n)
	}
}
