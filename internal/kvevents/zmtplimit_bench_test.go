package kvevents

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"
)

// BenchmarkIngest measures the agent's ingest path, a publisher's batches
// over loopback TCP into a Subscriber, with zmq4's plain transport and
// with the bounded one, side by side (compare the two with benchstat).
func BenchmarkIngest(b *testing.B) {
	for _, size := range []struct {
		name           string
		events, blocks int
	}{{"1x4blocks", 1, 4}, {"64x4blocks", 64, 4}} {
		payload := EncodeBatch(benchBatch(size.events, size.blocks), FormArray)
		for _, plain := range []bool{true, false} {
			name := "bounded"
			if plain {
				name = "plain"
			}
			b.Run(fmt.Sprintf("batch=%s/transport=%s", size.name, name), func(b *testing.B) {
				plainTransport = plain
				defer func() { plainTransport = false }()
				benchIngest(b, payload)
			})
		}
	}
}

func benchIngest(b *testing.B, payload []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := NewPublisher(ctx, PublisherConfig{Endpoint: "tcp://*:0", HWM: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	port := pub.Addr().(*net.TCPAddr).Port
	sub, err := NewSubscriber(ctx, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	// Probes until the subscription holds.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if time.Now().After(deadline) {
			b.Fatal("subscription never took effect")
		}
		if _, err := pub.PublishPayload(payload); err != nil {
			b.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 25*time.Millisecond)
		_, err := sub.Recv(rctx)
		rcancel()
		if err == nil {
			break
		}
	}
	for { // drain the probes
		rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := sub.Recv(rctx)
		rcancel()
		if err != nil {
			break
		}
	}
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	go func() {
		for range b.N {
			if _, err := pub.PublishPayload(payload); err != nil {
				return
			}
		}
	}()
	for i := range b.N {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := sub.Recv(rctx)
		rcancel()
		if err != nil {
			b.Fatalf("message %d of %d: %v", i, b.N, err)
		}
	}
}

// BenchmarkFrameParser measures the parser alone on a stream of 3-frame
// messages with 24 KiB payloads (64 events of 4 blocks), fed as zmq4 reads
// it: header, then body.
func BenchmarkFrameParser(b *testing.B) {
	payload := EncodeBatch(benchBatch(64, 4), FormArray)
	var msg [][]byte
	for _, f := range []struct {
		flags byte
		n     int
	}{{flagMore, 0}, {flagMore, 8}, {0, len(payload)}} {
		fr := frame(f.flags, f.n)
		hl := len(fr) - f.n
		msg = append(msg, fr[:hl], fr[hl:])
	}
	var size int
	for _, m := range msg {
		size += len(m)
	}
	p := newFrameParser(DefaultMaxMessageBytes)
	if _, err := p.feed(make([]byte, zmtpGreetingLen)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msg {
			if _, err := p.feed(m); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestLargestBatchUnderDefaultLimit measures the largest batch an engine
// plausibly sends in one step, and checks DefaultMaxMessageBytes leaves
// room above it: a 1M-token prefill (an unchunked long-context prompt)
// completing 65,536 16-token blocks, each with a 32-byte sha256 hash (the
// widest hash vLLM emits) and its token ids, plus as many blocks evicted
// to make room.
func TestLargestBatchUnderDefaultLimit(t *testing.T) {
	const tokens, bs = 1 << 20, 16
	stored := &BlockStored{BlockSize: bs, Medium: "GPU"}
	removed := &BlockRemoved{Medium: "GPU"}
	for i := range tokens / bs {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(i))
		h := sha256.Sum256(n[:])
		stored.BlockHashes = append(stored.BlockHashes, HashFromBytes(h[:]))
		h = sha256.Sum256(append(n[:], 'r'))
		removed.BlockHashes = append(removed.BlockHashes, HashFromBytes(h[:]))
		for j := range bs {
			stored.TokenIDs = append(stored.TokenIDs, uint32(100_000+(i*bs+j)%50_000)) // over 65,535: 5 bytes each in msgpack
		}
	}
	for _, form := range []Form{FormArray, FormMap} {
		size := len(EncodeBatch(Batch{TS: 1.7e9, Events: []Event{stored, removed}}, form))
		t.Logf("form %v: a 1M-token step encodes to %d bytes (%.1f MiB); limit %d MiB (%.1fx)",
			form, size, float64(size)/(1<<20), DefaultMaxMessageBytes>>20, float64(DefaultMaxMessageBytes)/float64(size))
		if size*4 > DefaultMaxMessageBytes {
			t.Errorf("the default limit leaves less than 4x headroom over a %d-byte batch", size)
		}
	}
}
