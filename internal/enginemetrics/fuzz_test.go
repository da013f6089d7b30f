package enginemetrics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseTRTLLM feeds arbitrary bodies to the JSON path: no panic, and a
// load it accepts is within bounds.
func FuzzParseTRTLLM(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "trtllm_iteration_stats.json")); err == nil {
		f.Add(string(b))
	}
	f.Add(`[]`)
	f.Add(`{"numActiveRequests": 1e999}`)
	f.Add(`[{"kvCacheStats": {"maxNumBlocks": -1, "usedNumBlocks": 5, "tokensPerBlock": 1e308, "reusedBlocks": 1e308}}]`)
	f.Add(`[{"numQueuedRequests": null, "kvCacheStats": null}]`)
	f.Fuzz(func(t *testing.T, body string) {
		for _, o := range []Options{{}, {Kind: KindTRTLLM, Force: true}, {Kind: KindTRTLLM, Force: true, ByRank: true}} {
			l, err := ParseWith(strings.NewReader(body), o)
			if err != nil {
				continue
			}
			if l.Running < 0 || l.Waiting < 0 || l.KVUsage < 0 || l.KVUsage > 1 || l.HitRate < 0 || l.HitRate > 1 {
				t.Fatalf("out of bounds: %+v", l)
			}
		}
	})
}
