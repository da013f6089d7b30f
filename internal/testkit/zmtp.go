package testkit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// zmtpGreeting is a ZMTP 3.0 greeting with the NULL mechanism, as a client.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// zmtpReady is a READY command announcing sockType.
func zmtpReady(sockType string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(sockType)))
	body = append(body, sockType...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// SendOversizedZMTP connects to the ZMTP socket at addr (host:port), sends
// a valid greeting and, if sockType is not empty, a READY command for that
// socket type, then an 11-byte long-frame header (flags, 8-byte size and
// the first body bytes) declaring a message of size bytes. It returns nil
// once the server has closed the connection, within timeout.
func SendOversizedZMTP(addr, sockType string, size uint64, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("set deadline: %w", err)
	}
	msg := zmtpGreeting()
	flags := byte(0x06) // long command: what the handshake reads next
	if sockType != "" {
		msg = append(msg, zmtpReady(sockType)...)
		flags = 0x02 // long message frame
	}
	msg = append(msg, flags)
	msg = binary.BigEndian.AppendUint64(msg, size)
	msg = append(msg, 'x', 'x')
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	// Drain the server's greeting and handshake until it hangs up.
	if _, err := io.Copy(io.Discard, c); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("server at %s kept the connection open for %v", addr, timeout)
		}
		// A reset is the server hanging up too.
	}
	return nil
}
