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

// FreePortRun returns a loopback port p such that p to p+n-1 are all free
// at the time of the call (engines that offset a port per data-parallel
// rank need a run of them). It fails t when it finds none.
func FreePortRun(t testing.TB, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := true
		for i := 1; i < n && ok; i++ {
			l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				ok = false
				break
			}
			l2.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}
