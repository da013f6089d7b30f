package testkit

import (
	"fmt"
	"net"
	"strconv"
	"testing"
)

// LoopbackAddrs returns n distinct loopback TCP addresses ("127.0.0.1:port")
// whose ports were free a moment ago: all are listened on with port 0 at
// once, then closed.
func LoopbackAddrs(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free loopback port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// LoopbackPorts is LoopbackAddrs as port numbers.
func LoopbackPorts(n int) ([]int, error) {
	addrs, err := LoopbackAddrs(n)
	if err != nil {
		return nil, err
	}
	ports := make([]int, n)
	for i, a := range addrs {
		ports[i] = Port(a)
	}
	return ports, nil
}

// FreeAddrs is LoopbackAddrs for tests: it fails t on error.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs, err := LoopbackAddrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// Port returns the port of a "host:port" address as a number.
func Port(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}
