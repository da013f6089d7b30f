package dirbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// pacedLatency measures publish-to-commit latency at a steady offered rate:
// every worker in turn removes its last stored piece and stores it again,
// one batch each, paced so that all together offer rate block events per
// second. The index ends as it began.
func pacedLatency(ctx context.Context, leader *fleet.DirNode, work [][]*kvdirv1.EventBatch, rate int, d time.Duration, res *Measures) error {
	agent := kvdirv1.NewAgentServiceClient(leader.Conn())
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		lat    []time.Duration
		events atomic.Int64
		errs   = make(chan error, len(work))
	)
	busy := 0 // workers with something to churn (a small scale leaves some without)
	for _, bs := range work {
		if len(bs) > 0 {
			busy++
		}
	}
	if busy == 0 {
		return errors.New("no worker has a batch to churn")
	}
	perWorker := float64(rate) / float64(busy)
	start := time.Now()
	for _, bs := range work {
		if len(bs) == 0 {
			continue
		}
		last := bs[len(bs)-1]
		piece := last.Events[len(last.Events)-1].GetStored()
		seq := last.LastSeq
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, err := agent.Publish(ctx)
			if err != nil {
				errs <- fmt.Errorf("open a paced stream: %w", err)
				return
			}
			// The sender keeps the pace without waiting for answers; the
			// receiver times each batch from its send to its answer.
			var sent sync.Map // seq -> send time
			n := 0
			done := make(chan error, 1)
			go func() {
				defer close(done)
				for i := 0; time.Since(start) < d || i%2 == 1; i++ { // end on a store: the index ends as it began
					due := start.Add(time.Duration(float64(n*len(piece.Hashes)) / perWorker * float64(time.Second)))
					time.Sleep(time.Until(due))
					seq++
					n++
					ev := &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: piece}}
					if i%2 == 0 {
						ev = &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: piece.Hashes}}}
					}
					sent.Store(seq, time.Now())
					b := &kvdirv1.EventBatch{WorkerId: last.WorkerId, Epoch: last.Epoch, FirstSeq: seq, LastSeq: seq, Events: []*kvdirv1.Event{ev}}
					if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
						done <- fmt.Errorf("send a paced batch of %s: %w", last.WorkerId, err)
						return
					}
				}
				done <- stream.CloseSend()
			}()
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil || resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
					errs <- fmt.Errorf("paced batch: %v %v", resp, err)
					return
				}
				t, _ := sent.Load(resp.FirstSeq)
				mu.Lock()
				lat = append(lat, time.Since(t.(time.Time)))
				mu.Unlock()
				events.Add(int64(len(piece.Hashes)))
			}
			if err := <-done; err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	res.LatencyRate = float64(events.Load()) / time.Since(start).Seconds()
	res.CommitP50ms = pct(lat, 0.50) / 1e3
	res.CommitP99ms = pct(lat, 0.99) / 1e3
	return nil
}
