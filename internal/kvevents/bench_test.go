package kvevents

import (
	"math/rand/v2"
	"testing"
)

// benchBatch builds a batch of events with blocksPerEvent 16-token blocks
// each, with realistic uint64 hashes and token ids up to 150k.
func benchBatch(events, blocksPerEvent int) Batch {
	rng := rand.New(rand.NewPCG(1, 2))
	b := Batch{TS: 1.7e9, DPRank: ptr(0)}
	for range events {
		ev := &BlockStored{BlockSize: 16, Medium: "GPU", Parent: ptr(HashFromUint64(rng.Uint64()))}
		for range blocksPerEvent {
			ev.BlockHashes = append(ev.BlockHashes, HashFromUint64(rng.Uint64()))
			for range 16 {
				ev.TokenIDs = append(ev.TokenIDs, uint32(rng.IntN(150000)))
			}
		}
		ev.ExtraKeys = make([][]any, blocksPerEvent)
		ev.GroupIdx = ptr(0)
		ev.SpecKind = SpecKindFullAttention
		b.Events = append(b.Events, ev)
	}
	return b
}

func benchDecode(b *testing.B, form Form, events, blocksPerEvent int) {
	data := EncodeBatch(benchBatch(events, blocksPerEvent), form)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var sink uint64
	blocks := 0
	for b.Loop() {
		batch, _, err := DecodeBatch(data)
		if err != nil {
			b.Fatal(err)
		}
		for _, ev := range batch.Events {
			if s, ok := ev.(*BlockStored); ok {
				for i, h := range s.BlockHashes {
					sink += h.Key()
					for _, tok := range s.TokenIDs[i*s.BlockSize : (i+1)*s.BlockSize] {
						sink += uint64(tok)
					}
					blocks++
				}
			}
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	_ = sink
}

func BenchmarkDecodeArray1Block(b *testing.B) { benchDecode(b, FormArray, 256, 1) }
func BenchmarkDecodeArray4Block(b *testing.B) { benchDecode(b, FormArray, 64, 4) }
func BenchmarkDecodeMap1Block(b *testing.B)   { benchDecode(b, FormMap, 256, 1) }
func BenchmarkDecodeMap4Block(b *testing.B)   { benchDecode(b, FormMap, 64, 4) }

func BenchmarkEncodeMap4Block(b *testing.B) {
	batch := benchBatch(64, 4)
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		buf = AppendBatch(buf[:0], batch, FormMap)
	}
	b.ReportMetric(float64(256*b.N)/b.Elapsed().Seconds(), "blocks/s")
}
