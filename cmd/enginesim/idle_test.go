package main

import (
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// The simulator's API server closes a keep-alive connection left idle
// for --http-idle-timeout.
func TestIdleConnectionClosed(t *testing.T) {
	s := startSim(t, "--http-idle-timeout", "1s")
	took, err := testkit.IdleClosed(s.srv.Addr(), "/health", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("closed %v after the response, before the idle timeout", took)
	}
}
