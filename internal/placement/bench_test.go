package placement

import (
	"fmt"
	"testing"
)

func BenchmarkPick64(b *testing.B) {
	cands := workers(64)
	for i := range cands {
		cands[i].MatchedBlocks = (i * 37) % 300
		cands[i].Load = Load{Running: i % 17, Waiting: i % 3, KVUsage: float64(i%10) / 10, QueuedPrefillTokens: (i * 311) % 8000, InFlight: i % 5}
	}
	req := Request{SessionKey: "session-42", PromptTokens: 5100, BlockSize: 16}
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			p := mustNew(b, name, Options{Seed: 1})
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprint("session-", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.SessionKey = keys[i&1023]
				i++
				if _, err := p.Pick(req, cands); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
