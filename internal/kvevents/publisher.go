package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ReplayLayout selects how the replay socket frames its replies.
type ReplayLayout int

const (
	// ReplayLayoutOld answers [identity, "", seq8, payload] per batch and ends
	// with [identity, "", END_SEQ, ""] (vLLM before PR #45177, up to v0.25).
	ReplayLayoutOld ReplayLayout = iota
	// ReplayLayoutNew answers [identity, "", topic, seq8, payload] per batch
	// and ends with [identity, "", "", END_SEQ, ""] (PR #45177, v0.26+).
	ReplayLayoutNew
)

// Defaults of PublisherConfig, as in vLLM's KVEventsConfig.
const (
	DefaultBufferSteps = 10000
	DefaultHWM         = 100000
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Endpoint is the PUB address. The socket binds or connects according
	// to PublisherBinds, as vLLM does, unless Bind is set.
	Endpoint string
	// Bind makes the PUB socket bind Endpoint even where PublisherBinds
	// would connect, e.g. tcp://127.0.0.1:5557: events stay on loopback
	// and subscribers connect.
	Bind bool
	// ReplayEndpoint is the ROUTER address, always bound; "" disables replay.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// BufferSteps is how many past batches are kept for replay
	// (default DefaultBufferSteps).
	BufferSteps int
	// HWM is the PUB send high-water mark (default DefaultHWM).
	HWM int
	// Form is the payload encoding used by Publish.
	Form Form
	// ReplayLayout selects the replay reply framing.
	ReplayLayout ReplayLayout
	// DPRank is written into batches whose DPRank is nil, unless NoDPRank.
	DPRank   int
	NoDPRank bool
	// DropRate is the fraction of batches whose send "fails": the sequence
	// number is consumed but the batch is neither sent nor kept for replay
	// (what vLLM does when send_multipart raises).
	DropRate float64
	// LossRate is the fraction of batches lost on the way: the sequence
	// number is consumed and the batch is kept for replay but not sent
	// (like a PUB high-water-mark drop).
	LossRate float64
	// Seed seeds the drop/loss decisions.
	Seed uint64
	// Logger receives zmq4's diagnostics; nil discards them.
	Logger *log.Logger
	// MaxMessageBytes bounds one inbound message (subscriptions on the
	// PUB socket, requests on the replay socket) on tcp and ipc endpoints,
	// as SubscriberConfig.MaxMessageBytes (default DefaultMaxMessageBytes).
	MaxMessageBytes int64
	// OnOversized, if set, is called for each connection closed for it.
	OnOversized func()
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	Published         uint64 // batches handed to the PUB socket
	Dropped           uint64 // batches dropped by DropRate or a send error
	Lost              uint64 // batches withheld by LossRate
	ReplayRequests    uint64 // valid replay requests served
	BadReplayRequests uint64 // replay requests with the wrong frame count
	Replayed          uint64 // batches sent in replay replies
}

type buffered struct {
	seq     uint64
	payload []byte
}

// Publisher emits KV event batches the way vLLM's ZmqEventPublisher does:
// 3-frame messages on a PUB socket, a replay buffer and an optional ROUTER
// replay socket. It is safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	topic  []byte
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	seq    uint64
	buf    []buffered
	rng    *rand.Rand
	drop   float64
	loss   float64
	stats  PublisherStats
}

// NewPublisher creates the sockets and starts serving replay requests. In
// connect mode it dials in the background and returns at once; batches
// published before a subscriber is connected and subscribed are lost, as
// with any PUB socket.
func NewPublisher(ctx context.Context, cfg PublisherConfig) (*Publisher, error) {
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("kvevents: new publisher: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, fmt.Errorf("kvevents: new publisher replay: %w", err)
		}
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	if cfg.HWM <= 0 {
		cfg.HWM = DefaultHWM
	}
	lim := NewLimits(cfg.MaxMessageBytes, cfg.OnOversized)
	pubEP, err := limitedEndpoint(cfg.Endpoint, lim)
	if err != nil {
		return nil, fmt.Errorf("kvevents: new publisher: %w", err)
	}
	replayEP, err := limitedEndpoint(cfg.ReplayEndpoint, lim)
	if err != nil {
		return nil, fmt.Errorf("kvevents: new publisher: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		cfg:    cfg,
		topic:  []byte(cfg.Topic),
		cancel: cancel,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		drop:   cfg.DropRate,
		loss:   cfg.LossRate,
	}
	bind := cfg.Bind || PublisherBinds(cfg.Endpoint)
	p.pub = zmq4.NewPub(ctx, zmqOptions(cfg.Logger, !bind, !bind)...)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		p.abort()
		return nil, fmt.Errorf("kvevents: new publisher: set hwm: %w", err)
	}
	if bind {
		if err := removeStaleSocket(cfg.Endpoint); err != nil {
			p.abort()
			return nil, err
		}
		if err := p.pub.Listen(pubEP); err != nil {
			p.abort()
			return nil, fmt.Errorf("kvevents: new publisher: bind %s: %w", cfg.Endpoint, err)
		}
	} else {
		dialInBackground(ctx, &p.wg, p.pub, pubEP)
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmqOptions(cfg.Logger, false, false)...)
		if err := removeStaleSocket(cfg.ReplayEndpoint); err != nil {
			p.abort()
			return nil, err
		}
		if err := p.router.Listen(replayEP); err != nil {
			p.abort()
			return nil, fmt.Errorf("kvevents: new publisher: bind replay %s: %w", cfg.ReplayEndpoint, err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	return p, nil
}

// dialInBackground connects sock to endpoint without blocking the caller:
// zmq4's Dial blocks and retries, whereas libzmq connects asynchronously.
// The dial ends when ctx is cancelled.
func dialInBackground(ctx context.Context, wg *sync.WaitGroup, sock zmq4.Socket, endpoint string) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := sock.Dial(endpoint); err == nil && ctx.Err() != nil {
			// Connected while the socket was being closed: close again so
			// the new connection does not outlive it.
			_ = sock.Close()
		}
	}()
}

func (p *Publisher) abort() {
	p.cancel()
	if p.router != nil {
		_ = p.router.Close()
	}
	_ = p.pub.Close()
	p.wg.Wait()
}

// Addr returns the PUB socket's bound address, or nil in connect mode.
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr returns the replay socket's bound address, or nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.router == nil {
		return nil
	}
	return p.router.Addr()
}

// Publish fills in the batch's DPRank (unless configured not to), encodes
// it in the configured Form and publishes it. It returns the sequence
// number consumed by the batch, also when the batch was dropped or lost on
// purpose.
func (p *Publisher) Publish(b Batch) (uint64, error) {
	if b.DPRank == nil && !p.cfg.NoDPRank {
		r := p.cfg.DPRank
		b.DPRank = &r
	}
	return p.PublishPayload(EncodeBatch(b, p.cfg.Form))
}

// PublishPayload publishes an already encoded (or deliberately malformed)
// payload as the next batch. The payload must not be modified afterwards.
func (p *Publisher) PublishPayload(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	seq := p.seq
	p.seq++
	if p.drop > 0 && p.rng.Float64() < p.drop {
		p.stats.Dropped++
		return seq, nil
	}
	if p.loss > 0 && p.rng.Float64() < p.loss {
		p.stats.Lost++
		p.keep(seq, payload)
		return seq, nil
	}
	// zmq4's PUB only queues here (dropping above the HWM), so holding the
	// lock keeps messages in sequence order without blocking for long.
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, seqBytes(seq), payload)); err != nil {
		p.stats.Dropped++
		return seq, fmt.Errorf("kvevents: publish seq %d: %w", seq, err)
	}
	p.stats.Published++
	p.keep(seq, payload)
	return seq, nil
}

// keep appends to the replay buffer; p.mu must be held.
func (p *Publisher) keep(seq uint64, payload []byte) {
	p.buf = append(p.buf, buffered{seq: seq, payload: payload})
	if n := len(p.buf) - p.cfg.BufferSteps; n > 0 {
		clear(p.buf[:n])
		p.buf = p.buf[n:]
	}
}

// Restart simulates an engine restart: the sequence goes back to 0 and the
// replay buffer is cleared. The sockets stay open.
func (p *Publisher) Restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = 0
	p.buf = nil
}

// SetDropRate changes PublisherConfig.DropRate.
func (p *Publisher) SetDropRate(f float64) {
	p.mu.Lock()
	p.drop = f
	p.mu.Unlock()
}

// SetLossRate changes PublisherConfig.LossRate.
func (p *Publisher) SetLossRate(f float64) {
	p.mu.Lock()
	p.loss = f
	p.mu.Unlock()
}

// NextSeq returns the sequence number the next batch will get.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Stats returns a snapshot of the counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close closes the sockets and waits for background work to end.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	var err error
	if p.router != nil {
		err = closeErr(p.router.Close())
	}
	if e := closeErr(p.pub.Close()); e != nil && err == nil {
		err = e
	}
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("kvevents: close publisher: %w", err)
	}
	return nil
}

// closeErr drops the error zmq4 returns for connections that the peer (or
// zmq4's own reaper) already closed.
func closeErr(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// serveReplay answers replay requests until ctx is cancelled. Like vLLM it
// accepts only [identity, delimiter, start] requests (from REQ, or DEALER
// sending ["", start]); start is read as an unsigned big-endian integer.
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if len(msg.Frames) != 3 {
			p.mu.Lock()
			p.stats.BadReplayRequests++
			p.mu.Unlock()
			continue
		}
		id := msg.Frames[0]
		start, ok := startSeq(msg.Frames[2])
		p.mu.Lock()
		var items []buffered
		if ok {
			for _, b := range p.buf {
				if b.seq >= start {
					items = append(items, b)
				}
			}
		}
		p.stats.ReplayRequests++
		p.stats.Replayed += uint64(len(items))
		p.mu.Unlock()
		if err := p.sendReplay(id, items); err != nil && ctx.Err() != nil {
			return
		}
	}
}

// startSeq decodes a replay start frame as Python's int.from_bytes(b, "big")
// does; ok is false if the value exceeds 64 bits (no batch can match).
func startSeq(b []byte) (uint64, bool) {
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) > 8 {
		return 0, false
	}
	return tail64(b), true
}

func (p *Publisher) sendReplay(id []byte, items []buffered) error {
	empty := []byte{}
	for _, it := range items {
		var m zmq4.Msg
		if p.cfg.ReplayLayout == ReplayLayoutNew {
			m = zmq4.NewMsgFrom(id, empty, p.topic, seqBytes(it.seq), it.payload)
		} else {
			m = zmq4.NewMsgFrom(id, empty, seqBytes(it.seq), it.payload)
		}
		if err := p.router.SendMulti(m); err != nil {
			return fmt.Errorf("kvevents: replay seq %d: %w", it.seq, err)
		}
	}
	var end zmq4.Msg
	if p.cfg.ReplayLayout == ReplayLayoutNew {
		end = zmq4.NewMsgFrom(id, empty, empty, seqBytes(EndSeq), empty)
	} else {
		end = zmq4.NewMsgFrom(id, empty, seqBytes(EndSeq), empty)
	}
	if err := p.router.SendMulti(end); err != nil {
		return fmt.Errorf("kvevents: replay end marker: %w", err)
	}
	return nil
}

// String names the layout.
func (l ReplayLayout) String() string {
	if l == ReplayLayoutNew {
		return "new"
	}
	return "old"
}
