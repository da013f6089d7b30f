package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultMaxMessageBytes bounds the bytes of one inbound ZMQ message (the
// sum of its frames) unless a config says otherwise. zmq4 allocates a
// frame's body from the length its peer declares, before reading it, so
// without a bound one 11-byte frame header claiming a terabyte ends the
// process. 64 MiB is about 8 times the largest batch an engine sends in one
// step (see the package documentation for the measurement).
const DefaultMaxMessageBytes = 64 << 20

// MaxFramesPerMessage bounds the frames of one inbound message: the
// largest message of this package has five, and a flood of empty frames
// would otherwise grow a message without bound.
const MaxFramesPerMessage = 1024

// ErrFrameTooLarge is wrapped by the read error of a connection whose peer
// declared a message larger than the limit; the connection is closed.
var ErrFrameTooLarge = errors.New("kvevents: zmtp message exceeds the maximum size")

var oversized atomic.Uint64

// hooks holds the OnOversized callbacks of the sockets, by the id their
// limited endpoint carries. Entries are never removed: zmq4 may dial a
// closed socket's endpoint again, and an entry is a few bytes.
var (
	hooks  sync.Map // uint64 -> func()
	hookID atomic.Uint64
)

// registerHook registers f and returns its id; 0 for a nil f.
func registerHook(f func()) uint64 {
	if f == nil {
		return 0
	}
	id := hookID.Add(1)
	hooks.Store(id, f)
	return id
}

// limit is what a limited address carries.
type limit struct {
	max  uint64
	hook uint64 // 0: none
}

func (l limit) String() string {
	s := strconv.FormatUint(l.max, 10)
	if l.hook != 0 {
		s += "," + strconv.FormatUint(l.hook, 10)
	}
	return s
}

// refused counts one connection closed for breaking the limit.
func (l limit) refused() {
	oversized.Add(1)
	if l.hook == 0 {
		return
	}
	if f, ok := hooks.Load(l.hook); ok {
		f.(func())()
	}
}

// OversizedMessages returns how many connections of this process were
// closed because their peer declared a ZMTP message over the limit, over
// every socket of this package.
func OversizedMessages() uint64 { return oversized.Load() }

// zmtpGreetingLen is the size of the ZMTP 3.x greeting, read before the
// first frame.
const zmtpGreetingLen = 64

// ZMTP 3.x frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// frameParser follows the inbound byte stream of one ZMTP 3.x connection
// (greeting, then frames: flags, 1- or 8-byte size, body; commands and
// message frames alike) and refuses a message whose declared size exceeds
// max. It sees bytes in any chunking and holds no data.
type frameParser struct {
	max       uint64
	greetLeft int
	hdr       [9]byte
	hdrN      int    // header bytes seen of the current frame
	bodyLeft  uint64 // body bytes still to come in the current frame
	msgBytes  uint64 // body bytes of the current message so far
	msgFrames int
	err       error
}

func newFrameParser(max uint64) *frameParser {
	return &frameParser{max: max, greetLeft: zmtpGreetingLen}
}

// feed consumes b and returns how many of its bytes precede the first
// frame header that breaks the limit or the framing, with the error; n ==
// len(b) and nil when all is well. After an error every feed fails.
func (p *frameParser) feed(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	i := 0
	for i < len(b) {
		switch {
		case p.greetLeft > 0:
			k := min(p.greetLeft, len(b)-i)
			p.greetLeft -= k
			i += k
		case p.bodyLeft > 0:
			k := uint64(len(b) - i)
			if k > p.bodyLeft {
				k = p.bodyLeft
			}
			p.bodyLeft -= k
			i += int(k)
		default:
			start := i - p.hdrN // may be negative: header began in an earlier chunk
			p.hdr[p.hdrN] = b[i]
			p.hdrN++
			i++
			if err := p.header(); err != nil {
				p.err = err
				return max(start, 0), err
			}
		}
	}
	return len(b), nil
}

// header inspects the header bytes gathered so far and, once complete,
// starts the body.
func (p *frameParser) header() error {
	fl := p.hdr[0]
	want := 2
	if fl&flagLong != 0 {
		want = 9
	}
	if p.hdrN < want {
		return nil
	}
	size := uint64(p.hdr[1])
	if want == 9 {
		size = binary.BigEndian.Uint64(p.hdr[1:9])
	}
	p.hdrN = 0
	p.msgFrames++
	if p.msgFrames > MaxFramesPerMessage {
		return fmt.Errorf("%w: more than %d frames", ErrFrameTooLarge, MaxFramesPerMessage)
	}
	if size > p.max || p.msgBytes+size > p.max {
		return fmt.Errorf("%w: frame of %d bytes after %d, limit %d", ErrFrameTooLarge, size, p.msgBytes, p.max)
	}
	p.msgBytes += size
	p.bodyLeft = size
	if fl&flagMore == 0 || fl&flagCommand != 0 {
		p.msgBytes, p.msgFrames = 0, 0
	}
	return nil
}

// limitError is the read error of a connection closed for breaking the
// limit. It is a net.Error that is not a timeout, which is what makes zmq4
// mark the connection closed, drop it and (for a dialer) dial again.
type limitError struct{ err error }

func (e limitError) Error() string   { return e.err.Error() }
func (e limitError) Unwrap() error   { return e.err }
func (e limitError) Timeout() bool   { return false }
func (e limitError) Temporary() bool { return false }

var _ net.Error = limitError{}

// limitConn checks the bytes read from a connection with a frameParser. It
// reads straight into the caller's buffer (no buffering of its own), so it
// never changes what zmq4 sees, only cuts it short before a bad header.
type limitConn struct {
	net.Conn
	p       *frameParser
	lim     limit
	pending error
	closed  atomic.Bool
	// dialed: zmq4 may dial this connection's endpoint again when it
	// fails (WithAutomaticReconnect); see Write.
	dialed bool
}

// Write writes b. On a dialed connection a write error is handed back as
// a plain error, not a net.Error, so that zmq4 does not take it as the
// connection's end: its PUB writer would otherwise mark the connection
// closed while holding its writer lock, and the reconnect that follows
// (zmq4 dials again inside that call) waits for the socket lock that its
// connection reaper holds while it waits for the writer lock: a deadlock
// seen as a publisher that never comes back after its subscriber
// restarts. The connection's reader, always reading, still sees the
// failure (EOF or a reset) and reconnects outside that lock.
func (c *limitConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil && c.dialed {
		return n, writeError{err}
	}
	return n, err
}

// writeError hides a write error's net.Error-ness (see limitConn.Write).
type writeError struct{ err error }

func (e writeError) Error() string { return "kvevents: write: " + e.err.Error() }

func (c *limitConn) Read(b []byte) (int, error) {
	if c.pending != nil {
		return 0, c.pending
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		ok, perr := c.p.feed(b[:n])
		if perr != nil {
			if c.closed.CompareAndSwap(false, true) {
				_ = c.Conn.Close()
				c.lim.refused()
			}
			c.pending = limitError{perr}
			if ok > 0 {
				// Hand over the bytes before the bad header first.
				return ok, nil
			}
			return 0, c.pending
		}
	}
	return n, err
}

// limitTransport is a zmq4 transport over TCP or Unix sockets whose
// connections are read through limitConn. The limit travels in the address
// ("<max>@<address>"), because zmq4 keeps one transport per scheme for the
// whole process; the transport itself holds no state.
type limitTransport struct {
	network string
	inner   transport.Transport
}

// Schemes of the limited transports; registered once, on first use.
const (
	limitTCP = "kvdir-tcp"
	limitIPC = "kvdir-ipc"
)

var registerOnce sync.Once
var registerErr error

func registerLimitTransports() error {
	registerOnce.Do(func() {
		registerErr = errors.Join(
			zmq4.RegisterTransport(limitTCP, limitTransport{network: "tcp", inner: transport.New("tcp")}),
			zmq4.RegisterTransport(limitIPC, limitTransport{network: "unix", inner: transport.New("unix")}),
		)
	})
	return registerErr
}

// plainTransport makes limitedEndpoint leave endpoints alone: zmq4's own
// transports, unbounded. Only the benchmark comparing the two sets it.
var plainTransport bool

// limitedEndpoint rewrites a tcp:// or ipc:// endpoint to use the limited
// transport with lim.MaxMessageBytes per message, calling lim.OnOversized
// (if not nil) for each connection closed for breaking it; other endpoints
// (inproc) are returned as they are. A MaxMessageBytes <= 0 means
// DefaultMaxMessageBytes.
func limitedEndpoint(endpoint string, lim Limits) (string, error) {
	if plainTransport {
		return endpoint, nil
	}
	max := lim.MaxMessageBytes
	if max <= 0 {
		max = DefaultMaxMessageBytes
	}
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return endpoint, nil
	}
	var to string
	switch scheme {
	case "tcp":
		to = limitTCP
	case "ipc":
		to = limitIPC
	default:
		return endpoint, nil
	}
	if err := registerLimitTransports(); err != nil {
		return "", fmt.Errorf("kvevents: register limited transports: %w", err)
	}
	l := limit{max: uint64(max), hook: lim.hook}
	if l.hook == 0 {
		l.hook = registerHook(lim.OnOversized)
	}
	return to + "://" + l.String() + "@" + rest, nil
}

// splitLimit parses "<max>[,<hook>]@<address>".
func splitLimit(addr string) (limit, string, error) {
	m, rest, ok := strings.Cut(addr, "@")
	if !ok {
		return limit{}, "", fmt.Errorf("kvevents: limited address %q lacks its limit", addr)
	}
	m, h, hasHook := strings.Cut(m, ",")
	var l limit
	var err error
	if l.max, err = strconv.ParseUint(m, 10, 63); err != nil || l.max == 0 {
		return limit{}, "", fmt.Errorf("kvevents: limited address %q: bad limit", addr)
	}
	if hasHook {
		if l.hook, err = strconv.ParseUint(h, 10, 64); err != nil {
			return limit{}, "", fmt.Errorf("kvevents: limited address %q: bad hook", addr)
		}
	}
	return l, rest, nil
}

// Addr resolves the address part after the limit as zmq4's own transport
// does ("*" and port 0 for tcp) and keeps the limit in front.
func (t limitTransport) Addr(ep string) (string, error) {
	l, rest, err := splitLimit(ep)
	if err != nil {
		return "", err
	}
	addr, err := t.inner.Addr(rest)
	if err != nil {
		return "", err
	}
	return l.String() + "@" + addr, nil
}

// Dial connects and wraps the connection.
func (t limitTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	l, rest, err := splitLimit(addr)
	if err != nil {
		return nil, err
	}
	c, err := t.inner.Dial(ctx, d, rest)
	if err != nil {
		return nil, err
	}
	return &limitConn{Conn: c, p: newFrameParser(l.max), lim: l, dialed: true}, nil
}

// Listen listens and wraps every accepted connection.
func (t limitTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	lim, rest, err := splitLimit(addr)
	if err != nil {
		return nil, err
	}
	l, err := t.inner.Listen(ctx, rest)
	if err != nil {
		return nil, err
	}
	return limitListener{Listener: l, lim: lim}, nil
}

type limitListener struct {
	net.Listener
	lim limit
}

func (l limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &limitConn{Conn: c, p: newFrameParser(l.lim.max), lim: l.lim}, nil
}
