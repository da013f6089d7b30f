package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
	"github.com/kvdir/kvdir/internal/testkit/gateway"
)

// eppAnswer is what a test reads of a request through a gateway.
type eppAnswer struct {
	*gateway.Exchange
	worker   string // the worker the picker's response headers name
	fallback string
	prompt   int
	cached   int
	content  string
}

// viaGateway sends c through the endpoint picker at g and, when it picks
// an endpoint, to that engine, as Envoy would.
func viaGateway(ctx context.Context, g *gateway.Gateway, session string, c chatRequest, subset []string, hasSubset bool) (eppAnswer, error) {
	b, _ := json.Marshal(c)
	h := http.Header{"Content-Type": {"application/json"}}
	if session != "" {
		h.Set("X-Session-Id", session)
	}
	x, err := g.Do(ctx, &gateway.Request{Path: router.PathChat, Header: h, Body: b, Subset: subset, HasSubset: hasSubset})
	if err != nil {
		return eppAnswer{}, err
	}
	a := eppAnswer{Exchange: x}
	if x.Immediate != nil || x.Status != http.StatusOK {
		return a, nil
	}
	a.worker, a.fallback = x.ResponseHeader.Get(router.HeaderWorker), x.ResponseHeader.Get(router.HeaderFallback)
	a.prompt, a.cached, a.content, err = decodeChat(x.Body)
	return a, err
}

// labelledSum adds up the series of a metric family on url's /metrics whose
// labels contain every one of labels (e.g. `outcome="ok"`).
func labelledSum(url, name string, labels ...string) (float64, error) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var total float64
lines:
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", line, err)
		}
		total += v
	}
	return total, nil
}

// dialEPP connects a gateway to a router's endpoint picker; it sends each
// request body in three messages.
func dialEPP(t *testing.T, r *fleet.Router) *gateway.Gateway {
	t.Helper()
	g, err := gateway.Dial(r.EPPAddr)
	if err != nil {
		t.Fatal(err)
	}
	g.BodyMessages = 3
	t.Cleanup(func() { g.Close() })
	return g
}

// TestEndpointPicker runs real processes: a 3-node directory, two engine
// simulators with their agents, and two routers in endpoint picker mode
// (--mode epp) that do not share intents, driven by an Envoy-like data
// plane (internal/testkit/gateway) that sends each request to the endpoint
// the picker names and feeds the engine's response back.
func TestEndpointPicker(t *testing.T) {
	ctx := context.Background()
	f := fleet.New(t, fleet.Config{Engines: 2, Routers: 2, EPP: true,
		EngineArgs: []string{"--time-scale", "0.02", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "kvdir", "--match-timeout", "50ms", "--share-intents=false"}})
	g0, g1 := dialEPP(t, f.Routers[0]), dialEPP(t, f.Routers[1])
	// Picker 1's data plane streams both bodies in full duplex, as the
	// inference extension's reference Envoy configuration does: the client
	// gets only the response the picker streams back.
	g1.FullDuplex, g1.FullDuplexResponse = true, true
	endpoint := map[string]string{} // worker id -> pod endpoint
	for _, e := range f.Engines {
		endpoint[e.WorkerID] = strings.TrimPrefix(e.URL, "http://")
	}

	t.Run("health", func(t *testing.T) {
		hc := healthpb.NewHealthClient(g0.Conn())
		// The statuses follow /readyz within a quarter second.
		for _, svc := range []string{router.EPPLiveness, router.EPPReadiness, router.EPPServiceName} {
			testkit.Eventually(t, 5*time.Second, "health "+svc+" serving", func() (bool, string) {
				r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING, fmt.Sprintf("%v %v", r.GetStatus(), err)
			})
		}
	})

	// Turn 2 of each session is steered to turn 1's worker. Turn 1 goes
	// through picker 0, turn 2 through picker 1, which never saw the
	// session: it learns where the prefix lives from the directory.
	var home string // a session's worker, for the subset test
	var homeReq chatRequest
	t.Run("turn 2 follows turn 1", func(t *testing.T) {
		for i := range 4 {
			sess := fmt.Sprintf("epp-session-%d", i)
			c := chatRequest{Model: "llama3-8b", MaxTokens: 4, Messages: []message{
				{Role: "system", Content: systemPrompt(300 + i)}, {Role: "user", Content: fmt.Sprintf("Question %d: what does a prefix cache save?", i)}}}
			a1, err := viaGateway(ctx, g0, sess, c, nil, false)
			if err != nil || a1.Status != 200 {
				t.Fatalf("turn 1 of %s: %v %+v", sess, err, a1)
			}
			if a1.Endpoint != endpoint[a1.worker] || a1.MetadataEndpoint != a1.Endpoint {
				t.Fatalf("turn 1 of %s: endpoint %q (metadata %q) for worker %s at %q", sess, a1.Endpoint, a1.MetadataEndpoint, a1.worker, endpoint[a1.worker])
			}
			c.Messages = append(c.Messages, message{Role: "assistant", Content: a1.content}, message{Role: "user", Content: "And what does it cost?"})
			testkit.Eventually(t, 15*time.Second, "the directory to hold turn 1's blocks", func() (bool, string) {
				e, err := explainWith(ctx, f.Routers[1].URL, sess, c, nil)
				if err != nil {
					return false, err.Error()
				}
				return e.Pick == a1.worker && e.PredictedCachedTokens > 0 && e.Fallback == "",
					fmt.Sprintf("pick %s (turn 1 on %s), predicted %d, fallback %q", e.Pick, a1.worker, e.PredictedCachedTokens, e.Fallback)
			})
			a2, err := viaGateway(ctx, g1, sess, c, nil, false)
			if err != nil || a2.Status != 200 {
				t.Fatalf("turn 2 of %s: %v %+v", sess, err, a2)
			}
			if a2.Endpoint != a1.Endpoint || a2.worker != a1.worker || a2.fallback != "" {
				t.Fatalf("%s: turn 1 on %s, turn 2 on %s (%s, fallback %q)", sess, a1.Endpoint, a2.Endpoint, a2.worker, a2.fallback)
			}
			if a2.cached < (a1.prompt/16-1)*16 || a2.cached == 0 {
				t.Fatalf("%s: engine reported %d cached tokens of turn 2 (turn 1 had %d prompt tokens)", sess, a2.cached, a1.prompt)
			}
			home, homeReq = a1.worker, c
		}
		// The pickers observed each response to its end: nothing in flight,
		// every request counted ok, the sessions recorded in the directory.
		for i, r := range f.Routers {
			testkit.Eventually(t, 10*time.Second, "router accounting", func() (bool, string) {
				ok, err1 := labelledSum(r.URL, "kvdir_router_requests_total", `outcome="ok"`)
				inflight, err2 := labelledSum(r.URL, "kvdir_router_inflight")
				batches, err3 := labelledSum(r.URL, "kvdir_router_session_batches_total", `result="ok"`)
				return errors.Join(err1, err2, err3) == nil && ok == 4 && inflight == 0 && batches > 0,
					fmt.Sprintf("router %d: ok %v, in flight %v, session batches written %v (%v)", i, ok, inflight, batches, errors.Join(err1, err2, err3))
			})
		}
	})

	t.Run("subset hint", func(t *testing.T) {
		if home == "" {
			t.Skip("no session placed")
		}
		var other string
		for id := range endpoint {
			if id != home {
				other = id
			}
		}
		// The session's prefix lives on home; the hint allows only the other.
		for i := range 3 {
			a, err := viaGateway(ctx, g1, "", homeReq, []string{"10.255.0.9:8000", endpoint[other]}, true)
			if err != nil || a.Status != 200 {
				t.Fatalf("hinted request %d: %v %+v", i, err, a)
			}
			if a.Endpoint != endpoint[other] || a.worker != other {
				t.Fatalf("hinted request %d: endpoint %q (worker %s), hint allows only %s at %s", i, a.Endpoint, a.worker, other, endpoint[other])
			}
		}
		for name, subset := range map[string][]string{"empty": {}, "non-matching": {"10.255.0.9:8000", "10.255.0.10:8000"}} {
			a, err := viaGateway(ctx, g1, "", homeReq, subset, true)
			if err != nil {
				t.Fatal(err)
			}
			if a.Immediate == nil || a.Status != http.StatusServiceUnavailable || a.Endpoint != "" || a.MetadataEndpoint != "" ||
				!strings.Contains(string(a.Body), "no eligible endpoint") {
				t.Fatalf("%s subset: status %d, endpoint %q/%q, body %s", name, a.Status, a.Endpoint, a.MetadataEndpoint, a.Body)
			}
		}
	})

	t.Run("not an OpenAI request", func(t *testing.T) {
		x, err := g0.Do(ctx, &gateway.Request{Path: router.PathChat, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("GET me a pony")})
		if err != nil {
			t.Fatal(err)
		}
		if x.Immediate == nil || x.Status != http.StatusBadRequest || x.Endpoint != "" || x.MetadataEndpoint != "" ||
			!strings.Contains(string(x.Body), "malformed JSON body") {
			t.Fatalf("status %d, endpoint %q/%q, body %s", x.Status, x.Endpoint, x.MetadataEndpoint, x.Body)
		}
	})

	// Kill every directory node: requests are still picked, by the
	// fallback policy, and the response says so, as the proxy's does.
	t.Run("directory outage", func(t *testing.T) {
		for _, n := range f.Directory.Nodes {
			n.Kill9()
		}
		for i := range 12 {
			a, err := viaGateway(ctx, g0, fmt.Sprintf("nodir-%d", i%4), chatRequest{Model: "llama3-8b", MaxTokens: 4,
				Messages: []message{{Role: "system", Content: systemPrompt(400 + i%4)}, {Role: "user", Content: fmt.Sprintf("hello %d", i)}}}, nil, false)
			if err != nil || a.Status != 200 || a.Endpoint == "" {
				t.Fatalf("request %d with the directory down: %v %+v", i, err, a)
			}
			if a.fallback == "" || a.Endpoint != endpoint[a.worker] {
				t.Fatalf("request %d: endpoint %q, worker %s, fallback %q with the directory down", i, a.Endpoint, a.worker, a.fallback)
			}
		}
		fb, err := labelledSum(f.Routers[0].URL, "kvdir_router_fallbacks_total")
		if err != nil || fb < 12 {
			t.Fatalf("fallbacks counted: %v %v", fb, err)
		}
	})
}
