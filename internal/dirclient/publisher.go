package dirclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Publisher defaults.
const (
	// DefaultQueueLimit bounds the batches a Publisher holds unacknowledged.
	DefaultQueueLimit = 4096
	// DefaultWindow bounds the batches sent on a stream and not yet
	// acknowledged.
	DefaultWindow = 256
)

// publishRetryMax bounds the pause between reconnections of a Publisher.
const publishRetryMax = time.Second

// errSwitch ends a stream gracefully to reconnect to the leader.
var errSwitch = errors.New("switching to the leader")

// errRefused ends a stream after a refusal (the publisher has stopped).
var errRefused = errors.New("batch refused")

// PublisherOption tunes a Publisher.
type PublisherOption func(*publisherOptions)

type publisherOptions struct {
	queueLimit int
	window     int
	ackTimeout time.Duration
}

// WithQueueLimit sets how many unacknowledged batches the Publisher holds
// before Send blocks (default DefaultQueueLimit).
func WithQueueLimit(n int) PublisherOption {
	return func(o *publisherOptions) { o.queueLimit = n }
}

// WithWindow sets how many batches may be in flight on the stream (default
// DefaultWindow).
func WithWindow(n int) PublisherOption {
	return func(o *publisherOptions) { o.window = n }
}

// WithAckTimeout sets how long batches may stay in flight without any
// acknowledgement before the stream is deemed stuck and re-opened (default
// twice Config.CallTimeout).
func WithAckTimeout(d time.Duration) PublisherOption {
	return func(o *publisherOptions) { o.ackTimeout = d }
}

// PublisherStats counts a Publisher's work. Every batch is acknowledged
// exactly once: Applied + Duplicate is the number of batches acknowledged.
type PublisherStats struct {
	// Sent counts batch sends, re-sends included; Resent the re-sends.
	Sent, Resent uint64
	// Applied counts batches the directory applied on receipt; Duplicate
	// those it had applied already (an earlier send whose answer was lost).
	Applied, Duplicate uint64
	// Streams counts the Publish streams opened.
	Streams uint64
	// Unexpected counts answers that matched no batch in flight (ignored).
	Unexpected uint64
}

// RefusedError is why a Publisher stopped when the directory refused a
// batch (GAP, STALE_EPOCH, UNKNOWN_WORKER or REJECTED). The agent must
// register the worker again and start a new Publisher for the new epoch.
type RefusedError struct {
	Response *kvdirv1.PublishResponse
}

func (e *RefusedError) Error() string {
	r := e.Response
	var why string
	switch r.Status {
	case kvdirv1.PublishStatus_PUBLISH_STATUS_GAP:
		why = fmt.Sprintf("the directory applied up to sequence %d and the batches do not follow on", r.AppliedSeq)
	case kvdirv1.PublishStatus_PUBLISH_STATUS_STALE_EPOCH:
		why = fmt.Sprintf("a newer registration (epoch %d) fenced this epoch", r.CurrentEpoch)
	case kvdirv1.PublishStatus_PUBLISH_STATUS_UNKNOWN_WORKER:
		why = "the worker is not registered (never, or it expired or deregistered)"
	case kvdirv1.PublishStatus_PUBLISH_STATUS_REJECTED:
		why = "the batch is malformed"
	default:
		why = "unexpected status"
	}
	msg := ""
	if r.Message != "" {
		msg = " (" + r.Message + ")"
	}
	return fmt.Sprintf("dirclient: publish for worker %q epoch %d: batch %d..%d refused: %s: %s%s; register the worker again and start a new Publisher",
		r.WorkerId, r.Epoch, r.FirstSeq, r.LastSeq, r.Status, why, msg)
}

// Status returns the refusal's status.
func (e *RefusedError) Status() kvdirv1.PublishStatus { return e.Response.GetStatus() }

// Publisher streams one worker's event batches in one epoch. Send numbers
// each batch with the next sequence number (from 1) and queues it; a
// goroutine sends the queue on a Publish stream to the leader (when known)
// and drops batches as they are acknowledged (APPLIED or DUPLICATE). When
// the stream breaks it reconnects, to another node if need be, and sends
// every unacknowledged batch again in order: the directory answers
// DUPLICATE for those it already applied, so none applies twice.
//
// A refusal (GAP, STALE_EPOCH, UNKNOWN_WORKER, REJECTED) or an error
// another node would repeat (a bad token) stops the Publisher: Done is
// closed and Err says why (a *RefusedError for refusals). It is safe for
// concurrent use.
type Publisher struct {
	c      *Client
	worker string
	epoch  uint64
	opts   publisherOptions

	ctx    context.Context // ends when the publisher stops
	cancel context.CancelFunc
	done   chan struct{} // closed when the sending goroutine returns

	mu          sync.Mutex
	queue       []*kvdirv1.EventBatch // unacknowledged; queue[i] has sequence acked+1+i
	next        uint64                // sequence of the next Send
	acked       uint64                // last sequence acknowledged
	sentThrough uint64                // last sequence sent on the current stream
	maxSent     uint64                // last sequence ever sent
	progressAt  time.Time             // last acknowledgement, or start of the wait for one
	err         error                 // why the publisher stopped
	changed     chan struct{}         // closed and replaced at every change
	stats       PublisherStats
}

// NewPublisher starts a Publisher for a worker's epoch (the epoch Register
// returned). Close it when done.
func (c *Client) NewPublisher(workerID string, epoch uint64, opts ...PublisherOption) *Publisher {
	o := publisherOptions{queueLimit: DefaultQueueLimit, window: DefaultWindow, ackTimeout: 2 * c.cfg.CallTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	o.queueLimit = max(o.queueLimit, 1)
	o.window = max(o.window, 1)
	if o.ackTimeout <= 0 {
		o.ackTimeout = 2 * c.cfg.CallTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		c: c, worker: workerID, epoch: epoch, opts: o,
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		next: 1, changed: make(chan struct{}),
	}
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.pubs[p] = struct{}{}
	}
	c.mu.Unlock()
	if closed {
		p.err = fmt.Errorf("dirclient: publisher for worker %q: %w", workerID, ErrClosed)
		cancel()
		close(p.done)
		return p
	}
	go p.run()
	return p
}

// WorkerID returns the worker the Publisher publishes for.
func (p *Publisher) WorkerID() string { return p.worker }

// Epoch returns the epoch the Publisher publishes in.
func (p *Publisher) Epoch() uint64 { return p.epoch }

// Send queues a batch of events and returns its sequence number. It blocks
// while the queue holds its limit of unacknowledged batches, until there is
// room, ctx ends (an error wrapping ctx.Err(); nothing was queued) or the
// Publisher stops (Err()). The Publisher keeps events until the batch is
// acknowledged: do not modify them after Send.
func (p *Publisher) Send(ctx context.Context, events []*kvdirv1.Event) (uint64, error) {
	p.mu.Lock()
	for p.err == nil && len(p.queue) >= p.opts.queueLimit {
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("dirclient: publish for worker %q: queue full (%d batches unacknowledged): %w",
				p.worker, p.opts.queueLimit, ctx.Err())
		}
		p.mu.Lock()
	}
	defer p.mu.Unlock()
	if p.err != nil {
		return 0, p.err
	}
	seq := p.next
	p.next++
	p.queue = append(p.queue, &kvdirv1.EventBatch{
		WorkerId: p.worker, Epoch: p.epoch, FirstSeq: seq, LastSeq: seq, Events: events,
	})
	p.broadcastLocked()
	return seq, nil
}

// Flush waits until every batch sent before the call is acknowledged. It
// fails if ctx ends first, or if the Publisher stops with some of them
// unacknowledged.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.next - 1
	for p.acked < target {
		if p.err != nil {
			return fmt.Errorf("dirclient: flush: %d batches unacknowledged: %w", target-p.acked, p.err)
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			return fmt.Errorf("dirclient: flush for worker %q: %d batches unacknowledged: %w", p.worker, target-p.acked, ctx.Err())
		}
		p.mu.Lock()
	}
	return nil
}

// Acked returns the last acknowledged sequence number (0 if none).
func (p *Publisher) Acked() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked
}

// Pending returns the number of batches not yet acknowledged.
func (p *Publisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// Stats returns the Publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Done is closed when the Publisher has stopped.
func (p *Publisher) Done() <-chan struct{} { return p.done }

// Err returns why the Publisher stopped (nil while it runs): a
// *RefusedError, an error wrapping ErrClosed after Close, or a final error
// from the directory.
func (p *Publisher) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close stops the Publisher. Batches not yet acknowledged may or may not
// have been applied; call Flush first to know.
func (p *Publisher) Close() {
	p.stop(fmt.Errorf("dirclient: publisher for worker %q: %w", p.worker, ErrClosed))
	<-p.done
}

// stop records why the publisher stops (the first reason wins) and stops it.
func (p *Publisher) stop(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked(err)
}

func (p *Publisher) stopLocked(err error) {
	if p.err == nil {
		p.err = err
		if !errors.Is(err, ErrClosed) {
			p.c.log.Warn("dirclient: publisher stopped", "worker", p.worker, "epoch", p.epoch, "err", err)
		}
	}
	p.cancel()
	p.broadcastLocked()
}

func (p *Publisher) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// run keeps a stream open while there is something to send.
func (p *Publisher) run() {
	defer close(p.done)
	defer func() {
		p.c.mu.Lock()
		delete(p.c.pubs, p)
		p.c.mu.Unlock()
	}()
	delay := retryBase
	for p.waitWork() {
		addr := p.c.order(true)[0]
		progressed, err := p.stream(addr)
		if p.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSwitch) {
			delay = retryBase
			continue
		}
		if !errors.Is(err, io.EOF) && !retryable(p.ctx, err) {
			p.stop(p.c.finalError("publish", addr, err))
			return
		}
		p.c.failed(addr)
		if progressed {
			delay = retryBase
		}
		p.c.log.Info("dirclient: publish stream broke; reconnecting and resending unacknowledged batches",
			"worker", p.worker, "addr", addr, "err", err, "pending", p.Pending(), "retry_in", delay)
		if !sleep(p.ctx, delay) {
			return
		}
		delay = min(2*delay, publishRetryMax)
	}
}

// waitWork waits until a batch is queued; false means the publisher stopped.
func (p *Publisher) waitWork() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.queue) == 0 {
		if p.ctx.Err() != nil {
			return false
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.ctx.Done():
		}
		p.mu.Lock()
	}
	return p.ctx.Err() == nil
}

// stream runs one Publish stream to addr: it first (re)sends every
// unacknowledged batch, then new ones as they are queued. It returns why
// the stream ended and whether any batch was acknowledged on it.
func (p *Publisher) stream(addr string) (progressed bool, err error) {
	cc, err := p.c.conn(addr)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	st, err := kvdirv1.NewAgentServiceClient(cc).Publish(p.c.outgoing(ctx, p.c.workerMD(p.worker)))
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	p.sentThrough = p.acked
	startAcked := p.acked
	p.stats.Streams++
	p.mu.Unlock()
	progress := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.acked > startAcked
	}

	recvDone := make(chan error, 1)
	go func() { recvDone <- p.recv(st) }()
	recvEnded := false
	defer func() {
		cancel()
		if !recvEnded {
			<-recvDone
		}
	}()
	// ended turns the receiver's result into the stream's.
	ended := func(err error, closing bool) (bool, error) {
		recvEnded = true
		if err == nil || errors.Is(err, io.EOF) {
			if closing {
				return progress(), errSwitch
			}
			err = status.Error(codes.Unavailable, "the node ended the publish stream")
		}
		return progress(), err
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	closing, closeAt := false, time.Time{}
	for {
		p.mu.Lock()
		var out []*kvdirv1.EventBatch
		for !closing && p.sentThrough-p.acked < uint64(p.opts.window) {
			i := p.sentThrough - p.acked
			if i >= uint64(len(p.queue)) {
				break
			}
			if p.sentThrough == p.acked {
				p.progressAt = time.Now()
			}
			b := p.queue[i]
			out = append(out, b)
			p.sentThrough++
			p.stats.Sent++
			if b.FirstSeq <= p.maxSent {
				p.stats.Resent++
			} else {
				p.maxSent = b.LastSeq
			}
		}
		inflight := p.sentThrough > p.acked
		stuckAt := p.progressAt.Add(p.opts.ackTimeout)
		ch := p.changed
		p.mu.Unlock()

		for _, b := range out {
			if err := st.Send(&kvdirv1.PublishRequest{Batch: b}); err != nil {
				// The stream is over; the receiver has its status.
				return ended(<-recvDone, false)
			}
		}
		if len(out) > 0 {
			continue
		}
		if l := p.c.Leader(); !closing && l != "" && l != addr && !p.c.recentlyFailed(l) {
			// The leader is elsewhere: end this stream once its batches
			// are answered, and reconnect there.
			p.c.log.Debug("dirclient: moving the publish stream to the leader", "worker", p.worker, "from", addr, "to", l)
			closing, closeAt = true, time.Now()
			if err := st.CloseSend(); err != nil {
				return ended(<-recvDone, false)
			}
			continue
		}
		if closing && closeAt.Add(p.opts.ackTimeout).After(stuckAt) {
			stuckAt = closeAt.Add(p.opts.ackTimeout)
		}
		var stuck <-chan time.Time
		if inflight || closing {
			timer.Reset(time.Until(stuckAt))
			stuck = timer.C
		}
		select {
		case <-ch:
		case err := <-recvDone:
			return ended(err, closing)
		case <-stuck:
			// Re-checked at the top of the loop, with the latest progress.
			if !time.Now().Before(stuckAt) && p.stuckSince(stuckAt) {
				return progress(), status.Errorf(codes.Unavailable,
					"no acknowledgement from %s for %v; the stream looks stuck", addr, p.opts.ackTimeout)
			}
		case <-p.ctx.Done():
			return progress(), p.ctx.Err()
		}
		timer.Stop()
	}
}

// stuckSince reports whether nothing was acknowledged since the wait that
// ended at deadline began.
func (p *Publisher) stuckSince(deadline time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.progressAt.Add(p.opts.ackTimeout).After(deadline)
}

// recv reads the stream's answers until it ends.
func (p *Publisher) recv(st kvdirv1.AgentService_PublishClient) error {
	if md, err := st.Header(); err == nil {
		p.c.noteHeader(md)
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		if !p.handle(resp) {
			return errRefused
		}
	}
}

// handle applies one answer; false means the publisher stopped.
func (p *Publisher) handle(resp *kvdirv1.PublishResponse) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch resp.Status {
	case kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED, kvdirv1.PublishStatus_PUBLISH_STATUS_DUPLICATE:
	default:
		p.stopLocked(&RefusedError{Response: resp})
		return false
	}
	if resp.LastSeq <= p.acked || resp.LastSeq > p.sentThrough {
		p.stats.Unexpected++
		p.c.log.Warn("dirclient: publish answer matches no batch in flight",
			"worker", p.worker, "first_seq", resp.FirstSeq, "last_seq", resp.LastSeq, "acked", p.acked)
		return true
	}
	n := resp.LastSeq - p.acked
	for range n {
		p.queue[0] = nil
		p.queue = p.queue[1:]
	}
	p.acked = resp.LastSeq
	if resp.Status == kvdirv1.PublishStatus_PUBLISH_STATUS_APPLIED {
		p.stats.Applied += n
	} else {
		p.stats.Duplicate += n
	}
	p.progressAt = time.Now()
	p.broadcastLocked()
	return true
}
