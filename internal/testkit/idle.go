package testkit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// IdleClosed opens a keep-alive connection to the HTTP server at addr
// (host:port), makes one GET request for path, then stays quiet, and
// returns how long after the response the server closed the connection.
// It fails if the server keeps it open past within.
func IdleClosed(addr, path string, within time.Duration) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return 0, fmt.Errorf("write request: %w", err)
	}
	br := bufio.NewReader(c)
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, fmt.Errorf("read response: %w", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, fmt.Errorf("read body: %w", err)
	}
	resp.Body.Close()
	if resp.Close {
		return 0, errors.New("the server closed the connection after the response: not a keep-alive test")
	}
	start := time.Now()
	if err := c.SetReadDeadline(start.Add(within)); err != nil {
		return 0, err
	}
	_, err = br.ReadByte()
	took := time.Since(start)
	var ne net.Error
	switch {
	case err == nil:
		return took, errors.New("the server sent data on an idle connection")
	case errors.As(err, &ne) && ne.Timeout():
		return took, fmt.Errorf("the server kept an idle connection open for %v", within)
	}
	return took, nil // EOF or reset: closed by the server
}
