package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// An agent bound for its engine's events survives a peer that declares a
// 1 TiB message (during and after the handshake), counts it, and then
// indexes a real publisher's events.
func TestAgentRefusesOversizedMessage(t *testing.T) {
	nodes := dirtest.New(t, 1, nil).Nodes()
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{nodes[0].APIAddr()}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	addr := testkit.FreeAddrs(t, 1)[0]
	a, err := New(Config{
		WorkerID: itWorker, WorkerAddress: "http://127.0.0.1:1", Model: itModel, BlockSize: itBS,
		Endpoint: "tcp://" + addr, Bind: true, BatchInterval: 5 * time.Millisecond,
		Logger: testkit.Logger(t), HeartbeatInterval: 200 * time.Millisecond,
		MaxMessageBytes: 1 << 20,
	}, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent run: %v", err)
		}
	})
	testkit.Eventually(t, 10*time.Second, "the agent to register", func() (bool, string) { return a.Epoch() != 0, "" })

	for i, sockType := range []string{"", "PUB"} {
		if err := testkit.SendOversizedZMTP(addr, sockType, 1<<40, 10*time.Second); err != nil {
			t.Fatalf("attack %d: %v", i, err)
		}
		testkit.Eventually(t, 5*time.Second, "the oversized message to be counted", func() (bool, string) {
			v := metricValue(t, a, "kvdir_agent_zmtp_oversized_total", "")
			return v == float64(i+1), fmt.Sprint(v)
		})
	}

	pub, err := kvevents.NewPublisher(context.Background(), kvevents.PublisherConfig{Endpoint: "tcp://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	b := kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
		BlockHashes: []kvevents.Hash{kvevents.HashFromUint64(7)},
		TokenIDs:    make([]uint32, itBS),
		BlockSize:   itBS,
	}}}
	testkit.Eventually(t, 15*time.Second, "a real publisher's block in the directory", func() (bool, string) {
		if _, err := pub.Publish(b); err != nil {
			return false, err.Error()
		}
		w, ok := nodes[0].FSM().Worker(itWorker)
		return ok && w.Blocks > 0, fmt.Sprint(w)
	})
}
