package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/httpserve"
	"github.com/kvdir/kvdir/internal/testkit"
)

// Balancer stands where a Kubernetes Service or a client-side load balancer
// stands in front of the routers: the load generator sends to its fronts,
// and front i forwards to router i while that router is healthy, otherwise
// to the next healthy one. A router is healthy while its /readyz answers
// 200 (checked every HealthEvery) and until a request to it fails before
// any response byte; such a request is sent to the next router, as a
// Service's connection-level retry would (kube-proxy or the client dials
// another endpoint). Once response headers have arrived nothing is retried:
// if the stream then breaks, the client sees the failure.
//
// Every request is recorded (Records): which router and worker served it,
// when it started, got its headers and ended, and how it failed.
type Balancer struct {
	routers []string // base URLs
	healthy []atomic.Bool
	client  *http.Client
	hc      *http.Client
	servers []*http.Server
	fronts  []string

	mu   sync.Mutex
	recs []*Record

	stop chan struct{}
	done chan struct{}
}

// Record is one request through the Balancer.
type Record struct {
	Front  int       // the front it arrived at (the router it prefers)
	Router int       // the router that answered (-1: none)
	Start  time.Time // arrival at the front
	Header time.Time // response headers from the router (zero: none)
	End    time.Time // end of the response (zero: still running)
	Status int
	Worker string // X-Kvdir-Worker
	Prompt []uint32
	// Rerouted is set when a router failed before any response byte and
	// the request went to another one.
	Rerouted bool
	// RerouteErr is why the first router tried failed, when Rerouted.
	RerouteErr string
	// Err is why the client saw a failure ("" for a complete 200).
	Err string
	// ClientClosed is set when the client closed the connection before
	// the end of the response (the replay client stops reading at the
	// stream's [DONE]); that is no failure.
	ClientClosed bool
}

// Failed reports whether the client saw the request fail.
func (r *Record) Failed() bool { return !r.End.IsZero() && (r.Err != "" || r.Status != http.StatusOK) }

// HealthEvery is the Balancer's health-check interval.
const HealthEvery = 100 * time.Millisecond

// Dialer opens a connection to addr ("host:port"), as net.Dialer's
// DialContext does.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// NewBalancer starts one front per router on loopback. dial, if not nil,
// opens the connections to the routers (default: a TCP dial).
func NewBalancer(routers []string, dial Dialer) (*Balancer, error) {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	if len(routers) == 0 {
		return nil, errors.New("chaos: balancer needs at least one router")
	}
	b := &Balancer{
		routers: routers,
		healthy: make([]atomic.Bool, len(routers)),
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 256, DisableCompression: true,
			// Below the router's idle timeout (120 s): a connection the
			// router closes as idle just as a request goes out on it would
			// fail before any byte, as if the router were gone.
			IdleConnTimeout: 60 * time.Second,
			DialContext:     dial,
		}},
		hc:   &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DialContext: dial}},
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	for i := range routers {
		b.healthy[i].Store(true)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, s := range b.servers {
				_ = s.Close()
			}
			return nil, fmt.Errorf("chaos: balancer front %d: %w", i, err)
		}
		// Idle connections, fresh ones too (the load generator's client
		// parks connections it dialed and did not need), are kept an hour:
		// the client keeps them without limit, and a request sent on one
		// the front closes meanwhile fails with EOF.
		srv := &http.Server{Handler: b.front(i), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Hour}
		b.servers = append(b.servers, srv)
		b.fronts = append(b.fronts, "http://"+ln.Addr().String())
		go func() { _ = httpserve.Serve(srv, ln) }()
	}
	go b.healthLoop()
	return b, nil
}

// Fronts returns the fronts' base URLs, front i preferring router i.
func (b *Balancer) Fronts() []string { return b.fronts }

// Healthy reports whether router i is considered healthy.
func (b *Balancer) Healthy(i int) bool { return b.healthy[i].Load() }

// Close stops the fronts and the health checks.
func (b *Balancer) Close() {
	select {
	case <-b.stop:
		return
	default:
	}
	close(b.stop)
	for _, s := range b.servers {
		_ = s.Close()
	}
	<-b.done
}

// Records returns copies of the records of requests that arrived at or
// after since.
func (b *Balancer) Records(since time.Time) []Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Record
	for _, r := range b.recs {
		if !r.Start.Before(since) {
			out = append(out, *r)
		}
	}
	return out
}

// healthLoop checks every router's /readyz until Close.
func (b *Balancer) healthLoop() {
	defer close(b.done)
	t := time.NewTicker(HealthEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for i, u := range b.routers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok := false
				if resp, err := b.hc.Get(u + "/readyz"); err == nil {
					ok = resp.StatusCode == http.StatusOK
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				b.healthy[i].Store(ok)
			}()
		}
		wg.Wait()
	}
}

// order returns the routers to try for front f: the healthy ones starting
// with f, or all of them when none is healthy.
func (b *Balancer) order(f int) []int {
	n := len(b.routers)
	var healthy, all []int
	for k := range n {
		i := (f + k) % n
		all = append(all, i)
		if b.healthy[i].Load() {
			healthy = append(healthy, i)
		}
	}
	if len(healthy) == 0 {
		return all
	}
	return healthy
}

func (b *Balancer) update(r *Record, f func(*Record)) {
	b.mu.Lock()
	f(r)
	b.mu.Unlock()
}

// front is the handler of front f.
func (b *Balancer) front(f int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := &Record{Front: f, Router: -1, Start: time.Now()}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			b.mu.Lock()
			rec.End, rec.Err = time.Now(), "reading the request: "+err.Error()
			b.recs = append(b.recs, rec)
			b.mu.Unlock()
			http.Error(w, rec.Err, http.StatusBadRequest)
			return
		}
		var p struct {
			Prompt []uint32 `json:"prompt"`
		}
		_ = json.Unmarshal(body, &p) // chat requests have no token prompt
		rec.Prompt = p.Prompt
		b.mu.Lock()
		b.recs = append(b.recs, rec)
		b.mu.Unlock()

		// The request to the router outlives the client's connection: a
		// client that stops reading at [DONE] and closes must not cancel
		// it, or its connection to the router is closed rather than
		// reused (see drain).
		upCtx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), 5*time.Minute)
		defer cancel()
		var resp *http.Response
		var lastErr error
		for _, i := range b.order(f) {
			up, err := http.NewRequestWithContext(upCtx, req.Method, b.routers[i]+req.URL.RequestURI(), bytes.NewReader(body))
			if err != nil {
				lastErr = err
				break
			}
			for _, h := range []string{"Content-Type", "X-Session-Id", "Authorization"} {
				if v := req.Header.Get(h); v != "" {
					up.Header.Set(h, v)
				}
			}
			var conn connInfo
			up = up.WithContext(httptrace.WithClientTrace(upCtx, conn.trace()))
			resp, err = b.client.Do(up)
			if err == nil {
				b.update(rec, func(r *Record) { r.Router, r.Header, r.Status = i, time.Now(), resp.StatusCode })
				break
			}
			lastErr = err
			if req.Context().Err() != nil {
				break
			}
			// Nothing came back: this router is gone or going; the next
			// one gets the request.
			b.healthy[i].Store(false)
			b.update(rec, func(r *Record) {
				if !r.Rerouted {
					r.RerouteErr = fmt.Sprintf("router %d: %v (%s)", i+1, err, conn.String())
				}
				r.Rerouted = true
			})
		}
		if resp == nil {
			b.update(rec, func(r *Record) { r.End, r.Err = time.Now(), fmt.Sprintf("no router answered: %v", lastErr) })
			http.Error(w, rec.Err, http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		b.update(rec, func(r *Record) { r.Worker = resp.Header.Get("X-Kvdir-Worker") })
		for k, v := range resp.Header {
			if k == "Content-Length" {
				continue
			}
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		fl, _ := w.(http.Flusher)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					b.update(rec, func(r *Record) { r.End, r.ClientClosed = time.Now(), true })
					drain(resp.Body)
					return
				}
				if fl != nil {
					fl.Flush()
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil && req.Context().Err() != nil {
				b.update(rec, func(r *Record) { r.End, r.ClientClosed = time.Now(), true })
				drain(resp.Body)
				return
			}
			if err != nil {
				b.update(rec, func(r *Record) { r.End, r.Err = time.Now(), "response broke: "+err.Error() })
				// Abort the client's connection so that it sees the
				// failure, as it would have from the router itself.
				panic(http.ErrAbortHandler)
			}
		}
		b.update(rec, func(r *Record) {
			r.End = time.Now()
			if r.Status != http.StatusOK {
				r.Err = fmt.Sprintf("status %d", r.Status)
			}
		})
	})
}

// connInfo is what a request's client trace saw of its connection, to
// tell a router that closed a fresh connection from one that closed a
// reused one just as a request went out on it.
type connInfo struct {
	mu     sync.Mutex
	got    bool
	info   httptrace.GotConnInfo
	at     time.Time
	wrote  time.Time
	local  string
	remote string
}

func (c *connInfo) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.got, c.info, c.at = true, info, time.Now()
			if info.Conn != nil {
				c.local, c.remote = info.Conn.LocalAddr().String(), info.Conn.RemoteAddr().String()
			}
		},
		WroteRequest: func(httptrace.WroteRequestInfo) {
			c.mu.Lock()
			c.wrote = time.Now()
			c.mu.Unlock()
		},
	}
}

func (c *connInfo) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.got {
		return "no connection"
	}
	s := fmt.Sprintf("conn %s->%s reused=%v", c.local, c.remote, c.info.Reused)
	if c.info.WasIdle {
		s += fmt.Sprintf(" idle %v", c.info.IdleTime.Round(time.Millisecond))
	}
	if !c.wrote.IsZero() {
		s += fmt.Sprintf(", request written %v after, failed %v after that",
			c.wrote.Sub(c.at).Round(time.Millisecond), time.Since(c.wrote).Round(time.Millisecond))
	}
	return s
}

// drain reads what is left of a router's response (the end of a stream
// whose client stopped at [DONE]), so that its connection goes back to
// the pool: closing an unread body closes the connection, and one new
// connection per request through the published port made the port's proxy
// drop some (the client saw EOF) on the loaded machine.
func drain(body io.Reader) {
	_, _ = io.CopyN(io.Discard, body, 1<<20)
}

// waitRouters waits until every router is healthy.
func (b *Balancer) waitRouters(ctx context.Context, timeout time.Duration) error {
	return testkit.Poll(ctx, timeout, "every router healthy", func() (bool, string) {
		for i := range b.routers {
			if !b.healthy[i].Load() {
				return false, fmt.Sprintf("router %s not ready", b.routers[i])
			}
		}
		return true, ""
	})
}
