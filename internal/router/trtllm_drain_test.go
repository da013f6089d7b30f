package router

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// trtllm-serve drains its iteration stats on every read: a busy engine
// whose stats another reader just took answers []. The router keeps the
// last load for noStatsHold, never counts such a read as a failure, and
// takes the engine as idle once the hold has passed.
func TestTRTLLMEmptyStatsHoldTheLastLoad(t *testing.T) {
	var reads atomic.Int32
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if reads.Add(1) == 1 {
			_, _ = io.WriteString(w, `[{"numActiveRequests": 3, "numQueuedRequests": 2, "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 40}}]`)
			return
		}
		_, _ = io.WriteString(w, `[]`)
	}))
	defer eng.Close()
	down := 0
	s := &scraper{client: eng.Client(), interval: time.Second, failures: 3, noStatsHold: time.Minute,
		onError: func(*worker, error) { down++ }}
	w := &worker{id: "trt", address: eng.URL, stop: make(chan struct{})}
	ctx := context.Background()

	s.once(ctx, w)
	if l := w.load(); l.Running != 3 || l.Waiting != 2 || l.KVUsage != 0.4 {
		t.Fatalf("first read: %+v", l)
	}
	for range 5 {
		s.once(ctx, w)
	}
	if l := w.load(); l.Running != 3 || l.Waiting != 2 || l.KVUsage != 0.4 {
		t.Fatalf("within the hold, empty reads changed the load: %+v", l)
	}
	if down != 0 || w.scrapeKO.Load() != 0 {
		t.Fatalf("empty reads counted as failures: down %d, consecutive failures %d", down, w.scrapeKO.Load())
	}

	s.noStatsHold = time.Nanosecond // the hold has passed
	s.once(ctx, w)
	if l := w.load(); l.Running != 0 || l.Waiting != 0 || l.KVUsage != 0 {
		t.Fatalf("past the hold, an engine with no iteration is not idle: %+v", l)
	}
	if reads.Load() != 7 {
		t.Fatalf("%d reads, want 7", reads.Load())
	}
}
