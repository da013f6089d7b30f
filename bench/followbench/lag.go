package followbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/bench/dirbench"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// LagSampleEvery is how often the lag in log entries is sampled.
const LagSampleEvery = 10 * time.Millisecond

// churner is one worker's churn: it removes and stores again its last
// stored piece, one batch each, continuing the worker's sequence.
type churner struct {
	worker string
	epoch  uint64
	seq    uint64
	piece  *kvdirv1.StoredBlocks
}

// ack is one acknowledged batch of a lag phase.
type ack struct {
	index      uint64 // its log entry
	sent, done time.Time
}

// lagPhases offers each rate in turn for d and measures the live replica's
// lag behind the leader's acknowledgements.
func lagPhases(ctx context.Context, c *fleet.Directory, leader *fleet.DirNode, live *replica,
	work [][]*kvdirv1.EventBatch, rates []int, d time.Duration, res *Measures, log *slog.Logger) error {
	var churners []*churner
	for _, bs := range work {
		if len(bs) == 0 {
			continue
		}
		last := bs[len(bs)-1]
		churners = append(churners, &churner{worker: last.WorkerId, epoch: last.Epoch, seq: last.LastSeq,
			piece: last.Events[len(last.Events)-1].GetStored()})
	}
	if len(churners) == 0 {
		return errors.New("no worker has a piece to churn")
	}
	for _, rate := range rates {
		before := snapshotIndexes(ctx, c)
		ph, err := lagPhase(ctx, leader, live, churners, rate, d)
		if err != nil {
			return fmt.Errorf("lag at %d events/s: %w", rate, err)
		}
		after := snapshotIndexes(ctx, c)
		for i := range after {
			if after[i] != before[i] {
				ph.NodeSnapshots++
			}
		}
		res.LagPhases = append(res.LagPhases, *ph)
		log.Info("lag phase", "offered", rate, "achieved", ph.AchievedPerSec, "commit_p99_ms", ph.CommitP99ms,
			"lag_p50_ms", ph.LagP50ms, "lag_p99_ms", ph.LagP99ms, "lag_max_ms", ph.LagMaxms, "lag_entries_p99", ph.LagEntriesP99)
		// The next phase starts from agreeing nodes.
		if err := dirbench.Converge(ctx, c, 2*time.Minute); err != nil {
			return err
		}
	}
	// The headline: the highest offered rate the directory sustained, or
	// the phase at the target rate when it was sustained.
	var pick *LagPhase
	for i := range res.LagPhases {
		ph := &res.LagPhases[i]
		if ph.Sustained {
			res.MaxSustainedPerSec = max(res.MaxSustainedPerSec, ph.AchievedPerSec)
			if pick == nil || ph.OfferedPerSec > pick.OfferedPerSec && pick.OfferedPerSec < TargetLagRate {
				pick = ph
			}
		}
	}
	if pick == nil {
		pick = &res.LagPhases[0]
	}
	res.LagRate, res.LagP50ms, res.LagP99ms, res.LagEntriesP99 = pick.AchievedPerSec, pick.LagP50ms, pick.LagP99ms, pick.LagEntriesP99
	return nil
}

// lagPhase churns at rate block events per second for d, then waits for
// the replica to apply the last acknowledged entry, and matches every
// acknowledgement with the moment the replica's applied index reached it.
func lagPhase(ctx context.Context, leader *fleet.DirNode, live *replica, churners []*churner, rate int, d time.Duration) (*LagPhase, error) {
	agent := kvdirv1.NewAgentServiceClient(leader.Conn())
	perWorker := float64(rate) / float64(len(churners))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acks     []ack
		events   atomic.Int64
		maxAcked atomic.Uint64
		errs     = make(chan error, len(churners))
	)
	live.recording(true)
	stopSampling := make(chan struct{})
	var samples []float64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(LagSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				if c, a := maxAcked.Load(), live.f.AppliedIndex(); c > a {
					samples = append(samples, float64(c-a))
				} else {
					samples = append(samples, 0)
				}
			}
		}
	}()
	start := time.Now()
	for _, ch := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, n, err := churn(ctx, agent, ch, perWorker, start, d, &maxAcked)
			mu.Lock()
			acks = append(acks, got...)
			mu.Unlock()
			events.Add(n)
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		close(stopSampling)
		<-sampled
		live.recording(false)
		return nil, err
	}
	last := maxAcked.Load()
	deadline := time.Now().Add(time.Minute)
	for last > 0 && !live.recorded(last) {
		if time.Now().After(deadline) {
			close(stopSampling)
			<-sampled
			live.recording(false)
			return nil, fmt.Errorf("the replica did not apply index %d within a minute (applied %d)", last, live.f.AppliedIndex())
		}
		time.Sleep(time.Millisecond)
	}
	close(stopSampling)
	<-sampled
	applies := live.recording(false)

	ph := &LagPhase{OfferedPerSec: float64(rate), Batches: len(acks), Events: events.Load()}
	ph.AchievedPerSec = float64(ph.Events) / elapsed.Seconds()
	ph.Sustained = ph.AchievedPerSec >= 0.95*ph.OfferedPerSec
	var commit, lag, toReplica []float64
	indexes := map[uint64]bool{}
	for _, a := range acks {
		indexes[a.index] = true
		i := sort.Search(len(applies), func(i int) bool { return applies[i].index >= a.index })
		if i == len(applies) {
			return nil, fmt.Errorf("no apply of the replica reached index %d", a.index)
		}
		at := applies[i].at
		commit = append(commit, ms(a.done.Sub(a.sent)))
		lag = append(lag, max(0, ms(at.Sub(a.done))))
		toReplica = append(toReplica, ms(at.Sub(a.sent)))
	}
	if len(indexes) > 0 {
		ph.BatchesPerEntry = float64(len(acks)) / float64(len(indexes))
	}
	ph.CommitP50ms, ph.CommitP99ms = quantile(commit, 0.50), quantile(commit, 0.99)
	ph.LagP50ms, ph.LagP99ms, ph.LagMaxms = quantile(lag, 0.50), quantile(lag, 0.99), quantile(lag, 1)
	ph.PublishToReplicaP99ms = quantile(toReplica, 0.99)
	ph.LagEntriesP50, ph.LagEntriesP99, ph.LagEntriesMax = quantile(samples, 0.50), quantile(samples, 0.99), quantile(samples, 1)
	return ph, nil
}

// churn sends one worker's batches paced at perWorker block events per
// second for d (ending on a store, so the index ends as it began) and
// returns their acknowledgements and the events acknowledged.
func churn(ctx context.Context, agent kvdirv1.AgentServiceClient, ch *churner, perWorker float64, start time.Time,
	d time.Duration, maxAcked *atomic.Uint64) ([]ack, int64, error) {
	stream, err := agent.Publish(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("open a publish stream for %s: %w", ch.worker, err)
	}
	first := ch.seq + 1
	var sentMu sync.Mutex
	var sent []time.Time // by seq - first
	done := make(chan error, 1)
	go func() {
		n := 0
		for i := 0; time.Since(start) < d || i%2 == 1; i++ {
			due := start.Add(time.Duration(float64(n*len(ch.piece.Hashes)) / perWorker * float64(time.Second)))
			time.Sleep(time.Until(due))
			n++
			ch.seq++
			ev := &kvdirv1.Event{Kind: &kvdirv1.Event_Stored{Stored: ch.piece}}
			if i%2 == 0 {
				ev = &kvdirv1.Event{Kind: &kvdirv1.Event_Removed{Removed: &kvdirv1.RemovedBlocks{Hashes: ch.piece.Hashes}}}
			}
			sentMu.Lock()
			sent = append(sent, time.Now())
			sentMu.Unlock()
			b := &kvdirv1.EventBatch{WorkerId: ch.worker, Epoch: ch.epoch, FirstSeq: ch.seq, LastSeq: ch.seq, Events: []*kvdirv1.Event{ev}}
			if err := stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
				done <- fmt.Errorf("send a batch of %s: %w", ch.worker, err)
				return
			}
		}
		done <- stream.CloseSend()
	}()
	var acks []ack
	var events int64
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return acks, events, fmt.Errorf("batch of %s: %w", ch.worker, err)
		}
		if resp.Status != kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
			return acks, events, fmt.Errorf("batch %d of %s: %v %s", resp.FirstSeq, ch.worker, resp.Status, resp.Message)
		}
		now := time.Now()
		sentMu.Lock()
		at := sent[resp.FirstSeq-first]
		sentMu.Unlock()
		acks = append(acks, ack{index: resp.RaftIndex, sent: at, done: now})
		for {
			m := maxAcked.Load()
			if resp.RaftIndex <= m || maxAcked.CompareAndSwap(m, resp.RaftIndex) {
				break
			}
		}
		events += int64(len(ch.piece.Hashes))
	}
	return acks, events, <-done
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// quantile is the q-quantile of v (nearest rank below), 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// snapshotIndexes is each node's last Raft snapshot index (0 when it
// cannot say).
func snapshotIndexes(ctx context.Context, c *fleet.Directory) []uint64 {
	out := make([]uint64, len(c.Nodes))
	for i, n := range c.Nodes {
		if st, err := n.Status(ctx); err == nil {
			out[i] = st.LastSnapshotIndex
		}
	}
	return out
}
