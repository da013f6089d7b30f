package router

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/gateway"
)

// testEPP serves s's endpoint picker on a loopback port and returns a
// gateway talking to it.
func testEPP(t *testing.T, s *Server) *gateway.Gateway {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	ctx, cancel := context.WithCancel(context.Background())
	s.RegisterEPP(ctx, gs)
	go func() { _ = gs.Serve(ln) }()
	g, err := gateway.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Close()
		gs.Stop()
		cancel()
	})
	return g
}

func hostPort(url string) string { return strings.TrimPrefix(url, "http://") }

// gaugeSum returns the sum of a gauge family's series.
func gaugeSum(t *testing.T, s *Server, family string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == family {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func chatRequest(body string, hdr ...string) *gateway.Request {
	h := http.Header{"Content-Type": {"application/json"}, "Accept-Encoding": {"gzip"}}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	return &gateway.Request{Path: PathChat, Header: h, Body: []byte(body)}
}

// TestEPPPicksAndObserves places a chat request whose body arrives in three
// messages: the answer names the worker's host:port in the header and the
// dynamic metadata, drops Accept-Encoding, and once the gateway has sent
// the request there and fed the engine's response back, the response
// carries the router's headers and the accounting is that of a proxied
// request (ok outcome, the engine's cached tokens, nothing in flight).
func TestEPPPicksAndObserves(t *testing.T) {
	up := newUpstream(t, "m", okJSON(7))
	s, _ := testRouter(t, "least-load", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	g.BodyMessages = 3

	x, err := g.Do(t.Context(), chatRequest(chatBody, DefaultSessionHeader, "sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	if x.Immediate != nil {
		t.Fatalf("refused: %d %s", x.Status, x.Body)
	}
	if x.Endpoint != hostPort(up.URL) || x.MetadataEndpoint != x.Endpoint {
		t.Fatalf("endpoint: header %q, metadata %q; want %q in both", x.Endpoint, x.MetadataEndpoint, hostPort(up.URL))
	}
	if x.RequestHeader.Get("Accept-Encoding") != "" || x.RequestHeader.Get(DefaultSessionHeader) != "sess-1" {
		t.Fatalf("request headers after the picker: %v", x.RequestHeader)
	}
	if up.hits.Load() != 1 || x.Status != http.StatusOK || !strings.Contains(string(x.Body), `"cached_tokens":7`) {
		t.Fatalf("upstream hits %d, status %d, body %s", up.hits.Load(), x.Status, x.Body)
	}
	if x.ResponseHeader.Get(HeaderWorker) != "w0" || x.ResponseHeader.Get(HeaderPolicy) != "least-load" {
		t.Fatalf("response headers: %v", x.ResponseHeader)
	}
	testkit.Eventually(t, 5*time.Second, "the response accounted", func() (bool, string) {
		ok := counterValue(t, s, "kvdir_router_requests_total", OutcomeOK)
		cached := counterValue(t, s, "kvdir_router_engine_cached_tokens_total", "w0")
		inflight := gaugeSum(t, s, "kvdir_router_inflight")
		return ok == 1 && cached == 7 && inflight == 0 && s.pool.snapshot()["w0"].queuedPrefill.Load() == 0,
			fmt.Sprintf("ok %v, cached %v, in flight %v", ok, cached, inflight)
	})
}

// TestEPPSubsetHint checks that only the hinted endpoints are picked, and
// that an empty hint, or one naming no worker, is a 503 without endpoint.
func TestEPPSubsetHint(t *testing.T) {
	a := newUpstream(t, "m", okJSON(0))
	b := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "a", Address: a.URL, Model: "m"}, {ID: "b", Address: b.URL, Model: "m"}}, nil)
	g := testEPP(t, s)

	for i := range 4 {
		req := chatRequest(chatBody)
		req.Subset, req.HasSubset = []string{"10.255.0.1:8000", hostPort(b.URL)}, true
		x, err := g.Do(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if x.Endpoint != hostPort(b.URL) {
			t.Fatalf("request %d with the hint naming b: endpoint %q (status %d %s)", i, x.Endpoint, x.Status, x.Body)
		}
	}
	if a.hits.Load() != 0 || b.hits.Load() != 4 {
		t.Fatalf("hits: a %d, b %d", a.hits.Load(), b.hits.Load())
	}
	for _, c := range []struct {
		name   string
		subset []string
		want   string
	}{
		{"empty", []string{}, "lists no endpoint"},
		{"no worker", []string{"10.255.0.1:8000"}, "none of the 1 endpoints"},
	} {
		req := chatRequest(chatBody)
		req.Subset, req.HasSubset = c.subset, true
		x, err := g.Do(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if x.Immediate == nil || x.Status != http.StatusServiceUnavailable || x.Endpoint != "" || !strings.Contains(string(x.Body), c.want) {
			t.Fatalf("%s subset: status %d, endpoint %q, body %s", c.name, x.Status, x.Endpoint, x.Body)
		}
	}
}

// TestEPPRefusesNonOpenAI checks that a request the router cannot place
// gets a 400 immediate response with the reason, and no endpoint.
func TestEPPRefusesNonOpenAI(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	g.BodyMessages = 2
	for _, c := range []struct {
		name string
		req  *gateway.Request
		want string
	}{
		{"not JSON", chatRequest("hello, world"), "malformed JSON body"},
		{"no messages", chatRequest(`{"model":"m","input":"x"}`), "messages must be a non-empty array"},
		{"other path", &gateway.Request{Path: "/v1/embeddings", Body: []byte(`{"model":"m","input":"x"}`)}, "not an OpenAI request"},
		{"no body", &gateway.Request{Path: PathChat}, "has no body"},
	} {
		x, err := g.Do(t.Context(), c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if x.Immediate == nil || x.Status != http.StatusBadRequest || x.Endpoint != "" || x.MetadataEndpoint != "" || !strings.Contains(string(x.Body), c.want) {
			t.Fatalf("%s: status %d, endpoint %q/%q, body %s", c.name, x.Status, x.Endpoint, x.MetadataEndpoint, x.Body)
		}
		if ct := x.Immediate.GetHeaders().GetSetHeaders(); len(ct) == 0 || string(ct[0].GetHeader().GetRawValue()) != "application/json" {
			t.Fatalf("%s: immediate response headers %v", c.name, ct)
		}
	}
	if up.hits.Load() != 0 {
		t.Fatalf("the engine got %d requests", up.hits.Load())
	}
	// GET /v1/models is answered by the router, from its workers.
	x, err := g.Do(t.Context(), &gateway.Request{Method: http.MethodGet, Path: "/v1/models"})
	if err != nil {
		t.Fatal(err)
	}
	if x.Immediate == nil || x.Status != http.StatusOK || !strings.Contains(string(x.Body), `"id":"m"`) || x.Endpoint != "" {
		t.Fatalf("GET /v1/models: status %d, endpoint %q, body %s", x.Status, x.Endpoint, x.Body)
	}
}

// TestEPPFullDuplex checks the full-duplex body mode: the headers are
// answered with the pick, after the body, which comes back whole.
func TestEPPFullDuplex(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	g.FullDuplex, g.BodyMessages = true, 4
	x, err := g.Do(t.Context(), chatRequest(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	if x.Endpoint != hostPort(up.URL) || x.MetadataEndpoint != x.Endpoint || x.Status != http.StatusOK {
		t.Fatalf("endpoint %q/%q, status %d %s", x.Endpoint, x.MetadataEndpoint, x.Status, x.Body)
	}
}

// TestEPPStreamEndsReleaseLoad checks that a stream that ends before the
// response (the gateway could not reach the engine, or its client left)
// and one whose response stream breaks off both release the worker.
func TestEPPStreamEndsReleaseLoad(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	w := s.pool.snapshot()["w0"]

	x, err := g.Start(t.Context(), chatRequest(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	if x.Endpoint == "" || w.inFlight.Load() != 1 || w.queuedPrefill.Load() == 0 {
		t.Fatalf("placed: endpoint %q, in flight %d, queued %d", x.Endpoint, w.inFlight.Load(), w.queuedPrefill.Load())
	}
	x.Abort()
	testkit.Eventually(t, 5*time.Second, "the aborted request released", func() (bool, string) {
		return w.inFlight.Load() == 0 && w.queuedPrefill.Load() == 0 && counterValue(t, s, "kvdir_router_requests_total", OutcomeCancelled) == 1,
			fmt.Sprintf("in flight %d, queued %d", w.inFlight.Load(), w.queuedPrefill.Load())
	})

	// A streamed response whose first chunk passed, then the stream ends.
	x, err = g.Start(t.Context(), chatRequest(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Respond(http.StatusOK, http.Header{"Content-Type": {"text/event-stream"}}, [][]byte{[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the streamed request accounted", func() (bool, string) {
		return w.inFlight.Load() == 0 && counterValue(t, s, "kvdir_router_requests_total", OutcomeOK) == 1,
			fmt.Sprintf("in flight %d", w.inFlight.Load())
	})
}

// TestEPPHealth checks the health services: liveness serves at once,
// readiness and the ext_proc service once the router is ready.
func TestEPPHealth(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	hc := healthpb.NewHealthClient(g.Conn())
	for _, svc := range []string{"", EPPLiveness, EPPReadiness, EPPServiceName} {
		testkit.Eventually(t, 5*time.Second, "health "+svc, func() (bool, string) {
			r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING, fmt.Sprintf("%v %v", r.GetStatus(), err)
		})
	}
}

// TestEPPHealthNotReady checks that readiness says NOT_SERVING while the
// router has no routable worker, and liveness still serves.
func TestEPPHealthNotReady(t *testing.T) {
	s, err := New(Config{Policy: mustPolicy(t, "round-robin"), Renderer: mustRenderer(t),
		Static: []StaticWorker{{ID: "w0", Address: "http://127.0.0.1:1", Model: "m"}}})
	if err != nil {
		t.Fatal(err)
	}
	g := testEPP(t, s) // Run never called: the worker list is not loaded
	hc := healthpb.NewHealthClient(g.Conn())
	want := map[string]healthpb.HealthCheckResponse_ServingStatus{EPPLiveness: healthpb.HealthCheckResponse_SERVING,
		EPPReadiness: healthpb.HealthCheckResponse_NOT_SERVING, EPPServiceName: healthpb.HealthCheckResponse_NOT_SERVING}
	for svc, st := range want {
		r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != st {
			t.Fatalf("%s: %v %v, want %v", svc, r.GetStatus(), err, st)
		}
	}
}

func TestSubsetHintParsing(t *testing.T) {
	list := func(vs ...string) *structpb.Value {
		l := &structpb.ListValue{}
		for _, v := range vs {
			l.Values = append(l.Values, structpb.NewStringValue(v))
		}
		return structpb.NewListValue(l)
	}
	md := func(v *structpb.Value) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{EPPSubsetNamespace: {Fields: map[string]*structpb.Value{EPPSubsetKey: v}}}}
	}
	if subsetHint(nil) != nil || subsetHint(&corev3.Metadata{}) != nil {
		t.Fatal("no metadata gave a hint")
	}
	if sub := subsetHint(md(list())); sub == nil || len(sub.list) != 0 {
		t.Fatalf("empty list: %+v", sub)
	}
	sub := subsetHint(md(list("10.0.0.1:8000", " 10.0.0.2:8000", "[FD00::1]:80", "10.0.0.1:8000")))
	if got := strings.Join(sub.list, " "); got != "10.0.0.1:8000 10.0.0.2:8000 [fd00::1]:80" {
		t.Fatalf("list: %q", got)
	}
	if !sub.has(endpointOf("http://[fd00::1]")) || !sub.has(endpointOf("http://10.0.0.2:8000/v1")) || sub.has(endpointOf("https://10.0.0.1")) {
		t.Fatalf("membership wrong for %v", sub.list)
	}
	if sub := subsetHint(md(structpb.NewStringValue("10.0.0.1:8000,10.0.0.3:9000"))); sub == nil || len(sub.list) != 2 {
		t.Fatalf("comma-separated string: %+v", sub)
	}
}

func TestEndpointOf(t *testing.T) {
	for addr, want := range map[string]string{
		"http://10.0.0.7:8000":     "10.0.0.7:8000",
		"http://Pod-A.local:8000/": "pod-a.local:8000",
		"https://10.0.0.7":         "10.0.0.7:443",
		"http://10.0.0.7":          "10.0.0.7:80",
		"http://[fd00::7]:8000":    "[fd00::7]:8000",
	} {
		if got := endpointOf(addr); got != want {
			t.Errorf("endpointOf(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestEPPCalibratesStreamed checks that a streamed response observed
// through the picker feeds the calibrator as a relayed one does: its first
// token and its usage make one observation.
func TestEPPCalibratesStreamed(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	cal, err := costmodel.NewCalibrator(mustProfile(t), costmodel.CalibratorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, func(c *Config) { c.Calibrator = cal })
	g := testEPP(t, s)
	x, err := g.Start(t.Context(), chatRequest(strings.Replace(chatBody, `"max_tokens":4`, `"stream":true`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{
		[]byte("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n"),
		[]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	if err := x.Respond(http.StatusOK, http.Header{"Content-Type": {"text/event-stream"}}, events); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "one calibration observation", func() (bool, string) {
		st := cal.Stats()
		return st.Accepted == 1 && counterValue(t, s, "kvdir_router_engine_cached_tokens_total", "w0") == 16, fmt.Sprintf("%+v", st)
	})
}

// TestEPPFullDuplexResponse checks response_body_mode
// FULL_DUPLEX_STREAMED: the data plane sends on only what the picker
// streams back, so every chunk comes back unchanged, the last with
// end_of_stream, and the response is still accounted (usage, the worker
// released).
func TestEPPFullDuplexResponse(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := testRouter(t, "round-robin", []StaticWorker{{ID: "w0", Address: up.URL, Model: "m"}}, nil)
	g := testEPP(t, s)
	g.FullDuplex, g.FullDuplexResponse = true, true
	x, err := g.Start(t.Context(), chatRequest(strings.Replace(chatBody, `"max_tokens":4`, `"stream":true`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	events := [][]byte{
		[]byte("data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n"),
		[]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	if err := x.Respond(http.StatusOK, http.Header{"Content-Type": {"text/event-stream"}}, events); err != nil {
		t.Fatal(err)
	}
	if want := string(bytes.Join(events, nil)); string(x.Body) != want {
		t.Fatalf("the client got %q, want the engine's body %q", x.Body, want)
	}
	w := s.pool.snapshot()["w0"]
	testkit.Eventually(t, 5*time.Second, "the response accounted", func() (bool, string) {
		return w.inFlight.Load() == 0 && counterValue(t, s, "kvdir_router_requests_total", OutcomeOK) == 1 &&
				counterValue(t, s, "kvdir_router_engine_cached_tokens_total", "w0") == 16,
			fmt.Sprintf("in flight %d", w.inFlight.Load())
	})
}

// TestEPPLateBinding checks that the admission queue holds a picker's
// request as it holds a proxied one: with the only worker past its knee
// (a request placed there has no response yet), the next request waits
// for its pick, the one after it, over the queue's bound, gets an
// immediate 429 with Retry-After, and the held one is picked once the
// first one's response arrives.
func TestEPPLateBinding(t *testing.T) {
	up := newUpstream(t, "m", okJSON(0))
	s, _ := lateRouter(t, up, 1, 10*time.Second)
	g := testEPP(t, s)

	first, err := g.Start(t.Context(), chatRequest(chatBody))
	if err != nil || first.Endpoint == "" {
		t.Fatalf("first request: %v %+v", err, first)
	}
	held := make(chan *gateway.Exchange, 1)
	go func() {
		x, err := g.Start(t.Context(), chatRequest(chatBody))
		if err != nil {
			t.Error(err)
		}
		held <- x
	}()
	testkit.Eventually(t, 5*time.Second, "the second request held", func() (bool, string) {
		d := gaugeSum(t, s, "kvdir_router_admission_queue_depth")
		return d == 1, fmt.Sprintf("depth %v", d)
	})
	x, err := g.Do(t.Context(), chatRequest(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	var retry string
	for _, h := range x.Immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if x.Immediate == nil || x.Status != http.StatusTooManyRequests || retry == "" || x.Endpoint != "" {
		t.Fatalf("over the queue's bound: status %d, retry-after %q, endpoint %q, body %s", x.Status, retry, x.Endpoint, x.Body)
	}
	select {
	case x := <-held:
		t.Fatalf("the held request was answered while the worker was past its knee: %+v", x)
	default:
	}
	if err := first.Respond(http.StatusOK, http.Header{"Content-Type": {"application/json"}}, [][]byte{[]byte(`{"choices":[]}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case x := <-held:
		if x == nil || x.Endpoint != hostPort(up.URL) {
			t.Fatalf("held request: %+v", x)
		}
		x.Abort()
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not picked after the first one's response")
	}
}
