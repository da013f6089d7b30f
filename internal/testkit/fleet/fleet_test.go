package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvdir/kvdir/internal/testkit"
)

// A fleet that fails to start returns the error (having stopped what it
// started) instead of panicking on the way out.
func TestStartFailureReturnsTheError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-binary")
	bins := map[string]string{}
	for _, c := range Commands {
		bins[c] = missing
	}
	f, err := Start(context.Background(), Config{Dir: t.TempDir(), Bins: bins, Engines: 1, Routers: 1})
	if err == nil || f != nil {
		t.Fatalf("Start with missing binaries: fleet %v, error %v", f, err)
	}
}

// TestHelperProcess is not a test: startServing's test runs this binary
// as its child, "-- fail" (exits as a port collision does) or "-- serve
// ADDR" (answers 200 on ADDR until killed).
func TestHelperProcess(t *testing.T) {
	i := slices.Index(os.Args, "--")
	if i < 0 || i+1 >= len(os.Args) {
		t.Skip("a helper process for TestStartServingRetriesOnNewPorts")
	}
	switch os.Args[i+1] {
	case "fail":
		fmt.Fprintln(os.Stderr, "listen tcp 127.0.0.1:1: bind: address already in use")
		os.Exit(1)
	case "serve":
		_ = http.ListenAndServe(os.Args[i+2], http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		os.Exit(1)
	case "idle": // runs without binding anything, as a process about to fail its bind
		select {}
	}
}

// A health check answered by another process that took the port is not
// the child serving: it is started again on new ports.
func TestStartServingChecksWhoAnswers(t *testing.T) {
	if _, err := testkit.ListensOn(os.Getpid(), 1); errors.Is(err, testkit.ErrNoProcNet) {
		t.Skip("no /proc/net/tcp here: startServing trusts the answer")
	}
	attempts := 0
	var thief *http.Server
	defer func() {
		if thief != nil {
			thief.Close()
		}
	}()
	p, ports, err := startServing(context.Background(), "helper", os.Args[0], 1, func(ports []int) ([]string, string) {
		attempts++
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		if attempts == 1 {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			thief = &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
			go thief.Serve(l)
			return []string{"-test.run=^TestHelperProcess$", "--", "idle"}, "http://" + addr
		}
		return []string{"-test.run=^TestHelperProcess$", "--", "serve", addr}, "http://" + addr
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill9()
	if attempts != 2 || !p.Running() {
		t.Fatalf("attempts %d, running %v: want a second attempt, its own server", attempts, p.Running())
	}
	if owns, err := testkit.ListensOn(p.Pid(), ports[0]); err != nil || !owns {
		t.Fatalf("the child serving on port %d: listens %v, %v", ports[0], owns, err)
	}
}

// A process that loses its port to another before it binds is started
// again on new ports.
func TestStartServingRetriesOnNewPorts(t *testing.T) {
	attempts := 0
	p, ports, err := startServing(context.Background(), "helper", os.Args[0], 1, func(ports []int) ([]string, string) {
		attempts++
		addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
		if attempts == 1 {
			return []string{"-test.run=^TestHelperProcess$", "--", "fail"}, "http://" + addr
		}
		return []string{"-test.run=^TestHelperProcess$", "--", "serve", addr}, "http://" + addr
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill9()
	if attempts != 2 || len(ports) != 1 || !p.Running() {
		t.Fatalf("attempts %d, ports %v, running %v: want a second attempt that serves", attempts, ports, p.Running())
	}
}
