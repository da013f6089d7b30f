package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
)

// With --kv-events-bind the simulator binds a loopback PUB endpoint, which
// the endpoint alone would make it connect to, and keeps the replay
// ROUTER on loopback too: a subscriber connecting there receives the
// events of a request and replays them.
func TestKVEventsBindLoopback(t *testing.T) {
	ports := testkit.FreePortRun(t, 2)
	pubEP, replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", ports), fmt.Sprintf("tcp://127.0.0.1:%d", ports+1)
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", pubEP, "--kv-events-bind", "--kv-events-replay-endpoint", replayEP)
	if got, want := s.srv.EventsAddr(), strings.TrimPrefix(pubEP, "tcp://"); got != want {
		t.Fatalf("events bound on %q, want %q", got, want)
	}
	if got, want := s.srv.ReplayAddr(), strings.TrimPrefix(replayEP, "tcp://"); got != want {
		t.Fatalf("replay bound on %q, want %q", got, want)
	}
	sub, err := kvevents.NewSubscriber(context.Background(), kvevents.SubscriberConfig{Endpoint: pubEP})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	s.syncEvents(t, sub)
	s.postOK(t, "/v1/completions", map[string]any{"prompt": strings.Repeat("tok ", 64), "max_tokens": 2}, nil)
	got := drain(t, sub, 300*time.Millisecond)
	stored := 0
	for _, m := range got {
		for _, e := range decode(t, m).Events {
			if _, ok := e.(*kvevents.BlockStored); ok {
				stored++
			}
		}
	}
	if stored == 0 {
		t.Fatalf("no BlockStored among %d batches", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	replayed, err := kvevents.Replay(ctx, replayEP, 0)
	if err != nil || len(replayed) == 0 || replayed[len(replayed)-1].Seq != got[len(got)-1].Seq {
		t.Fatalf("replay: %d batches, %v; want up to seq %d", len(replayed), err, got[len(got)-1].Seq)
	}
}
