package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// frame returns a ZMTP 3.x frame with body of n bytes.
func frame(flags byte, n int) []byte {
	var b []byte
	if n > 255 || flags&flagLong != 0 {
		b = append([]byte{flags | flagLong}, binary.BigEndian.AppendUint64(nil, uint64(n))...)
	} else {
		b = []byte{flags, byte(n)}
	}
	return append(b, bytes.Repeat([]byte{'b'}, n)...)
}

func longHeader(flags byte, n uint64) []byte {
	return append([]byte{flags | flagLong}, binary.BigEndian.AppendUint64(nil, n)...)
}

func stream(parts ...[]byte) []byte {
	return bytes.Join(append([][]byte{make([]byte, zmtpGreetingLen)}, parts...), nil)
}

func TestFrameParser(t *testing.T) {
	ok1 := stream(frame(flagCommand, 30), frame(flagMore, 3), frame(flagMore, 300), frame(0, 90))
	tiB := stream(frame(flagCommand, 30), longHeader(flagCommand, 1<<40), []byte("xx"))
	multi := stream(frame(flagMore, 60), frame(flagMore, 60), frame(0, 60)) // 180 > 100 in one message
	cases := []struct {
		name string
		in   []byte
		max  uint64
		ok   int // bytes accepted; len(in) when no error
	}{
		{"valid", ok1, 1000, len(ok1)},
		{"at the limit", stream(frame(0, 100), frame(0, 100)), 100, 64 + 2*102},
		{"one tebibyte", tiB, 1 << 26, 64 + 32},
		{"message total", multi, 100, 64 + 62},
		{"command resets", stream(frame(flagCommand, 90), frame(0, 90)), 100, 64 + 2*92},
		{"greeting only", make([]byte, 64), 1, 64},
		{"huge in greeting is data", bytes.Repeat([]byte{0xff}, 64), 1, 64},
	}
	for _, tc := range cases {
		for _, chunk := range []int{1, 2, 7, 64, len(tc.in)} {
			p := newFrameParser(tc.max)
			got := 0
			var err error
			for off := 0; off < len(tc.in) && err == nil; off += chunk {
				end := min(off+chunk, len(tc.in))
				var n int
				n, err = p.feed(tc.in[off:end])
				if err == nil && n != end-off {
					t.Fatalf("%s/%d: fed %d, accepted %d without error", tc.name, chunk, end-off, n)
				}
				got += n
			}
			wantErr := tc.ok != len(tc.in)
			if (err != nil) != wantErr || (err != nil && !errors.Is(err, ErrFrameTooLarge)) {
				t.Fatalf("%s/%d: err %v, want error %v", tc.name, chunk, err, wantErr)
			}
			// With a header split across chunks, the bytes of the header
			// already handed over count as accepted.
			if got > tc.ok+8 || got < min(tc.ok, len(tc.in)) && chunk >= 9 {
				t.Fatalf("%s/%d: accepted %d bytes, want %d", tc.name, chunk, got, tc.ok)
			}
			if chunk == len(tc.in) && got != tc.ok {
				t.Fatalf("%s/whole: accepted %d bytes, want %d", tc.name, got, tc.ok)
			}
			if err != nil {
				if n, err2 := p.feed([]byte{0}); n != 0 || err2 == nil {
					t.Fatalf("%s/%d: parser recovered after an error", tc.name, chunk)
				}
			}
		}
	}
	many := stream(bytes.Repeat([]byte{flagMore, 0}, MaxFramesPerMessage+1))
	if _, err := newFrameParser(1 << 20).feed(many); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("%d empty frames in one message: err %v", MaxFramesPerMessage+1, err)
	}
}

// FuzzFrameParser checks that the parser never panics, never accepts more
// than it was given, and decides the same whatever the chunking.
func FuzzFrameParser(f *testing.F) {
	f.Add(stream(frame(flagCommand, 30), frame(flagMore, 300), frame(0, 2)), uint16(3), uint32(1000))
	f.Add(stream(longHeader(0, 1<<40)), uint16(1), uint32(1<<20))
	f.Add(stream(bytes.Repeat([]byte{flagMore, 0}, 10)), uint16(5), uint32(4))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16, max uint32) {
		if max == 0 {
			max = 1
		}
		whole := newFrameParser(uint64(max))
		wn, werr := whole.feed(data)
		if wn < 0 || wn > len(data) || (werr == nil) != (wn == len(data)) {
			t.Fatalf("whole: accepted %d of %d, err %v", wn, len(data), werr)
		}
		c := int(chunk%97) + 1
		p := newFrameParser(uint64(max))
		var err error
		for off := 0; off < len(data) && err == nil; off += c {
			var n int
			n, err = p.feed(data[off:min(off+c, len(data))])
			if n < 0 || n > min(c, len(data)-off) {
				t.Fatalf("chunk accepted %d of %d", n, c)
			}
		}
		if (err == nil) != (werr == nil) {
			t.Fatalf("chunked err %v, whole err %v", err, werr)
		}
	})
}

// oversizedAttack sends an oversized frame header to addr (before and
// after the handshake) and checks the counter moves and the server hangs up.
func oversizedAttack(t *testing.T, addr, sockType string) {
	t.Helper()
	for _, st := range []string{"", sockType} {
		before := OversizedMessages()
		if err := testkit.SendOversizedZMTP(addr, st, 1<<40, 10*time.Second); err != nil {
			t.Fatalf("handshake %q: %v", st, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for OversizedMessages() == before {
			if time.Now().After(deadline) {
				t.Fatalf("handshake %q: oversized message not counted", st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// A bound subscriber survives a peer declaring a 1 TiB message and then
// serves a real publisher.
func TestSubscriberRefusesOversizedMessage(t *testing.T) {
	sub := newSub(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, MaxMessageBytes: 1 << 20})
	addr := sub.Addr().String()
	oversizedAttack(t, addr, "PUB")
	pub := newPub(t, PublisherConfig{Endpoint: fmt.Sprintf("tcp://%s", addr)})
	from := waitJoined(t, pub, sub)
	if seq, err := pub.Publish(testBatch(1)); err != nil || recvFrom(t, sub, from).Seq != seq {
		t.Fatalf("after the attack: seq %d %v", seq, err)
	}
}

// A bound publisher (PUB and replay ROUTER) survives the same, and a real
// subscriber and replay client work afterwards.
func TestPublisherRefusesOversizedMessage(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	pubAddr := fmt.Sprintf("127.0.0.1:%d", portOf(t, pub.Addr()))
	oversizedAttack(t, pubAddr, "SUB")
	oversizedAttack(t, pub.ReplayAddr().String(), "DEALER")
	sub := newSub(t, SubscriberConfig{Endpoint: "tcp://" + pubAddr})
	from := waitJoined(t, pub, sub)
	seq, err := pub.Publish(testBatch(1))
	if err != nil || recvFrom(t, sub, from).Seq != seq {
		t.Fatalf("after the attack: seq %d %v", seq, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := Replay(ctx, fmt.Sprintf("tcp://%s", pub.ReplayAddr()), seq)
	if err != nil || len(msgs) != 1 || msgs[0].Seq != seq {
		t.Fatalf("replay after the attack: %d messages, %v", len(msgs), err)
	}
}

// A replay client refuses a reply over its limit instead of allocating it.
func TestReplayRefusesOversizedReply(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "inproc://kvevents-oversized-replay", ReplayEndpoint: "tcp://127.0.0.1:0"})
	big := testBatch(1)
	big.Events[0].(*BlockStored).TokenIDs = make([]uint32, 4096)
	if _, err := pub.Publish(big); err != nil {
		t.Fatal(err)
	}
	before := OversizedMessages()
	var hooked atomic.Uint64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	msgs, err := ReplayLimited(ctx, fmt.Sprintf("tcp://%s", pub.ReplayAddr()), 0, Limits{MaxMessageBytes: 1024, OnOversized: func() { hooked.Add(1) }})
	if err == nil || len(msgs) != 0 {
		t.Fatalf("oversized reply accepted: %d messages, %v", len(msgs), err)
	}
	if OversizedMessages() == before || hooked.Load() != 1 {
		t.Fatalf("oversized reply not counted: hook called %d times", hooked.Load())
	}
}
