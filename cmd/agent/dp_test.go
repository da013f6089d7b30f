package main

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// TestDataParallelRanks runs one agent process for a 2-rank engine: each
// rank publishes on its own port (base + rank, as vLLM does), and each
// becomes its own worker in the directory. The ranks bind (a wildcard
// endpoint) and the agent connects, or, with the agent's
// --kv-events-bind, the agent binds every rank's loopback port and the
// ranks connect (vLLM given tcp://127.0.0.1:PORT).
func TestDataParallelRanks(t *testing.T) {
	t.Run("engine binds", func(t *testing.T) { testDataParallelRanks(t, false) })
	t.Run("agent binds", func(t *testing.T) { testDataParallelRanks(t, true) })
}

func testDataParallelRanks(t *testing.T, agentBinds bool) {
	dir := dirtest.New(t, 1, nil).Node(0)

	base := testkit.FreePortRun(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pubs []*kvevents.Publisher
	for r := range 2 {
		ep := fmt.Sprintf("tcp://*:%d", base+r)
		if agentBinds {
			ep = fmt.Sprintf("tcp://127.0.0.1:%d", base+r)
		}
		p, err := kvevents.NewPublisher(ctx, kvevents.PublisherConfig{Endpoint: ep, DPRank: r})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pubs = append(pubs, p)
	}
	args := []string{"--directory", dir.APIAddr(), "--worker-id", "eng", "--model", "m",
		"--data-parallel-size", "2", "--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", base),
		"--http-addr", "127.0.0.1:0", "--batch-interval", "5ms", "--log-level", "error"}
	if agentBinds {
		args = append(args, "--kv-events-bind")
	}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, env(nil), io.Discard)
	}()
	// Each rank stores a different block, published until the directory
	// shows it (ZMQ drops what is sent before a subscriber is connected).
	testkit.Eventually(t, 20*time.Second, "workers eng-dp0 and eng-dp1 to hold their block", func() (bool, string) {
		held := 0
		for r, p := range pubs {
			tokens := make([]uint32, 16)
			for i := range tokens {
				tokens[i] = uint32(1000*r + i)
			}
			p.Publish(kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
				BlockHashes: []kvevents.Hash{kvevents.HashFromUint64(uint64(100 + r))}, TokenIDs: tokens, BlockSize: 16,
			}}})
			if w, ok := dir.FSM().Worker(fmt.Sprintf("eng-dp%d", r)); ok && w.Blocks == 1 {
				held++
			}
		}
		return held == 2, fmt.Sprint(dir.FSM().Workers("", true))
	})
	if _, ok := dir.FSM().Worker("eng"); ok {
		t.Fatal("a worker without a rank suffix was registered")
	}
	for r := range 2 {
		w, _ := dir.FSM().Worker(fmt.Sprintf("eng-dp%d", r))
		if got := w.GetSpec().DataParallelRank; got == nil || *got != uint32(r) {
			t.Fatalf("worker eng-dp%d registered rank %v, want %d", r, got, r)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
