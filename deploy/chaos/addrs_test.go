package chaos

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeDocker writes a docker stand-in that answers inspect with the
// address in ipFile and counts its calls in countFile.
func fakeDocker(t *testing.T) (d Docker, ipFile, countFile string) {
	t.Helper()
	dir := t.TempDir()
	ipFile, countFile = filepath.Join(dir, "ip"), filepath.Join(dir, "count")
	script := "#!/bin/sh\necho x >> " + countFile + "\ncat " + ipFile + "\n"
	bin := filepath.Join(dir, "docker")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return Docker{Bin: bin}, ipFile, countFile
}

func calls(t *testing.T, countFile string) int {
	t.Helper()
	b, err := os.ReadFile(countFile)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "x")
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l
}

func TestAddrsLooksUpOncePerTTLAndFollowsAMove(t *testing.T) {
	d, ipFile, countFile := fakeDocker(t)
	l1 := listen(t, "127.0.0.1:0")
	port := strconv.Itoa(l1.Addr().(*net.TCPAddr).Port)
	if err := os.WriteFile(ipFile, []byte("127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := NewAddrs(d, time.Hour)
	ctx := context.Background()
	for range 5 {
		c, err := a.Dial(ctx, "tcp", "kvdir-router1:"+port, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if n := calls(t, countFile); n != 1 {
		t.Fatalf("5 dials looked the address up %d times, want 1", n)
	}
	// The container comes back at another address: the remembered one
	// refuses, and the dial looks again and reaches the new one.
	l1.Close()
	l2 := listen(t, "127.0.0.2:"+port)
	defer l2.Close()
	if err := os.WriteFile(ipFile, []byte("127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := a.Dial(ctx, "tcp", "kvdir-router1:"+port, time.Second)
	if err != nil {
		t.Fatalf("dial after the move: %v", err)
	}
	c.Close()
	if n := calls(t, countFile); n != 2 {
		t.Fatalf("%d look-ups after the move, want 2", n)
	}
	// An IP address is dialled as it is.
	c, err = a.Dial(ctx, "tcp", "127.0.0.2:"+port, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := calls(t, countFile); n != 2 {
		t.Fatalf("dialling an IP address looked up a container (%d look-ups)", n)
	}
}

func TestAddrsNoAddressIsAnError(t *testing.T) {
	d, ipFile, _ := fakeDocker(t)
	if err := os.WriteFile(ipFile, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := NewAddrs(d, time.Hour).Dial(context.Background(), "tcp", "kvdir-gone:80", time.Second)
	if err == nil || !strings.Contains(err.Error(), "address of kvdir-gone") {
		t.Fatalf("dial of a container without an address: %v", err)
	}
}
