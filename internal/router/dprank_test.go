package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestRegisteredRankWorkersGetTheRankHeader registers the two ranks of one
// API server (one address) and a plain worker in a directory: the router
// discovers them, reads each rank's load from its own series, and sends
// every request to a rank worker with X-data-parallel-rank set to its rank
// (and none to the plain worker).
func TestRegisteredRankWorkersGetTheRankHeader(t *testing.T) {
	const model = "deepseek-ai/DeepSeek-V3"
	dp := fakeEngine(t, "text/plain; version=0.0.4", engineFixture(t, "vllm_dp2.txt"))
	plain := fakeEngine(t, "text/plain; version=0.0.4", engineFixture(t, "vllm_dp2.txt"))
	c := dirtest.New(t, 1, nil)
	agents := kvdirv1.NewAgentServiceClient(c.Conn(0))
	for _, spec := range []*kvdirv1.WorkerSpec{
		{Id: "eng-dp0", Address: dp.URL, Model: model, BlockSize: 16, DataParallelRank: proto.Uint32(0)},
		{Id: "eng-dp1", Address: dp.URL, Model: model, BlockSize: 16, DataParallelRank: proto.Uint32(1)},
		{Id: "plain", Address: plain.URL, Model: model, BlockSize: 16},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := agents.Register(ctx, &kvdirv1.RegisterRequest{Worker: spec})
		cancel()
		if err != nil {
			t.Fatalf("register %s: %v", spec.Id, err)
		}
	}
	dc, err := dirclient.New(dirclient.Config{Addrs: []string{c.APIAddr(0)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	s, url := testRouter(t, "round-robin", nil, func(cfg *Config) { cfg.Directory = dc })

	waitLoad(t, s, "eng-dp0", 7, 3, 0.625)
	waitLoad(t, s, "eng-dp1", 2, 0, 0.125)
	waitLoad(t, s, "plain", 9, 3, 0.625) // no rank: both ranks' series summed

	seen := map[string]map[string]bool{}
	for range 9 {
		resp, body := post(t, url+PathChat, chatFor(model))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		id := resp.Header.Get(HeaderWorker)
		if seen[id] == nil {
			seen[id] = map[string]bool{}
		}
		seen[id][resp.Header.Get("X-Seen-Rank")] = true
	}
	want := map[string]map[string]bool{"eng-dp0": {"0": true}, "eng-dp1": {"1": true}, "plain": {"": true}}
	if len(seen) != len(want) {
		t.Fatalf("rank headers by worker = %v, want %v", seen, want)
	}
	for id, ranks := range want {
		if len(seen[id]) != 1 || !seen[id][firstKey(ranks)] {
			t.Fatalf("rank headers by worker = %v, want %v", seen, want)
		}
	}
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

// TestSharedReadsReadOncePerAddress checks that workers at one address
// share a read made within the freshness window, and read again after it.
func TestSharedReadsReadOncePerAddress(t *testing.T) {
	r := newSharedReads(time.Hour)
	reads := 0
	read := func() ([]byte, error) { reads++; return []byte("body"), nil }
	ctx := context.Background()
	for range 3 {
		b, err := r.get(ctx, "http://e:8000", read)
		if err != nil || string(b) != "body" {
			t.Fatalf("get = %q, %v", b, err)
		}
	}
	if reads != 1 {
		t.Fatalf("%d reads of one address within the window, want 1", reads)
	}
	if _, err := r.get(ctx, "http://other:8000", read); err != nil || reads != 2 {
		t.Fatalf("another address: %v, %d reads, want 2", err, reads)
	}
	// A failed read is shared too, and an expired one is redone.
	stale := newSharedReads(time.Nanosecond)
	boom := errors.New("boom")
	fails := func() ([]byte, error) { reads++; return nil, boom }
	if _, err := stale.get(ctx, "http://e:8000", fails); !errors.Is(err, boom) {
		t.Fatalf("failed read: %v", err)
	}
	time.Sleep(time.Millisecond) // past a 1 ns window
	if _, err := stale.get(ctx, "http://e:8000", read); err != nil || reads != 4 {
		t.Fatalf("expired read not redone: %v, %d reads, want 4", err, reads)
	}
}
