package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// Commands are the binaries a fleet runs.
var Commands = []string{"directory", "enginesim", "agent", "router"}

// StartProc starts a child process of bin with args.
func StartProc(name, bin string, args ...string) (*testkit.Proc, error) {
	p := testkit.NewProc(name, bin, args...)
	return p, p.Start()
}

// New starts a fleet for t with binaries built once per test binary
// (testkit.Binaries: it skips t under -short) and data under t's temporary
// folder; the fleet stops at the end of t, after logging every process's
// output tail if t failed.
func New(t testing.TB, cfg Config) *Fleet {
	t.Helper()
	cfg.Bins = testkit.Binaries(t, Commands...)
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	f, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("TEST_DUMP_LOGS") != "" {
			t.Log(f.Logs(30))
		}
		f.Stop()
	})
	return f
}

// Engine is an engine simulator and its agent: one worker.
type Engine struct {
	WorkerID string
	URL      string // the simulator's base URL
	Model    string // the model it serves
	Group    string // its directory group's name (Config.Groups; "" with one directory)
	Sim      *testkit.Proc
	Agent    *testkit.Proc
}

// Router is a router process.
type Router struct {
	URL  string
	Proc *testkit.Proc
	// EPPAddr is the gRPC address of its endpoint picker (Config.EPP;
	// "" otherwise).
	EPPAddr string
}

// Config describes a fleet.
type Config struct {
	// Dir holds the directory nodes' data and, without Bins, the binaries
	// (required).
	Dir string
	// Bins are the binaries by command name (directory, enginesim, agent,
	// router), e.g. from testkit.Binaries(t, fleet.Commands...); without
	// them Start builds them into Dir.
	Bins map[string]string
	// DirectoryNodes is the cluster size (default 3; 0 with NoDirectory).
	DirectoryNodes int
	NoDirectory    bool
	// Engines is the number of enginesim+agent pairs.
	Engines int
	// Routers is the number of routers (each with RouterArgs, after
	// --explain open).
	Routers int
	// Model served by every engine (default llama3-8b).
	Model string
	// EngineArgs are extra enginesim flags (e.g. --time-scale, --profile,
	// --kv-blocks); AgentArgs extra agent flags; RouterArgs extra router
	// flags (e.g. --policy); DirectoryArgs extra directory flags.
	EngineArgs, AgentArgs, RouterArgs, DirectoryArgs []string
	// PerEngineArgs[i] are extra enginesim flags of engine i only, after
	// EngineArgs (e.g. --lora-modules on some engines); engines past its
	// end get none.
	PerEngineArgs [][]string
	// PerRouterArgs[i] are extra router flags of router i only, after
	// RouterArgs (e.g. --follow-log, or --share-intents=false, on one
	// router of two); routers past its end get none.
	PerRouterArgs [][]string
	// EPP runs every router as an endpoint picker (--mode epp) on a gRPC
	// port of its own (Router.EPPAddr); its URL still serves /metrics,
	// /readyz and explain.
	EPP bool
	// PullEvents makes every engine a TensorRT-LLM one (enginesim
	// --kv-events-pull --metrics-format trtllm) whose agent polls its POST /kv_cache_events
	// (--kv-events-pull-url) instead of subscribing over ZeroMQ.
	PullEvents bool
	// Groups, when set, runs several directory groups instead of one
	// directory (DirectoryNodes, Engines and Model are then unused): each
	// group is a cluster of its own, its nodes started with --models of
	// its model, with engines of that model whose agents register there;
	// every router is given one --directory-group per group, in order.
	Groups []GroupConfig
}

// GroupConfig describes one directory group of a fleet (Config.Groups).
type GroupConfig struct {
	Name    string
	Nodes   int    // directory nodes (default 3)
	Model   string // the model it serves (its nodes' --models)
	Engines int    // engines of Model, registered in this group
}

// Group is a running directory group (Config.Groups).
type Group struct {
	Name, Model string
	Directory   *Directory
}

// Fleet is a running deployment.
type Fleet struct {
	Directory *Directory // nil with NoDirectory, or with Groups
	Groups    []*Group   // Config.Groups, running
	Engines   []*Engine
	Routers   []*Router
	bins      map[string]string
	cfg       Config
}

// Start builds the binaries and starts the fleet, waiting until the
// directory has a leader, every worker is registered and every router is
// ready. On error, everything started is stopped.
func Start(ctx context.Context, cfg Config) (f *Fleet, err error) {
	if cfg.Dir == "" {
		return nil, errors.New("fleet: Config.Dir is required")
	}
	if cfg.Model == "" {
		cfg.Model = "llama3-8b"
	}
	if cfg.DirectoryNodes == 0 && !cfg.NoDirectory {
		cfg.DirectoryNodes = 3
	}
	f = &Fleet{cfg: cfg, bins: cfg.Bins}
	started := f // the error returns below set f to nil
	defer func() {
		if err != nil {
			started.Stop()
			f = nil
		}
	}()
	if f.bins == nil {
		if f.bins, err = testkit.Build(cfg.Dir, Commands...); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	if len(cfg.Groups) > 0 {
		cfg.NoDirectory, cfg.Engines = false, 0
		for _, gc := range cfg.Groups {
			if gc.Nodes == 0 {
				gc.Nodes = 3
			}
			g := &Group{Name: gc.Name, Model: gc.Model}
			g.Directory, err = StartDirectory(f.bins["directory"], filepath.Join(cfg.Dir, gc.Name), gc.Nodes,
				append([]string{"--log-level", "warn", "--models", gc.Model}, cfg.DirectoryArgs...)...)
			if g.Directory != nil {
				f.Groups = append(f.Groups, g)
			}
			if err != nil {
				return nil, fmt.Errorf("fleet: directory group %s: %w", gc.Name, err)
			}
			if _, err = g.Directory.WaitLeader(30 * time.Second); err != nil {
				return nil, fmt.Errorf("fleet: directory group %s leader: %w", gc.Name, err)
			}
		}
	} else if !cfg.NoDirectory {
		if f.Directory, err = StartDirectory(f.bins["directory"], cfg.Dir, cfg.DirectoryNodes, append([]string{"--log-level", "warn"}, cfg.DirectoryArgs...)...); err != nil {
			return nil, fmt.Errorf("fleet: directory: %w", err)
		}
		if _, err = f.Directory.WaitLeader(30 * time.Second); err != nil {
			return nil, fmt.Errorf("fleet: directory leader: %w", err)
		}
	}
	// The engines: of the fleet's model, or each group's of its own.
	type engineSpec struct{ model, group, dirs string }
	var specs []engineSpec
	for range cfg.Engines {
		specs = append(specs, engineSpec{model: cfg.Model})
	}
	for i, gc := range cfg.Groups {
		for range gc.Engines {
			specs = append(specs, engineSpec{model: gc.Model, group: gc.Name, dirs: f.Groups[i].Directory.Addrs()})
		}
	}
	// Each engine serves HTTP and, over ZMQ, events and replay.
	agentEvents := make([][]string, len(specs))
	for i, sp := range specs {
		e := &Engine{WorkerID: fmt.Sprintf("sim-%d", i), Model: sp.model, Group: sp.group}
		e.Sim, _, err = startServing(ctx, "enginesim-"+fmt.Sprint(i), f.bins["enginesim"], 3, func(p []int) ([]string, string) {
			e.URL = fmt.Sprintf("http://127.0.0.1:%d", p[0])
			events := []string{"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", p[1]), "--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", p[2])}
			agentEvents[i] = []string{"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", p[1]),
				"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", p[2])}
			if cfg.PullEvents {
				events = []string{"--kv-events-pull", "--metrics-format", "trtllm"}
				agentEvents[i] = []string{"--kv-events-pull-url", e.URL + "/kv_cache_events"}
			}
			args := append(append([]string{"--addr", fmt.Sprintf("127.0.0.1:%d", p[0]), "--model", sp.model, "--seed", fmt.Sprint(i + 1)},
				events...), cfg.EngineArgs...)
			if i < len(cfg.PerEngineArgs) {
				args = append(args, cfg.PerEngineArgs[i]...)
			}
			return args, e.URL + "/health"
		})
		if e.Sim != nil {
			f.Engines = append(f.Engines, e)
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	for i, e := range f.Engines {
		if cfg.NoDirectory {
			break
		}
		dirs := f.DirectoryAddrs()
		if specs[i].group != "" {
			dirs = specs[i].dirs
		}
		aargs := append(append(append([]string{"--directory", dirs, "--worker-id", e.WorkerID, "--worker-address", e.URL,
			"--model", e.Model, "--engine-kind", "enginesim"}, agentEvents[i]...),
			"--http-addr", "127.0.0.1:0", "--log-level", "warn"), cfg.AgentArgs...)
		if e.Agent, err = StartProc("agent-"+fmt.Sprint(i), f.bins["agent"], aargs...); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Routers {
		r := &Router{}
		nports := 1
		if cfg.EPP {
			nports = 2
		}
		r.Proc, _, err = startServing(ctx, fmt.Sprintf("router-%d", i), f.bins["router"], nports, func(p []int) ([]string, string) {
			r.URL = fmt.Sprintf("http://127.0.0.1:%d", p[0])
			// A test or dev fleet has one user: its tests and readers ask
			// explain and read the predicted header, which a router keeps
			// private by default (RouterArgs may say otherwise: the later
			// --explain wins).
			args := []string{"--addr", strings.TrimPrefix(r.URL, "http://"), "--log-level", "warn", "--explain", "open"}
			if cfg.NoDirectory {
				var ws []string
				for _, e := range f.Engines {
					ws = append(ws, e.WorkerID+"="+e.URL+"@"+cfg.Model)
				}
				args = append(args, "--workers", strings.Join(ws, ","))
			} else if len(f.Groups) > 0 {
				for _, g := range f.Groups {
					args = append(args, "--directory-group", g.Name+"="+g.Directory.Addrs())
				}
			} else {
				args = append(args, "--directory", f.DirectoryAddrs())
			}
			if cfg.EPP {
				r.EPPAddr = fmt.Sprintf("127.0.0.1:%d", p[1])
				args = append(args, "--mode", "epp", "--epp-addr", r.EPPAddr)
			}
			args = append(args, cfg.RouterArgs...)
			if i < len(cfg.PerRouterArgs) {
				args = append(args, cfg.PerRouterArgs[i]...)
			}
			return args, r.URL + "/healthz"
		})
		if r.Proc != nil {
			f.Routers = append(f.Routers, r)
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	for _, r := range f.Routers {
		if err := f.WaitRouterWorkers(ctx, r, len(specs), 60*time.Second); err != nil {
			return nil, fmt.Errorf("fleet: %s: %w\n%s", r.Proc.Name, err, r.Proc.Tail(20))
		}
	}
	return f, nil
}

// Bin returns the path of a built binary (directory, enginesim, agent, router).
func (f *Fleet) Bin(name string) string { return f.bins[name] }

// DirectoryAddrs returns the directory nodes' gRPC addresses, comma-separated.
func (f *Fleet) DirectoryAddrs() string {
	if f.Directory == nil {
		return ""
	}
	return f.Directory.Addrs()
}

// WaitRouterWorkers waits until r is ready and its kvdir_router_workers
// gauge reads n.
func (f *Fleet) WaitRouterWorkers(ctx context.Context, r *Router, n int, timeout time.Duration) error {
	want := fmt.Sprintf("kvdir_router_workers %d\n", n)
	return testkit.Poll(ctx, timeout, fmt.Sprintf("%s ready with %d workers", r.Proc.Name, n), func() (bool, string) {
		if !r.Proc.Running() {
			return false, "not running"
		}
		body, code, err := get(ctx, r.URL+"/metrics")
		if err != nil || code != 200 || !strings.Contains(body, want) {
			return false, fmt.Sprintf("/metrics: %d %v", code, err)
		}
		_, code, err = get(ctx, r.URL+"/readyz")
		return err == nil && code == 200, fmt.Sprintf("/readyz: %d %v", code, err)
	})
}

// Stop stops every process: routers, agents, engines, then the directory.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, r := range f.Routers {
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Proc.Terminate(10 * time.Second) }()
	}
	wg.Wait()
	for _, e := range f.Engines {
		if e.Agent != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = e.Agent.Terminate(10 * time.Second) }()
		}
	}
	wg.Wait()
	for _, e := range f.Engines {
		wg.Add(1)
		go func() { defer wg.Done(); _ = e.Sim.Terminate(10 * time.Second) }()
	}
	wg.Wait()
	if f.Directory != nil {
		f.Directory.Stop()
	}
	for _, g := range f.Groups {
		g.Directory.Stop()
	}
}

// Logs returns the tail of every process's output, for failure reports.
func (f *Fleet) Logs(lines int) string {
	var b strings.Builder
	for _, r := range f.Routers {
		fmt.Fprintf(&b, "---- %s\n%s\n", r.Proc.Name, r.Proc.Tail(lines))
	}
	for _, e := range f.Engines {
		fmt.Fprintf(&b, "---- %s\n%s\n", e.Sim.Name, e.Sim.Tail(lines))
		if e.Agent != nil {
			fmt.Fprintf(&b, "---- %s\n%s\n", e.Agent.Name, e.Agent.Tail(lines))
		}
	}
	if f.Directory != nil {
		b.WriteString(f.Directory.Logs(lines))
	}
	for _, g := range f.Groups {
		fmt.Fprintf(&b, "==== directory group %s\n%s", g.Name, g.Directory.Logs(lines))
	}
	return b.String()
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func get(ctx context.Context, url string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, io.LimitReader(resp.Body, 8<<20))
	return b.String(), resp.StatusCode, err
}

// startAttempts bounds how often startServing picks new ports.
const startAttempts = 3

// startServing starts bin on nports free loopback ports, with the
// arguments and health URL that args returns for them, and waits until
// the health URL answers 200. Ports are only free when they are picked: a
// process that exits because another took one of them ("address already
// in use") is started again on new ports, up to startAttempts times. It
// returns the process (also on a later failure, to be stopped) and its
// ports.
func startServing(ctx context.Context, name, bin string, nports int, args func(ports []int) ([]string, string)) (*testkit.Proc, []int, error) {
	var last error
	for range startAttempts {
		ports, err := testkit.LoopbackPorts(nports)
		if err != nil {
			return nil, nil, err
		}
		a, health := args(ports)
		p, err := StartProc(name, bin, a...)
		if err != nil {
			return nil, nil, err
		}
		err = testkit.Poll(ctx, 30*time.Second, "GET "+health, func() (bool, string) {
			if !p.Running() {
				return true, "" // ends the wait; checked below
			}
			_, code, err := get(ctx, health)
			return err == nil && code == 200, fmt.Sprint(code, err)
		})
		if err == nil && p.Running() {
			owns, oerr := ownsHealthPort(p, health)
			if oerr != nil || owns {
				return p, ports, nil // where the sockets cannot be read, the answer is taken as p's
			}
			// Another process took the port and answered; p failed to
			// bind it, or is about to.
			_ = p.Terminate(5 * time.Second)
			last = fmt.Errorf("%s: another process answered %s\n%s", name, health, p.Tail(20))
			continue
		}
		if err == nil { // it exited
			err = fmt.Errorf("%s exited before serving", name)
		}
		last = fmt.Errorf("%w\n%s", err, p.Tail(20))
		if p.Running() || !strings.Contains(p.Log(), "address already in use") {
			return p, ports, last
		}
	}
	return nil, nil, last
}

// ownsHealthPort reports whether p listens on the port of the health URL.
func ownsHealthPort(p *testkit.Proc, health string) (bool, error) {
	u, err := url.Parse(health)
	if err != nil {
		return false, err
	}
	port := testkit.Port(u.Host)
	if port == 0 {
		return false, fmt.Errorf("health URL %s has no port", health)
	}
	return testkit.ListensOn(p.Pid(), port)
}
