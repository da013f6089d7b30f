package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
)

// The simulator's bound PUB and replay ROUTER sockets survive a peer that
// declares a 1 TiB message, count it, and then serve a real subscriber
// and a replay.
func TestOversizedMessageRefused(t *testing.T) {
	s := startSim(t, "--time-scale", "0", "--kv-events-endpoint", "tcp://*:0",
		"--kv-events-replay-endpoint", "tcp://127.0.0.1:0", "--kv-events-max-message-bytes", "1048576")
	_, port, err := net.SplitHostPort(s.srv.EventsAddr())
	if err != nil {
		t.Fatal(err)
	}
	pubAddr := net.JoinHostPort("127.0.0.1", port)
	attacks := 0
	for _, target := range []struct{ addr, sockType string }{
		{pubAddr, ""}, {pubAddr, "SUB"}, {s.srv.ReplayAddr(), ""}, {s.srv.ReplayAddr(), "DEALER"},
	} {
		if err := testkit.SendOversizedZMTP(target.addr, target.sockType, 1<<40, 10*time.Second); err != nil {
			t.Fatalf("attack on %s as %q: %v", target.addr, target.sockType, err)
		}
		attacks++
		testkit.Eventually(t, 5*time.Second, "the oversized message to be counted", func() (bool, string) {
			v := s.metric(t, "kvdir_enginesim_zmtp_oversized_total")
			return v >= float64(attacks), fmt.Sprint(v)
		})
	}

	sub, err := kvevents.NewSubscriber(context.Background(), kvevents.SubscriberConfig{Endpoint: "tcp://" + pubAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	s.syncEvents(t, sub)
	s.postOK(t, "/v1/completions", map[string]any{"prompt": strings.Repeat("tok ", 64), "max_tokens": 2}, nil)
	got := drain(t, sub, 300*time.Millisecond)
	if len(got) == 0 {
		t.Fatal("no events after the attack")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	replayed, err := kvevents.Replay(ctx, "tcp://"+s.srv.ReplayAddr(), 0)
	if err != nil || len(replayed) == 0 || replayed[len(replayed)-1].Seq != got[len(got)-1].Seq {
		t.Fatalf("replay after the attack: %d msgs, %v", len(replayed), err)
	}
}
