package router

import (
	"fmt"
	"net"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// heapObjectBytes is the heap memory occupied by live objects after a
// collection (runtime/metrics' /memory/classes/heap/objects:bytes).
func heapObjectBytes() uint64 {
	runtime.GC()
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// TestHundredSlowBodiesHeapBound opens 100 connections to a router with
// its default body limit (8 MiB), each announcing a body of that size and
// sending 32 KiB of it, then stalling: once the router is reading all 100
// bodies, the heap its live objects occupy has grown by less than 24 MiB
// (stated bound: 240 KiB a connection, for the 64 KiB body buffer and
// net/http's per-connection buffers, against the 800 MiB that reserving
// each Content-Length would take). Measured with runtime/metrics after a
// collection, not timed.
func TestHundredSlowBodiesHeapBound(t *testing.T) {
	const (
		conns  = 100
		prefix = 32 << 10
		bound  = 24 << 20
	)
	up := newUpstream(t, "m", okJSON(0))
	s, url := testRouter(t, "least-load", []StaticWorker{{ID: "a", Address: up.URL, Model: "m"}}, func(c *Config) {
		c.MaxBodyBytes, c.BodyTimeout = DefaultMaxBodyBytes, time.Hour // held for the whole test
	})
	addr := strings.TrimPrefix(url, "http://")
	base := heapObjectBytes()
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"",
			PathChat, DefaultMaxBodyBytes)
		if _, err := c.Write([]byte(head + strings.Repeat("x", prefix-len(head)))); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	testkit.Eventually(t, 20*time.Second, "every body being read", func() (bool, string) {
		n := bodiesReading(t, s)
		return n == conns, fmt.Sprintf("%v bodies being read", n)
	})
	held := int64(heapObjectBytes()) - int64(base)
	t.Logf("%d slow bodies: heap objects grew by %.1f MiB (bound %d MiB)", conns, float64(held)/(1<<20), bound>>20)
	if held > bound {
		t.Fatalf("%d slow bodies hold %d bytes of heap, want under %d", conns, held, bound)
	}
}
