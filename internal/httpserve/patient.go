package httpserve

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Serve serves srv on ln, handing the server each connection only once its
// first byte has arrived, and closing one that stays silent for
// srv.IdleTimeout (ReadHeaderTimeout when that is zero).
//
// net/http starts a fresh connection's header timeout when it accepts the
// connection, not when the request begins, so a connection a client dialed
// and kept unused in its pool is closed after ReadHeaderTimeout. Clients
// do keep such connections: Go's Transport parks a connection it dialed for
// a request that another connection served first. Their next request on it
// then fails before any response byte (EOF, broken pipe), and a POST is
// not retried. Waiting here first makes a fresh connection's first request
// timed as every later one is: idle until a byte arrives, then the header
// and read timeouts from that byte.
func Serve(srv *http.Server, ln net.Listener) error {
	wait := srv.IdleTimeout
	if wait <= 0 {
		wait = srv.ReadHeaderTimeout
	}
	return srv.Serve(Patient(ln, wait))
}

// Patient returns a listener whose Accept returns ln's connections once
// their first byte has arrived; one that sends nothing for wait (0: no
// limit) is closed. Closing it closes ln and the connections still waiting.
func Patient(ln net.Listener, wait time.Duration) net.Listener {
	p := &patientListener{
		Listener: ln,
		wait:     wait,
		ready:    make(chan net.Conn),
		errs:     make(chan error),
		done:     make(chan struct{}),
		waiting:  make(map[net.Conn]struct{}),
	}
	go p.acceptLoop()
	return p
}

type patientListener struct {
	net.Listener
	wait  time.Duration
	ready chan net.Conn // connections whose first byte has arrived
	errs  chan error    // Accept errors of ln
	done  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	waiting map[net.Conn]struct{}
}

func (p *patientListener) acceptLoop() {
	for {
		c, err := p.Listener.Accept()
		if err != nil {
			// The server backs off on a temporary error and calls
			// Accept again; on any other it stops and closes p.
			select {
			case p.errs <- err:
			case <-p.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go p.awaitFirstByte(c)
	}
}

func (p *patientListener) awaitFirstByte(c net.Conn) {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		_ = c.Close()
		return
	default:
	}
	p.waiting[c] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, c)
		p.mu.Unlock()
	}()

	var deadline time.Time
	if p.wait > 0 {
		deadline = time.Now().Add(p.wait)
	}
	var b [1]byte
	if err := c.SetReadDeadline(deadline); err != nil {
		_ = c.Close()
		return
	}
	if n, _ := c.Read(b[:]); n == 0 {
		// Silent past the wait, closed by the client, or broken: no
		// request will come. (A byte with an error is handed on: the
		// server reads the error next.)
		_ = c.Close()
		return
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		_ = c.Close()
		return
	}
	var pc net.Conn = &prefixConn{Conn: c, first: b[0], has: true}
	if cw, ok := c.(closeWriter); ok {
		pc = prefixCloseWriteConn{prefixConn: pc.(*prefixConn), cw: cw}
	}
	select {
	case p.ready <- pc:
	case <-p.done:
		_ = c.Close()
	}
}

// Accept returns the next connection whose first byte has arrived.
func (p *patientListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.ready:
		return c, nil
	case err := <-p.errs:
		return nil, err
	case <-p.done:
		return nil, net.ErrClosed
	}
}

// Close closes the listener and the connections still waiting for their
// first byte.
func (p *patientListener) Close() error {
	err := net.ErrClosed
	p.once.Do(func() {
		p.mu.Lock()
		close(p.done)
		for c := range p.waiting {
			_ = c.Close()
		}
		p.mu.Unlock()
		err = p.Listener.Close()
	})
	return err
}

// prefixConn is a connection whose first byte was read ahead. net/http
// never reads a connection from two goroutines at once.
type prefixConn struct {
	net.Conn
	first byte
	has   bool
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if c.has && len(b) > 0 {
		c.has = false
		b[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(b)
}

// closeWriter is what net/http uses to half-close a connection after an
// oversized request body (TCP connections have it).
type closeWriter interface{ CloseWrite() error }

type prefixCloseWriteConn struct {
	*prefixConn
	cw closeWriter
}

func (c prefixCloseWriteConn) CloseWrite() error { return c.cw.CloseWrite() }
