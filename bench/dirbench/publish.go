package dirbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/radix/radixtest"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Batches turns the workload into each worker's event batches: its system
// prompts, then its sessions turn by turn, packed up to max blocks a batch.
func Batches(wl *radixtest.Workload, max int) [][]*kvdirv1.EventBatch {
	pieces := wl.Pieces()
	out := make([][]*kvdirv1.EventBatch, wl.Shape.Workers)
	for w, ps := range pieces {
		var cur *kvdirv1.EventBatch
		n := 0
		for _, p := range ps {
			if cur == nil || n+len(p.Hashes) > max {
				cur = &kvdirv1.EventBatch{WorkerId: radixtest.WorkerName(w)}
				out[w] = append(out[w], cur)
				n = 0
			}
			cur.Events = append(cur.Events, &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Parent: p.Parent, Hashes: p.Hashes}}})
			n += len(p.Hashes)
		}
	}
	return out
}

// PublishAll registers every worker on the leader and publishes their
// batches on one stream each, inflight batches at a time.
func PublishAll(ctx context.Context, leader *fleet.DirNode, work [][]*kvdirv1.EventBatch, inflight int, res *Measures) error {
	if err := RegisterAll(ctx, leader.Conn(), work); err != nil {
		return err
	}
	return publishRegistered(ctx, leader.Conn(), work, inflight, res)
}

// RegisterAll registers every worker of work on the leader and stamps its
// batches with the epoch and their sequence numbers.
func RegisterAll(ctx context.Context, leader grpc.ClientConnInterface, work [][]*kvdirv1.EventBatch) error {
	agent := kvdirv1.NewAgentServiceClient(leader)
	for w, bs := range work {
		req := &kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{
			Id: radixtest.WorkerName(w), BlockSize: 16, Model: "bench", Address: "http://127.0.0.1:1",
		}}
		reg, err := agent.Register(ctx, req)
		// A leadership change on a loaded machine fails a registration in
		// flight; the node forwards the retry to the new leader, and a
		// registration done twice only raises the epoch.
		for try := 0; status.Code(err) == codes.Unavailable && try < 5; try++ {
			time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
			reg, err = agent.Register(ctx, req)
		}
		if err != nil {
			return fmt.Errorf("register %s: %w", radixtest.WorkerName(w), err)
		}
		for i, b := range bs {
			b.Epoch, b.FirstSeq, b.LastSeq = reg.Epoch, uint64(i+1), uint64(i+1)
		}
	}
	return nil
}

// publishRegistered publishes the registered workers' batches on one
// stream each, inflight batches at a time, and records the throughput.
func publishRegistered(ctx context.Context, leader grpc.ClientConnInterface, work [][]*kvdirv1.EventBatch, inflight int, res *Measures) error {
	return publishOver(ctx, []grpc.ClientConnInterface{leader}, work, inflight, res)
}

// publishOver is publishRegistered with worker i's stream on conns[i %
// len(conns)].
func publishOver(ctx context.Context, conns []grpc.ClientConnInterface, work [][]*kvdirv1.EventBatch, inflight int, res *Measures) error {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		lat     []time.Duration
		events  atomic.Int64
		firstEr error
	)
	start := time.Now()
	for i, bs := range work {
		agent := kvdirv1.NewAgentServiceClient(conns[i%len(conns)])
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, n, err := publishWorker(ctx, agent, bs, inflight)
			mu.Lock()
			lat = append(lat, l...)
			if err != nil && firstEr == nil {
				firstEr = err
			}
			mu.Unlock()
			events.Add(n)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstEr != nil {
		return firstEr
	}
	res.Events = events.Load()
	res.EventsPerSec = float64(res.Events) / elapsed.Seconds()
	res.BurstCommitP99ms = pct(lat, 0.99) / 1e3
	return nil
}

// publishWorker sends one worker's batches on one stream and returns each
// batch's publish-to-acknowledgement latency and the events acknowledged.
func publishWorker(ctx context.Context, agent kvdirv1.AgentServiceClient, bs []*kvdirv1.EventBatch, inflight int) ([]time.Duration, int64, error) {
	stream, err := agent.Publish(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("open a publish stream: %w", err)
	}
	if inflight <= 1 {
		return publishInTurn(stream, bs)
	}
	sent := make([]atomic.Int64, len(bs)) // send times, Unix nanoseconds
	slots := make(chan struct{}, inflight)
	sendErr := make(chan error, 1)
	go func() {
		for i, b := range bs {
			slots <- struct{}{}
			sent[i].Store(time.Now().UnixNano())
			if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
				sendErr <- fmt.Errorf("send batch %d of %s: %w", i+1, b.WorkerId, err)
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	lat := make([]time.Duration, 0, len(bs))
	var events int64
	for i := range bs {
		resp, err := stream.Recv()
		if err != nil {
			return lat, events, fmt.Errorf("batch %d of %s: %w", i+1, bs[i].WorkerId, err)
		}
		if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			return lat, events, fmt.Errorf("batch %d of %s: %v %s", i+1, bs[i].WorkerId, resp.Status, resp.Message)
		}
		lat = append(lat, time.Duration(time.Now().UnixNano()-sent[resp.FirstSeq-1].Load()))
		for _, ev := range bs[i].Events {
			events += int64(len(ev.GetStored().Hashes))
		}
		<-slots
	}
	if err := <-sendErr; err != nil {
		return lat, events, err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return lat, events, fmt.Errorf("stream end: %w", err)
	}
	return lat, events, nil
}

// publishInTurn is publishWorker with one batch in flight: each batch is
// sent once the one before it is acknowledged, from one goroutine. The
// stream carries the same messages in the same order as with a sender
// goroutine of its own, without a hand-off between the two goroutines on
// every acknowledgement: with one batch in flight per stream that hand-off
// lies on the path from one batch's acknowledgement to the next batch, and
// the publishers share the machine's cores with the nodes.
func publishInTurn(stream kvdirv1.AgentService_PublishClient, bs []*kvdirv1.EventBatch) ([]time.Duration, int64, error) {
	lat := make([]time.Duration, 0, len(bs))
	var events int64
	for i, b := range bs {
		sent := time.Now()
		if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
			return lat, events, fmt.Errorf("send batch %d of %s: %w", i+1, b.WorkerId, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			return lat, events, fmt.Errorf("batch %d of %s: %w", i+1, b.WorkerId, err)
		}
		if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			return lat, events, fmt.Errorf("batch %d of %s: %v %s", i+1, b.WorkerId, resp.Status, resp.Message)
		}
		lat = append(lat, time.Since(sent))
		for _, ev := range b.Events {
			events += int64(len(ev.GetStored().Hashes))
		}
	}
	if err := stream.CloseSend(); err != nil {
		return lat, events, fmt.Errorf("close the stream: %w", err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return lat, events, fmt.Errorf("stream end: %w", err)
	}
	return lat, events, nil
}
