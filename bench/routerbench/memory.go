package routerbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/bench/benchopt"
	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

// MemoryTool is the name the slow-body memory results carry (kvbench
// router-memory).
const MemoryTool = "router-memory"

// MemoryOptions shape a slow-body memory run; a zero field is its default
// (MemoryDefaults).
type MemoryOptions struct {
	// SlowConns connections each announce a body of the router's limit
	// (Content-Length 8 MiB), send SlowPrefix bytes of it and then one
	// byte a second, never finishing within the run.
	SlowConns  int
	SlowPrefix int
	// Clients closed-loop clients send real chat requests for Duration
	// while the slow bodies are held, each as one conversation: its own
	// session id and system prompt of PromptBytes, a new question each
	// time (a new session per request would instead fill the router's
	// session cache, bounded by its --session-cache-bytes, 256 MiB).
	Clients     int
	PromptBytes int
	Duration    time.Duration
	// Engines enginesims (time scale 0: no sleeping) serve them.
	Engines int
	// Dir holds the binaries and data; empty: a temporary directory.
	Dir string
	Log *slog.Logger
}

// MemoryDefaults are the options of the committed figures.
var MemoryDefaults = MemoryOptions{SlowConns: 200, SlowPrefix: 32 << 10, Clients: 500, PromptBytes: 8 << 10,
	Duration: 10 * time.Second, Engines: 2}

// MemoryTargetMB is the router's peak resident memory the run must stay
// under.
const MemoryTargetMB = 300

func (o MemoryOptions) withDefaults() MemoryOptions {
	d := o
	benchopt.Default(&d.SlowConns, MemoryDefaults.SlowConns)
	benchopt.Default(&d.SlowPrefix, MemoryDefaults.SlowPrefix)
	benchopt.Default(&d.Clients, MemoryDefaults.Clients)
	benchopt.Default(&d.PromptBytes, MemoryDefaults.PromptBytes)
	benchopt.Default(&d.Duration, MemoryDefaults.Duration)
	benchopt.Default(&d.Engines, MemoryDefaults.Engines)
	d.Log = cmp.Or(d.Log, slog.New(slog.DiscardHandler))
	return d
}

// MemoryMeasures are a slow-body run's numbers; their JSON names are the
// figure and detail names.
type MemoryMeasures struct {
	IdleRSSMB       float64 `json:"router_idle_rss_mb"`
	SlowRSSMB       float64 `json:"router_slow_bodies_rss_mb"`
	PeakRSSMB       float64 `json:"router_peak_rss_mb"`
	HWMMB           float64 `json:"router_vmhwm_mb"`
	Requests        int64   `json:"requests"`
	RequestErrors   int64   `json:"request_errors"`
	RequestsPerSec  float64 `json:"requests_per_sec"`
	SlowHeld        int     `json:"slow_bodies_held"`
	SlowConns       int     `json:"slow_conns"`
	SlowPrefixBytes int     `json:"slow_prefix_bytes"`
	Clients         int     `json:"clients"`
	PromptBytes     int     `json:"prompt_bytes"`
	DurationSeconds float64 `json:"duration_seconds"`
	Method          string  `json:"method"`
}

// MemoryDetails are the envelope's details of a slow-body run.
type MemoryDetails struct {
	RequestErrors   int64   `json:"request_errors"`
	SlowConns       int     `json:"slow_conns"`
	SlowPrefixBytes int     `json:"slow_prefix_bytes"`
	SlowHeld        int     `json:"slow_bodies_held"`
	Clients         int     `json:"clients"`
	PromptBytes     int     `json:"prompt_bytes"`
	DurationSeconds float64 `json:"duration_seconds"`
	Method          string  `json:"method"`
}

// Results fills res with m's figures and details.
func (m *MemoryMeasures) Results(res *benchjson.Results) error {
	type fig = benchjson.Figure
	res.Figures = append(res.Figures,
		fig{Name: "router_peak_rss_mb", Unit: "MB", Target: benchjson.Max(MemoryTargetMB), Measured: m.HWMMB,
			Note: fmt.Sprintf("the router's peak resident memory (VmHWM) with %d slow-body connections held and %d clients' requests", m.SlowConns, m.Clients)},
		fig{Name: "router_sampled_peak_rss_mb", Unit: "MB", Measured: m.PeakRSSMB, Note: "the largest VmRSS sampled every 100 ms during the run"},
		fig{Name: "router_idle_rss_mb", Unit: "MB", Measured: m.IdleRSSMB, Note: "VmRSS of the ready router before any connection"},
		fig{Name: "router_slow_bodies_rss_mb", Unit: "MB", Measured: m.SlowRSSMB,
			Note: fmt.Sprintf("VmRSS once the %d slow bodies are being read, before the requests", m.SlowConns)},
		fig{Name: "requests_per_sec", Unit: "requests/s", Measured: m.RequestsPerSec,
			Note: "chat requests completed through the router while the slow bodies were held"},
		fig{Name: "requests", Unit: "requests", Measured: float64(m.Requests), Note: "chat requests completed"})
	return res.SetDetails(MemoryDetails{RequestErrors: m.RequestErrors, SlowConns: m.SlowConns, SlowPrefixBytes: m.SlowPrefixBytes,
		SlowHeld: m.SlowHeld, Clients: m.Clients, PromptBytes: m.PromptBytes, DurationSeconds: m.DurationSeconds, Method: m.Method})
}

// RunMemory starts an engine fleet and a router, holds the slow bodies,
// drives the requests and samples the router's memory; every process it
// starts is stopped before it returns.
func RunMemory(ctx context.Context, opts MemoryOptions) (*benchjson.Results, error) {
	return benchjson.Measure(MemoryTool, func() (*MemoryMeasures, error) { return measureMemory(ctx, opts.withDefaults()) })
}

func measureMemory(ctx context.Context, c MemoryOptions) (*MemoryMeasures, error) {
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "routerbench-memory-")
		if err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		defer os.RemoveAll(d)
		c.Dir = d
	}
	log := c.Log
	log.Info("starting enginesims and a router", "engines", c.Engines)
	f, err := fleet.Start(ctx, fleet.Config{Dir: c.Dir, NoDirectory: true, Engines: c.Engines, Routers: 1,
		EngineArgs: []string{"--time-scale", "0", "--default-max-tokens", "4"},
		RouterArgs: []string{"--policy", "session-hash"}})
	if err != nil {
		return nil, fmt.Errorf("start the fleet: %w", err)
	}
	defer f.Stop()
	r := f.Routers[0]
	pid := r.Proc.Pid()
	addr := strings.TrimPrefix(r.URL, "http://")
	m := &MemoryMeasures{SlowConns: c.SlowConns, SlowPrefixBytes: c.SlowPrefix, Clients: c.Clients, PromptBytes: c.PromptBytes,
		Method: "a router process with its default bounds (8 MiB bodies, 30 s body timeout) in front of enginesims at time scale 0; " +
			"the slow connections announce Content-Length 8 MiB, send a prefix and then a byte a second; each client is one conversation " +
			"(its own session id and system prompt of prompt_bytes, a new question per request), closed loop; VmRSS and VmHWM from /proc/PID/status"}
	idle, _, err := procMemory(pid)
	if err != nil {
		return nil, err
	}
	m.IdleRSSMB = idle

	// The slow bodies: opened, then trickled until the run ends.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i := range c.SlowConns {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("slow connection %d: %w", i, err)
		}
		defer conn.Close()
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"llama3-8b\",\"messages\":[{\"role\":\"user\",\"content\":\"",
			router.PathChat, addr, router.DefaultMaxBodyBytes)
		if _, err := io.WriteString(conn, head+strings.Repeat("x", max(c.SlowPrefix-len(head), 0))); err != nil {
			return nil, fmt.Errorf("slow connection %d: %w", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := conn.Write([]byte("x")); err != nil {
						return
					}
				}
			}
		}()
	}
	if err := waitBodiesReading(ctx, r.URL, c.SlowConns, 30*time.Second); err != nil {
		return nil, err
	}
	if m.SlowRSSMB, _, err = procMemory(pid); err != nil {
		return nil, err
	}
	log.Info("slow bodies held", "conns", c.SlowConns, "router_rss_mb", m.SlowRSSMB)

	// Sample while the clients run.
	var peak atomic.Uint64 // MB * 1000
	peak.Store(uint64(m.SlowRSSMB * 1000))
	sctx, scancel := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
				if rss, _, err := procMemory(pid); err == nil && uint64(rss*1000) > peak.Load() {
					peak.Store(uint64(rss * 1000))
				}
			}
		}
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.Clients, MaxIdleConns: c.Clients}, Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	text := strings.Repeat("prefix caches save prefill time ", max(c.PromptBytes/32, 1))
	var done, failed atomic.Int64
	lctx, lcancel := context.WithTimeout(ctx, c.Duration)
	began := time.Now()
	var cw sync.WaitGroup
	for i := range c.Clients {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for n := 0; lctx.Err() == nil; n++ {
				body, _ := json.Marshal(map[string]any{"model": "llama3-8b", "max_tokens": 4,
					"messages": []map[string]string{{"role": "system", "content": fmt.Sprintf("%d %s", i, text)},
						{"role": "user", "content": fmt.Sprintf("question %d", n)}}})
				req, err := http.NewRequestWithContext(lctx, http.MethodPost, r.URL+router.PathChat, bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Session-Id", fmt.Sprintf("mem-%d", i))
				resp, err := client.Do(req)
				if err != nil {
					if lctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					done.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	cw.Wait()
	elapsed := time.Since(began)
	lcancel()
	// The slow bodies must still be held: the figure is of all of them.
	held, err := bodiesReading(ctx, r.URL)
	scancel()
	<-sampled
	if err != nil {
		return nil, err
	}
	rss, hwm, err := procMemory(pid)
	if err != nil {
		return nil, err
	}
	m.PeakRSSMB = max(float64(peak.Load())/1000, rss)
	m.HWMMB = hwm
	m.SlowHeld = held
	m.Requests, m.RequestErrors = done.Load(), failed.Load()
	m.DurationSeconds = elapsed.Seconds()
	m.RequestsPerSec = float64(m.Requests) / elapsed.Seconds()
	log.Info("memory", "peak_rss_mb", m.PeakRSSMB, "vmhwm_mb", m.HWMMB, "requests", m.Requests, "errors", m.RequestErrors, "slow_bodies_held", held)
	if held < c.SlowConns {
		return nil, fmt.Errorf("only %d of the %d slow bodies were still being read at the end of the run: the figure would not be of all of them (a shorter --duration than the router's 30 s body timeout)", held, c.SlowConns)
	}
	return m, nil
}

// procMemory returns VmRSS and VmHWM of process pid, in MB (10^6 bytes).
func procMemory(pid int) (rss, hwm float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("router memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("router memory: %s: %w", k, err)
		}
		if k == "VmRSS" {
			rss = kb * 1024 / 1e6
		} else {
			hwm = kb * 1024 / 1e6
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("router memory: no VmRSS or VmHWM in /proc/%d/status", pid)
	}
	return rss, hwm, sc.Err()
}

// bodiesReading reads kvdir_router_request_bodies_reading from the
// router's metrics.
func bodiesReading(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("router metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "kvdir_router_request_bodies_reading "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n), err
		}
	}
	return 0, fmt.Errorf("router metrics: no kvdir_router_request_bodies_reading")
}

// waitBodiesReading waits until the router reads n bodies.
func waitBodiesReading(ctx context.Context, url string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := bodiesReading(ctx, url)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the router reads %d bodies after %v, want %d (%v)", got, timeout, n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
