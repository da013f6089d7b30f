package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/admission"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/testkit"
)

// blockingEngine is one worker whose completions wait for release: a
// request it holds has not produced its first byte, so its prompt counts
// as the worker's queued prefill.
func blockingEngine(t *testing.T) (*upstream, chan struct{}) {
	release := make(chan struct{})
	up := newUpstream(t, "m", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		okJSON(0)(w, r)
	})
	return up, release
}

// lateRouter is a router over up whose knee is one token: a worker with any
// request waiting for its first byte is past it.
func lateRouter(t *testing.T, up *upstream, queue int, wait time.Duration) (*Server, string) {
	return testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, func(c *Config) {
		c.AdmissionQueue, c.AdmissionMaxWait = queue, wait
		c.AdmissionKnee = admission.Knee{ChunkTokens: 1, Steps: 1}
	})
}

type result struct {
	status int
	header http.Header
	body   string
	err    error
}

// postAsync posts chatBody in the background.
func postAsync(ctx context.Context, url string) <-chan result {
	out := make(chan result, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+PathChat, strings.NewReader(chatBody))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	}()
	return out
}

func waitResult(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10 s")
	}
	return result{}
}

// holdOne sends a request that occupies the worker, and a second one
// (with ctx), and waits until the second is held at the router.
func holdOne(ctx context.Context, t *testing.T, s *Server, up *upstream, url string) (first, second <-chan result) {
	t.Helper()
	first = postAsync(context.Background(), url)
	testkit.Eventually(t, 5*time.Second, "first request at the engine", func() (bool, string) {
		return up.hits.Load() == 1, ""
	})
	second = postAsync(ctx, url)
	testkit.Eventually(t, 5*time.Second, "second request held", func() (bool, string) {
		return s.adm.n.Load() == 1, ""
	})
	return first, second
}

func histogramCount(t *testing.T, s *Server, family, label string) uint64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabelValue(m, label) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// TestAdmissionHoldsThenPlaces: with the only worker past its knee, a
// request waits at the router, not at the engine, and is placed as soon as
// the worker's first byte brings it below the knee.
func TestAdmissionHoldsThenPlaces(t *testing.T) {
	up, release := blockingEngine(t)
	s, url := lateRouter(t, up, 8, time.Minute)
	first, second := holdOne(context.Background(), t, s, up, url)
	if n := up.hits.Load(); n != 1 {
		t.Fatalf("engine received %d requests while the second was held, want 1", n)
	}
	close(release)
	for i, ch := range []<-chan result{first, second} {
		r := waitResult(t, ch)
		if r.err != nil || r.status != http.StatusOK || r.header.Get(HeaderWorker) != "w0" {
			t.Fatalf("request %d: %d %v %q", i+1, r.status, r.err, r.body)
		}
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("engine received %d requests, want 2", n)
	}
	if got := histogramCount(t, s, "kvdir_router_admission_wait_seconds", AdmissionPlaced); got != 1 {
		t.Fatalf("wait histogram counted %d placed requests, want 1", got)
	}
	if s.adm.n.Load() != 0 {
		t.Fatalf("queue depth %d after both were served", s.adm.n.Load())
	}
}

// checkRefusal checks an admission refusal: status, a Retry-After of at
// least one second and an OpenAI-style error body naming the flag.
func checkRefusal(t *testing.T, r result, status int, flag string) {
	t.Helper()
	if r.err != nil || r.status != status {
		t.Fatalf("got %d %v %q, want %d", r.status, r.err, r.body, status)
	}
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || secs < 1 {
		t.Fatalf("Retry-After %q, want whole seconds >= 1", r.header.Get("Retry-After"))
	}
	var e openai.Error
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Code != status || !strings.Contains(e.Error.Message, flag) {
		t.Fatalf("body %q (%v): want an error of code %d naming %s", r.body, err, status, flag)
	}
}

func TestAdmissionQueueFull(t *testing.T) {
	up, release := blockingEngine(t)
	s, url := lateRouter(t, up, 1, time.Minute)
	first, second := holdOne(context.Background(), t, s, up, url)
	checkRefusal(t, waitResult(t, postAsync(context.Background(), url)), http.StatusTooManyRequests, "--admission-queue")
	if got := counterValue(t, s, "kvdir_router_admission_rejections_total", AdmissionFull); got != 1 {
		t.Fatalf("queue-full rejections %v, want 1", got)
	}
	close(release)
	for _, ch := range []<-chan result{first, second} {
		if r := waitResult(t, ch); r.status != http.StatusOK {
			t.Fatalf("held request: %d %q", r.status, r.body)
		}
	}
}

func TestAdmissionMaxWait(t *testing.T) {
	up, release := blockingEngine(t)
	defer close(release)
	s, url := lateRouter(t, up, 8, 100*time.Millisecond)
	_, second := holdOne(context.Background(), t, s, up, url)
	checkRefusal(t, waitResult(t, second), http.StatusServiceUnavailable, "--admission-max-wait")
	if got := counterValue(t, s, "kvdir_router_admission_rejections_total", AdmissionMaxWait); got != 1 {
		t.Fatalf("max-wait rejections %v, want 1", got)
	}
	if s.adm.n.Load() != 0 || up.hits.Load() != 1 {
		t.Fatalf("after the timeout: depth %d, engine requests %d; want 0 and 1", s.adm.n.Load(), up.hits.Load())
	}
}

// TestAdmissionCancelled: a client that goes away while held leaves the
// queue, and its request never reaches the engine.
func TestAdmissionCancelled(t *testing.T) {
	up, release := blockingEngine(t)
	s, url := lateRouter(t, up, 8, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	first, second := holdOne(ctx, t, s, up, url)
	cancel()
	if r := waitResult(t, second); r.err == nil {
		t.Fatalf("cancelled request answered %d", r.status)
	}
	testkit.Eventually(t, 5*time.Second, "cancelled request left the queue", func() (bool, string) {
		return s.adm.n.Load() == 0 && histogramCount(t, s, "kvdir_router_admission_wait_seconds", AdmissionCancelled) == 1, ""
	})
	close(release)
	if r := waitResult(t, first); r.status != http.StatusOK {
		t.Fatalf("first request: %d %q", r.status, r.body)
	}
	// A later request is placed at once: nothing of the cancelled one is
	// left to block the queue.
	if r := waitResult(t, postAsync(context.Background(), url)); r.status != http.StatusOK {
		t.Fatalf("request after the cancellation: %d %q", r.status, r.body)
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("engine received %d requests, want 2 (the cancelled one never)", n)
	}
}

// TestAdmissionOff: a zero Config places at once
// even when the worker is busy (late binding is DefaultConfig's).
func TestAdmissionOff(t *testing.T) {
	up, release := blockingEngine(t)
	defer close(release)
	s, url := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	if s.adm != nil {
		t.Fatal("zero Config enabled late binding")
	}
	postAsync(context.Background(), url)
	postAsync(context.Background(), url)
	testkit.Eventually(t, 5*time.Second, "both requests at the engine", func() (bool, string) {
		return up.hits.Load() == 2, ""
	})
}
