package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvdir/kvdir/internal/testkit"
)

func TestEndpointRules(t *testing.T) {
	binds := map[string]bool{
		"tcp://*:5557":          true,
		"tcp://[::]:5557":       true,
		"ipc:///tmp/kv.sock":    true,
		"inproc://cache":        true,
		"tcp://router-svc:5557": false,
		"tcp://127.0.0.1:5557":  false,
		"tcp://10.0.0.1:5557":   false,
	}
	for ep, want := range binds {
		if got := PublisherBinds(ep); got != want {
			t.Errorf("PublisherBinds(%q) = %v", ep, got)
		}
	}
	offsets := []struct {
		ep   string
		rank int
		want string
		err  bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 2, "tcp://*:5559", false},
		{"tcp://router-svc:6000", 1, "tcp://router-svc:6001", false},
		{"inproc://cache", 3, "inproc://cache_dp3", false},
		{"ipc:///tmp/x", 1, "", true},
		{"tcp://host:port", 1, "", true},
		{"", 4, "", false},
	}
	for _, tc := range offsets {
		got, err := OffsetEndpoint(tc.ep, tc.rank)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("OffsetEndpoint(%q, %d) = %q, %v", tc.ep, tc.rank, got, err)
		}
	}
}

func TestParseFrames(t *testing.T) {
	seq := seqBytes(42)
	if m, err := ParseLive([][]byte{[]byte("t"), seq, {1}}); err != nil || m.Seq != 42 || m.Topic != "t" {
		t.Fatalf("ParseLive = %+v, %v", m, err)
	}
	for _, frames := range [][][]byte{{seq, {1}}, {{}, seq[:4], {1}}, {{}, seq, {1}, {2}}} {
		if _, err := ParseLive(frames); !errors.Is(err, ErrBadFrames) {
			t.Errorf("ParseLive(%d frames) err = %v", len(frames), err)
		}
	}
	end := seqBytes(EndSeq)
	replays := []struct {
		frames [][]byte
		msg    Msg
		end    bool
		bad    bool
	}{
		{frames: [][]byte{{}, seq, {7}}, msg: Msg{Seq: 42, Payload: []byte{7}}},
		{frames: [][]byte{{}, []byte("kv"), seq, {7}}, msg: Msg{Topic: "kv", Seq: 42, Payload: []byte{7}}},
		{frames: [][]byte{{}, end, {}}, end: true},
		{frames: [][]byte{{}, {}, end, {}}, end: true},
		{frames: [][]byte{{}, seq, {}}, end: true}, // an empty last frame ends the stream
		{frames: [][]byte{seq, {7}}, bad: true},
		{frames: [][]byte{{}, {7}}, bad: true},
		{frames: [][]byte{{}, seq[:7], {7}}, bad: true},
		{frames: [][]byte{{}, {}, {}, seq, {7}}, bad: true},
	}
	for i, tc := range replays {
		m, end, err := parseReplay(tc.frames)
		if tc.bad != errors.Is(err, ErrBadFrames) || end != tc.end || !reflect.DeepEqual(m, tc.msg) {
			t.Errorf("case %d: parseReplay = %+v, %v, %v", i, m, end, err)
		}
	}
	for _, tc := range []struct {
		b  []byte
		v  uint64
		ok bool
	}{{nil, 0, true}, {seq, 42, true}, {append([]byte{0}, seq...), 42, true}, {append([]byte{1}, seq...), 0, false}, {[]byte{1, 0}, 256, true}} {
		if v, ok := startSeq(tc.b); v != tc.v || ok != tc.ok {
			t.Errorf("startSeq(%x) = %d, %v", tc.b, v, ok)
		}
	}
}

func portOf(t *testing.T, a net.Addr) int {
	t.Helper()
	if a == nil {
		t.Fatal("socket is not bound")
	}
	return a.(*net.TCPAddr).Port
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newPub(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newSub(t *testing.T, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitJoined defeats ZMQ's slow-joiner effect: it publishes probe batches
// until one reaches the subscriber, and returns the first sequence number
// that is not a probe. Messages below it must be ignored by the caller.
func waitJoined(t *testing.T, p *Publisher, s *Subscriber) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := p.Publish(Batch{TS: -1}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Millisecond)
		_, err := s.Recv(ctx)
		cancel()
		if err == nil {
			return p.NextSeq()
		}
	}
	t.Fatal("subscription never took effect")
	return 0
}

// recvFrom receives the next message with seq >= from.
func recvFrom(t *testing.T, s *Subscriber, from uint64) Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		m, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if m.Seq >= from {
			return m
		}
	}
}

func testBatch(i int) Batch {
	return Batch{TS: float64(i), Events: []Event{&BlockStored{
		BlockHashes: []Hash{HashFromUint64(uint64(i) << 40)},
		TokenIDs:    u32s(seqTokens(16, uint64(i))),
		BlockSize:   16,
		Medium:      "GPU",
	}}}
}

func checkStream(t *testing.T, p *Publisher, s *Subscriber, topic string, n int) {
	t.Helper()
	from := waitJoined(t, p, s)
	for i := range n {
		seq, err := p.Publish(testBatch(i))
		if err != nil || seq != from+uint64(i) {
			t.Fatalf("publish %d: seq %d, %v", i, seq, err)
		}
	}
	for i := range n {
		m := recvFrom(t, s, from)
		if m.Seq != from+uint64(i) || m.Topic != topic {
			t.Fatalf("message %d: seq %d topic %q, want seq %d", i, m.Seq, m.Topic, from+uint64(i))
		}
		b, _, err := DecodeBatch(m.Payload)
		if err != nil {
			t.Fatal(err)
		}
		want := testBatch(i)
		want.DPRank = ptr(0)
		if !reflect.DeepEqual(b, want) {
			t.Fatalf("message %d: batch %#v", i, b)
		}
	}
}

// The engine binds (tcp://*:port): the subscriber connects, and may start
// first, since connecting is asynchronous and retried.
func TestPubSubPublisherBinds(t *testing.T) {
	port := testkit.Port(testkit.FreeAddrs(t, 1)[0])
	sub := newSub(t, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Topic: "kv@"})
	if sub.Addr() != nil {
		t.Fatal("subscriber bound, want connect")
	}
	pub := newPub(t, PublisherConfig{Endpoint: fmt.Sprintf("tcp://*:%d", port), Topic: "kv@10.0.0.7@llama", Form: FormMap})
	if portOf(t, pub.Addr()) != port {
		t.Fatalf("publisher bound to %v", pub.Addr())
	}
	checkStream(t, pub, sub, "kv@10.0.0.7@llama", 20)
}

// The engine connects (tcp://host:port, no wildcard): the router binds a
// SUB socket there.
func TestPubSubPublisherConnects(t *testing.T) {
	sub := newSub(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true})
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, sub.Addr()))
	if PublisherBinds(ep) {
		t.Fatal("rule says bind")
	}
	pub := newPub(t, PublisherConfig{Endpoint: ep, Form: FormArray})
	if pub.Addr() != nil {
		t.Fatal("publisher bound, want connect")
	}
	checkStream(t, pub, sub, "", 20)
}

// With Bind the engine binds a loopback address, which PublisherBinds
// alone would connect to: it listens on 127.0.0.1 only, and a subscriber
// connects.
func TestPubSubPublisherBindsLoopback(t *testing.T) {
	port := testkit.Port(testkit.FreeAddrs(t, 1)[0])
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	pub := newPub(t, PublisherConfig{Endpoint: ep, Bind: true, Form: FormMap})
	a, ok := pub.Addr().(*net.TCPAddr)
	if !ok || a.Port != port || !a.IP.IsLoopback() {
		t.Fatalf("publisher bound to %v, want 127.0.0.1:%d", pub.Addr(), port)
	}
	sub := newSub(t, SubscriberConfig{Endpoint: ep})
	checkStream(t, pub, sub, "", 20)
}

func TestTopicPrefixFilter(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "tcp://*:0", Topic: "kv@a"})
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.Addr()))
	match := newSub(t, SubscriberConfig{Endpoint: ep, Topic: "kv@"})
	other := newSub(t, SubscriberConfig{Endpoint: ep, Topic: "kv@b"})
	from := waitJoined(t, pub, match)
	for i := range 5 {
		if _, err := pub.Publish(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		recvFrom(t, match, from)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if m, err := other.Recv(ctx); err == nil {
		t.Fatalf("non-matching subscriber got %+v", m)
	}
}

func TestReplayLayouts(t *testing.T) {
	for _, layout := range []ReplayLayout{ReplayLayoutOld, ReplayLayoutNew} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) {
			pub := newPub(t, PublisherConfig{
				Endpoint:       fmt.Sprintf("inproc://kvevents-replay-%d", layout),
				ReplayEndpoint: "tcp://127.0.0.1:0",
				Topic:          "kv@pod",
				ReplayLayout:   layout,
				BufferSteps:    4,
			})
			var payloads [][]byte
			for i := range 6 {
				b := testBatch(i)
				b.DPRank = ptr(0)
				payloads = append(payloads, EncodeBatch(b, FormArray))
				if _, err := pub.Publish(testBatch(i)); err != nil {
					t.Fatal(err)
				}
			}
			ep := fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.ReplayAddr()))
			wantTopic := ""
			if layout == ReplayLayoutNew {
				wantTopic = "kv@pod"
			}
			for _, tc := range []struct {
				from uint64
				seqs []uint64
			}{{3, []uint64{3, 4, 5}}, {0, []uint64{2, 3, 4, 5}}, {6, nil}, {EndSeq - 1, nil}} {
				msgs, err := Replay(testCtx(t), ep, tc.from)
				if err != nil {
					t.Fatalf("replay from %d: %v", tc.from, err)
				}
				var seqs []uint64
				for _, m := range msgs {
					seqs = append(seqs, m.Seq)
					if m.Topic != wantTopic || !bytes.Equal(m.Payload, payloads[m.Seq]) {
						t.Fatalf("replayed %d: topic %q payload %x", m.Seq, m.Topic, m.Payload)
					}
				}
				if !reflect.DeepEqual(seqs, tc.seqs) {
					t.Fatalf("replay from %d: seqs %v, want %v", tc.from, seqs, tc.seqs)
				}
			}
			if st := pub.Stats(); st.ReplayRequests != 4 || st.Replayed != 7 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// A subscriber that misses messages finds the gap and fills it by replay;
// a batch whose send "failed" (DropRate) is gone for good, as in vLLM.
func TestReplayAfterMissedMessages(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0", ReplayLayout: ReplayLayoutNew, Topic: "t"})
	sub := newSub(t, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.Addr()))})
	from := waitJoined(t, pub, sub)
	publish := func(i int) uint64 {
		seq, err := pub.Publish(testBatch(i))
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	a := publish(0)
	pub.SetLossRate(1)
	publish(1)
	publish(2)
	pub.SetLossRate(0)
	pub.SetDropRate(1)
	publish(3)
	pub.SetDropRate(0)
	e := publish(4)

	got := recvFrom(t, sub, from)
	if got.Seq != a {
		t.Fatalf("first seq %d, want %d", got.Seq, a)
	}
	got = recvFrom(t, sub, from)
	if got.Seq != e || got.Seq == a+1 {
		t.Fatalf("second seq %d, want %d (a gap)", got.Seq, e)
	}
	msgs, err := Replay(testCtx(t), fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.ReplayAddr())), a+1)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
		b, _, err := DecodeBatch(m.Payload)
		if err != nil || b.TS != float64(m.Seq-a) {
			t.Fatalf("replayed %d: %+v %v", m.Seq, b, err)
		}
	}
	if want := []uint64{a + 1, a + 2, a + 4}; !reflect.DeepEqual(seqs, want) {
		t.Fatalf("replayed %v, want %v", seqs, want)
	}
	if st := pub.Stats(); st.Lost != 2 || st.Dropped != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestartAndClose(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "inproc://kvevents-restart", ReplayEndpoint: "tcp://127.0.0.1:0"})
	for i := range 3 {
		if _, err := pub.Publish(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	pub.Restart()
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.ReplayAddr()))
	if msgs, err := Replay(testCtx(t), ep, 0); err != nil || len(msgs) != 0 {
		t.Fatalf("replay after restart: %v %v", msgs, err)
	}
	if seq, err := pub.Publish(testBatch(0)); err != nil || seq != 0 {
		t.Fatalf("seq after restart %d %v", seq, err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(testBatch(0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Replay(ctx, ep, 0); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("replay to a closed publisher: %v after %v", err, time.Since(start))
	}

	sub := newSub(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("recv after close: %v", err)
	}
	if _, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "udp://x"}); err == nil {
		t.Fatal("bad endpoint accepted")
	}
}

// Malformed live messages are reported by Recv and do not stop the stream.
func TestSubscriberMalformedFrames(t *testing.T) {
	ctx := testCtx(t)
	raw := zmq4.NewPub(ctx)
	t.Cleanup(func() { _ = raw.Close() })
	if err := raw.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	sub := newSub(t, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, raw.Addr()))})
	send := func(frames ...[]byte) {
		if err := raw.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	joined := false
	for deadline := time.Now().Add(10 * time.Second); !joined && time.Now().Before(deadline); {
		send([]byte("p"), seqBytes(0), []byte{0x90})
		rctx, cancel := context.WithTimeout(ctx, 25*time.Millisecond)
		_, err := sub.Recv(rctx)
		cancel()
		joined = err == nil
	}
	if !joined {
		t.Fatal("subscription never took effect")
	}
	send([]byte("x"), []byte{1})                     // 2 frames
	send([]byte("x"), []byte{0, 0, 0, 9}, []byte{1}) // 4-byte seq
	send([]byte("x"), seqBytes(9), []byte{2})        // good
	bad := 0
	for {
		m, err := sub.Recv(ctx)
		if errors.Is(err, ErrBadFrames) {
			bad++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Topic == "x" {
			if m.Seq != 9 || bad != 2 {
				t.Fatalf("got %+v after %d bad messages", m, bad)
			}
			break
		}
	}
	if st := sub.Stats(); st.Malformed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A replay request without the delimiter frame is ignored, as vLLM does,
// and a well-formed request from a raw DEALER is answered.
func TestReplayRequestFraming(t *testing.T) {
	pub := newPub(t, PublisherConfig{Endpoint: "inproc://kvevents-framing", ReplayEndpoint: "tcp://127.0.0.1:0"})
	if _, err := pub.Publish(testBatch(0)); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	dealer := zmq4.NewDealer(ctx)
	t.Cleanup(func() { _ = dealer.Close() })
	if err := dealer.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, pub.ReplayAddr()))); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send(zmq4.NewMsg(seqBytes(0))); err != nil {
		t.Fatal(err)
	}
	var bad atomic.Bool
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if pub.Stats().BadReplayRequests == 1 {
			bad.Store(true)
			break
		}
	}
	if !bad.Load() {
		t.Fatalf("bad request not counted: %+v", pub.Stats())
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, seqBytes(0))); err != nil {
		t.Fatal(err)
	}
	var frames [][][]byte
	for {
		m, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, m.Frames)
		if len(m.Frames[len(m.Frames)-1]) == 0 {
			break
		}
	}
	want := [][][]byte{
		{{}, seqBytes(0), EncodeBatch(Batch{TS: 0, Events: testBatch(0).Events, DPRank: ptr(0)}, FormArray)},
		{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}},
	}
	if !reflect.DeepEqual(frames, want) {
		t.Fatalf("old-layout reply frames:\n%x\nwant\n%x", frames, want)
	}
}

// An engine restart: the bound publisher goes away and comes back on the
// same port with its sequence back at 0; the connecting subscriber
// reconnects by itself.
func TestSubscriberReconnectsAfterEngineRestart(t *testing.T) {
	port := testkit.Port(testkit.FreeAddrs(t, 1)[0])
	ep := fmt.Sprintf("tcp://*:%d", port)
	sub := newSub(t, SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)})
	pub := newPub(t, PublisherConfig{Endpoint: ep})
	waitJoined(t, pub, sub)
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	pub2 := newPub(t, PublisherConfig{Endpoint: ep})
	from := waitJoined(t, pub2, sub)
	if from > 1000 {
		t.Fatalf("unexpected seq %d", from)
	}
	if seq, err := pub2.Publish(testBatch(1)); err != nil || recvFrom(t, sub, from).Seq != seq {
		t.Fatalf("after restart: seq %d %v", seq, err)
	}
}

// The router's bound SUB socket restarts; the connecting engine-side
// publisher dials again by itself.
func TestPublisherReconnectsAfterRouterRestart(t *testing.T) {
	sub := newSub(t, SubscriberConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true})
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, sub.Addr()))
	pub := newPub(t, PublisherConfig{Endpoint: ep})
	waitJoined(t, pub, sub)
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	sub2 := newSub(t, SubscriberConfig{Endpoint: ep, Bind: true})
	from := waitJoined(t, pub, sub2)
	if seq, err := pub.Publish(testBatch(1)); err != nil || recvFrom(t, sub2, from).Seq != seq {
		t.Fatalf("after reconnect: seq %d %v", seq, err)
	}
}

func TestBindConflicts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := fmt.Sprintf("tcp://127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
	if _, err := NewSubscriber(context.Background(), SubscriberConfig{Endpoint: busy, Bind: true}); err == nil {
		t.Fatal("subscriber bound a busy port")
	}
	if _, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "inproc://kvevents-busy", ReplayEndpoint: busy}); err == nil {
		t.Fatal("publisher bound a busy replay port")
	}
	if _, err := Replay(context.Background(), "nope", 0); err == nil {
		t.Fatal("bad replay endpoint accepted")
	}
}

// An engine and its agent can share KV events over ipc:// sockets on a
// shared volume: the engine binds both, the agent connects, and replay
// works. Socket files left by an engine that was killed do not stop the
// next one from binding, while a live publisher's socket still refuses a
// second bind.
func TestIPCEndpointsSurviveAStaleSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvipc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	live, replay := filepath.Join(dir, "events.sock"), filepath.Join(dir, "replay.sock")
	for _, p := range []string{live, replay} {
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("stale socket %s not left behind: %v", p, err)
		}
	}
	pub := newPub(t, PublisherConfig{Endpoint: "ipc://" + live, ReplayEndpoint: "ipc://" + replay, ReplayLayout: ReplayLayoutNew, Topic: "kvdir"})
	sub := newSub(t, SubscriberConfig{Endpoint: "ipc://" + live, Topic: "kvdir"})
	checkStream(t, pub, sub, "kvdir", 5)
	msgs, err := Replay(testCtx(t), "ipc://"+replay, 0)
	if err != nil || len(msgs) < 5 {
		t.Fatalf("replay over ipc: %d messages, %v; want the 5 published and the probes", len(msgs), err)
	}
	if p2, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "ipc://" + live}); err == nil {
		p2.Close()
		t.Fatal("a second publisher bound a live publisher's ipc socket")
	}
}
