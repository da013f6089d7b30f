package testkit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// ErrNoProcNet is returned by ListensOn where the kernel's socket tables
// cannot be read (a system without Linux's /proc).
var ErrNoProcNet = errors.New("testkit: no /proc/net/tcp to read listening sockets from")

// ListensOn reports whether process pid holds a TCP socket listening on
// port (on any local address). A port picked free and handed to a child
// process may be taken by another process first; a health check on it
// then reaches the other process, so a caller that must know its child
// is the one serving asks this. It reads Linux's /proc and returns
// ErrNoProcNet elsewhere.
func ListensOn(pid, port int) (bool, error) {
	inodes := map[string]bool{}
	read := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		read = true
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st ... inode (the tenth field)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			i := strings.LastIndexByte(f[1], ':')
			if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if !read {
		return false, ErrNoProcNet
	}
	if len(inodes) == 0 {
		return false, nil
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("testkit: read the sockets of process %d: %w", pid, err)
	}
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && inodes[link] {
			return true, nil
		}
	}
	return false, nil
}
