package dirtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Register registers worker (block size 16, model "m") through any
// running node that accepts it and returns its epoch.
func (c *Cluster) Register(worker string) uint64 {
	c.t.Helper()
	var epoch uint64
	testkit.Eventually(c.t, 10*time.Second, "registration of "+worker, func() (bool, string) {
		var last error
		for i := range c.Size() {
			if c.Node(i) == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := kvdirv1.NewAgentServiceClient(c.Conn(i)).Register(ctx,
				&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: worker, BlockSize: 16, Model: "m"}})
			cancel()
			if err == nil {
				epoch = resp.Epoch
				return true, ""
			}
			last = err
		}
		return false, fmt.Sprint(last)
	})
	return epoch
}

// Publisher publishes one worker's batches one at a time, moving to the
// next running node and re-sending the batch whenever a node fails it, as
// a real agent does. It records what was acknowledged.
type Publisher struct {
	c      *Cluster
	worker string
	epoch  uint64
	seq    uint64
	next   uint64 // hash generator

	mu     sync.Mutex
	acked  [][]uint64 // chains of acknowledged batches
	stream kvdirv1.AgentService_PublishClient
	at     int
}

// NewPublisher registers worker and returns its publisher; seed sets the
// hashes it stores apart from other publishers'.
func (c *Cluster) NewPublisher(worker string, seed uint64) *Publisher {
	c.t.Helper()
	return &Publisher{c: c, worker: worker, epoch: c.Register(worker), next: seed << 32}
}

// Worker is the publisher's worker id.
func (p *Publisher) Worker() string { return p.worker }

// Epoch is the epoch the publisher registered with.
func (p *Publisher) Epoch() uint64 { return p.epoch }

// UseNode makes the next batch go to node i first (on a new stream).
func (p *Publisher) UseNode(i int) {
	p.at, p.stream = i, nil
}

// Publish sends one batch storing a fresh 8-block chain and returns once a
// node acknowledged it (APPLIED or DUPLICATE); any other answer, or no
// acknowledgement within 20 s, is an error.
func (p *Publisher) Publish() error {
	p.seq++
	chain := make([]uint64, 8)
	for i := range chain {
		p.next++
		chain[i] = p.next
	}
	batch := &kvdirv1.EventBatch{
		WorkerId: p.worker, Epoch: p.epoch, FirstSeq: p.seq, LastSeq: p.seq,
		Events: []*kvdirv1.Event{{Kind: &kvdirv1.Event_Stored{Stored: &kvdirv1.StoredBlocks{Hashes: chain}}}},
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := p.sendOnce(batch)
		if err != nil {
			p.stream = nil
			p.at++
			time.Sleep(20 * time.Millisecond) // back off before trying the next node
			continue
		}
		switch resp.Status {
		case kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED, kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE:
			p.mu.Lock()
			p.acked = append(p.acked, chain)
			p.mu.Unlock()
			return nil
		default:
			return fmt.Errorf("batch %d refused: %v %s", p.seq, resp.Status, resp.Message)
		}
	}
	return fmt.Errorf("batch %d not acknowledged in time", p.seq)
}

func (p *Publisher) sendOnce(b *kvdirv1.EventBatch) (*kvdirv1.PublishResponse, error) {
	if p.stream == nil {
		i := p.at % p.c.Size()
		if p.c.Node(i) == nil {
			return nil, errors.New("node down")
		}
		s, err := kvdirv1.NewAgentServiceClient(p.c.Conn(i)).Publish(context.Background())
		if err != nil {
			return nil, err
		}
		p.stream = s
	}
	if err := p.stream.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
		return nil, err
	}
	return p.stream.Recv()
}

// Acked returns the chains of the acknowledged batches, in order.
func (p *Publisher) Acked() [][]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acked)
}

// Check is the standard closing check: every running node converges to
// one applied index and state digest, and on every node each publisher's
// acknowledged batches are all held by its worker, whose applied sequence
// covers them.
func (c *Cluster) Check(pubs ...*Publisher) {
	c.t.Helper()
	c.Converged()
	for _, n := range c.Nodes() {
		for _, p := range pubs {
			acked := p.Acked()
			for _, chain := range acked {
				// Acknowledged pieces were stored under the root, so
				// each is a chain of its own.
				ms, _, err := n.FSM().Match(nil, chain)
				if err != nil || len(ms) != 1 || ms[0].Worker != p.worker || ms[0].Blocks != len(chain) {
					c.t.Fatalf("node %s lost an acknowledged batch of %s: match %v %v", n.ID(), p.worker, ms, err)
				}
			}
			w, ok := n.FSM().Worker(p.worker)
			if !ok || w.AppliedSeq < uint64(len(acked)) {
				c.t.Fatalf("node %s: worker %s applied seq %v, acknowledged %d", n.ID(), p.worker, w, len(acked))
			}
		}
	}
}
