package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the address to bind or connect.
	Endpoint string
	// Bind makes the SUB socket bind (needed when the engine's PUB
	// connects, i.e. when !PublisherBinds(engine endpoint)); otherwise it
	// connects, in the background, retrying and reconnecting.
	Bind bool
	// Topic is the topic prefix to subscribe to; "" receives everything.
	Topic string
	// Logger receives zmq4's diagnostics; nil discards them.
	Logger *log.Logger
	// MaxMessageBytes bounds one inbound message on tcp and ipc endpoints:
	// a connection whose peer declares a larger one is closed and counted
	// by OversizedMessages (default DefaultMaxMessageBytes).
	MaxMessageBytes int64
	// OnOversized, if set, is called for each such connection.
	OnOversized func()
}

// SubscriberStats counts what a Subscriber saw.
type SubscriberStats struct {
	Received   uint64 // well-formed messages delivered
	Malformed  uint64 // messages with a bad frame layout
	Filtered   uint64 // messages whose topic did not match (filtered locally)
	ConnErrors uint64 // connection-level errors reported by zmq4
}

type recvResult struct {
	msg Msg
	err error
}

// Subscriber receives live KV event messages on a SUB socket.
type Subscriber struct {
	sock   zmq4.Socket
	topic  string
	cancel context.CancelFunc
	ctx    context.Context
	ch     chan recvResult
	wg     sync.WaitGroup
	once   sync.Once
	bound  bool

	received, malformed, filtered, connErrors atomic.Uint64
}

// NewSubscriber creates the SUB socket, subscribes to cfg.Topic and binds
// or starts connecting.
func NewSubscriber(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("kvevents: new subscriber: %w", err)
	}
	endpoint, err := limitedEndpoint(cfg.Endpoint, NewLimits(cfg.MaxMessageBytes, cfg.OnOversized))
	if err != nil {
		return nil, fmt.Errorf("kvevents: new subscriber: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Subscriber{
		sock:   zmq4.NewSub(ctx, zmqOptions(cfg.Logger, !cfg.Bind, !cfg.Bind)...),
		topic:  cfg.Topic,
		cancel: cancel,
		ctx:    ctx,
		ch:     make(chan recvResult, 256),
		bound:  cfg.Bind,
	}
	// Subscribe before connecting: zmq4 sends the stored subscriptions to
	// every new connection.
	if err := s.sock.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		s.abort()
		return nil, fmt.Errorf("kvevents: new subscriber: subscribe: %w", err)
	}
	if cfg.Bind {
		if err := s.sock.Listen(endpoint); err != nil {
			s.abort()
			return nil, fmt.Errorf("kvevents: new subscriber: bind %s: %w", cfg.Endpoint, err)
		}
	} else {
		dialInBackground(ctx, &s.wg, s.sock, endpoint)
	}
	s.wg.Add(1)
	go s.pump()
	return s, nil
}

func (s *Subscriber) abort() {
	s.cancel()
	_ = s.sock.Close()
	s.wg.Wait()
}

// Addr returns the bound address, or nil in connect mode.
func (s *Subscriber) Addr() net.Addr { return s.sock.Addr() }

// pump moves messages from the socket to s.ch, validating frames.
func (s *Subscriber) pump() {
	defer s.wg.Done()
	defer close(s.ch)
	for {
		zm, err := s.sock.Recv()
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			// zmq4 reports the loss of one connection as a Recv error;
			// the socket itself keeps working.
			s.connErrors.Add(1)
			continue
		}
		var res recvResult
		res.msg, res.err = ParseLive(zm.Frames)
		if res.err != nil {
			s.malformed.Add(1)
		} else if !strings.HasPrefix(res.msg.Topic, s.topic) {
			s.filtered.Add(1)
			continue
		} else {
			s.received.Add(1)
		}
		select {
		case s.ch <- res:
		case <-s.ctx.Done():
			return
		}
	}
}

// sweepLateConns works around a race in zmq4's socket.Close, which cancels
// the socket before closing its listener: a peer that connects in between is
// accepted and added to the closed socket, where nothing ever closes it. A
// connecting PUB then stays attached to that dead connection (it never gets
// a subscription) instead of redialing. Closing the socket again once any
// in-flight handshake has finished closes such connections.
func sweepLateConns(sock zmq4.Socket) {
	time.AfterFunc(100*time.Millisecond, func() { _ = sock.Close() })
	time.AfterFunc(time.Second, func() { _ = sock.Close() })
}

// Recv returns the next message. An error wrapping ErrBadFrames reports a
// malformed message and is not fatal: call Recv again. After Close, Recv
// returns ErrClosed; if ctx ends first, ctx's error.
func (s *Subscriber) Recv(ctx context.Context) (Msg, error) {
	select {
	case res, ok := <-s.ch:
		if !ok {
			return Msg{}, ErrClosed
		}
		if res.err != nil {
			return Msg{}, fmt.Errorf("kvevents: recv: %w", res.err)
		}
		return res.msg, nil
	case <-ctx.Done():
		return Msg{}, fmt.Errorf("kvevents: recv: %w", ctx.Err())
	}
}

// Stats returns a snapshot of the counters.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{
		Received:   s.received.Load(),
		Malformed:  s.malformed.Load(),
		Filtered:   s.filtered.Load(),
		ConnErrors: s.connErrors.Load(),
	}
}

// Close closes the socket and waits for background work to end.
func (s *Subscriber) Close() error {
	var err error
	s.once.Do(func() {
		s.cancel()
		err = closeErr(s.sock.Close())
		s.wg.Wait()
		if s.bound {
			sweepLateConns(s.sock)
		}
	})
	if err != nil {
		return fmt.Errorf("kvevents: close subscriber: %w", err)
	}
	return nil
}

// Replay asks the replay (ROUTER) socket at endpoint for every buffered
// batch with seq >= fromSeq, using a DEALER socket (a REQ socket would only
// get the first reply). It accepts both reply layouts, [seq8, payload] and
// [topic, seq8, payload] after the empty delimiter, and stops at the end
// marker: an empty last frame or the END_SEQ sequence number. ctx bounds the
// whole exchange, including connecting. On a malformed reply it returns the
// messages received so far and an error wrapping ErrBadFrames.
func Replay(ctx context.Context, endpoint string, fromSeq uint64) ([]Msg, error) {
	return ReplayLimited(ctx, endpoint, fromSeq, Limits{})
}

// Limits bound what a socket reads, as SubscriberConfig's fields of the
// same names. A Limits used for many Replay calls should come from
// NewLimits, which registers OnOversized once rather than at every call.
type Limits struct {
	MaxMessageBytes int64
	OnOversized     func()
	hook            uint64
}

// NewLimits returns Limits with onOversized registered once.
func NewLimits(maxMessageBytes int64, onOversized func()) Limits {
	l := Limits{MaxMessageBytes: maxMessageBytes, OnOversized: onOversized}
	l.hook = registerHook(onOversized)
	return l
}

// ReplayLimited is Replay with a bound on each reply's size.
func ReplayLimited(ctx context.Context, endpoint string, fromSeq uint64, lim Limits) ([]Msg, error) {
	if err := checkEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("kvevents: replay: %w", err)
	}
	dialEP, err := limitedEndpoint(endpoint, lim)
	if err != nil {
		return nil, fmt.Errorf("kvevents: replay: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmqOptions(nil, true, false)...)
	defer dealer.Close()
	if err := dealer.Dial(dialEP); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("kvevents: replay: dial %s: %w", endpoint, err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, seqBytes(fromSeq))); err != nil {
		return nil, fmt.Errorf("kvevents: replay: send request: %w", err)
	}
	var out []Msg
	for {
		zm, err := dealer.Recv()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return out, fmt.Errorf("kvevents: replay: recv after %d batches: %w", len(out), err)
		}
		m, end, err := parseReplay(zm.Frames)
		if err != nil {
			return out, fmt.Errorf("kvevents: replay: after %d batches: %w", len(out), err)
		}
		if end {
			return out, nil
		}
		out = append(out, m)
	}
}

// parseReplay parses one reply as seen by a DEALER: ["", seq8, payload] or
// ["", topic, seq8, payload]; end is true for the end marker.
func parseReplay(frames [][]byte) (m Msg, end bool, err error) {
	if len(frames) == 0 || len(frames[0]) != 0 {
		return Msg{}, false, fmt.Errorf("%w: replay reply lacks the empty delimiter frame", ErrBadFrames)
	}
	data := frames[1:]
	switch len(data) {
	case 2:
	case 3:
		m.Topic = string(data[0])
		data = data[1:]
	default:
		return Msg{}, false, fmt.Errorf("%w: replay reply has %d data frames, want 2 or 3", ErrBadFrames, len(data))
	}
	if len(data[0]) != 8 {
		return Msg{}, false, fmt.Errorf("%w: replay sequence frame has %d bytes, want 8", ErrBadFrames, len(data[0]))
	}
	m.Seq = binary.BigEndian.Uint64(data[0])
	if len(data[1]) == 0 || m.Seq == EndSeq {
		return Msg{}, true, nil
	}
	m.Payload = data[1]
	return m, false, nil
}
