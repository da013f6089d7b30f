// Package fleet starts a whole kvdir deployment as real processes on
// loopback, for end-to-end tests, benchmarks and the demo: a directory
// cluster (bench/dircluster), engine simulators each with its agent, and
// routers. Every process can be stopped, killed and restarted, and its
// output is kept for failure reports.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvdir/kvdir/bench/dircluster"
)

// Proc is one child process, restartable with the same arguments.
type Proc struct {
	Name string
	bin  string
	args []string
	out  *dircluster.Buffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProc starts bin with args.
func StartProc(name, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, bin: bin, args: args, out: &dircluster.Buffer{}}
	return p, p.Start()
}

// Start (re)starts the process; it must not be running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and, after timeout, SIGKILL; it waits for the exit.
func (p *Proc) Stop(timeout time.Duration) {
	p.signal(syscall.SIGTERM, timeout)
}

// Kill9 kills the process with SIGKILL and waits for the exit.
func (p *Proc) Kill9() { p.signal(syscall.SIGKILL, time.Minute) }

func (p *Proc) signal(sig syscall.Signal, timeout time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Log returns what the process printed (all runs).
func (p *Proc) Log() string { return p.out.String() }

// Tail returns the last n lines of the process's output.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Engine is an engine simulator and its agent: one worker.
type Engine struct {
	WorkerID string
	URL      string // the simulator's base URL
	Sim      *Proc
	Agent    *Proc
}

// Router is a router process.
type Router struct {
	URL  string
	Proc *Proc
}

// Config describes a fleet.
type Config struct {
	// Dir holds the binaries and the directory nodes' data (required).
	Dir string
	// DirectoryNodes is the cluster size (default 3; 0 with NoDirectory).
	DirectoryNodes int
	NoDirectory    bool
	// Engines is the number of enginesim+agent pairs.
	Engines int
	// Routers is the number of routers (each with RouterArgs).
	Routers int
	// Model served by every engine (default llama3-8b).
	Model string
	// EngineArgs are extra enginesim flags (e.g. --time-scale, --profile,
	// --kv-blocks); AgentArgs extra agent flags; RouterArgs extra router
	// flags (e.g. --policy); DirectoryArgs extra directory flags.
	EngineArgs, AgentArgs, RouterArgs, DirectoryArgs []string
}

// Fleet is a running deployment.
type Fleet struct {
	Directory *dircluster.Cluster // nil with NoDirectory
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
	root, err := dircluster.ModuleRoot()
	if err != nil {
		return nil, err
	}
	f = &Fleet{cfg: cfg}
	defer func() {
		if err != nil {
			f.Stop()
			f = nil
		}
	}()
	if f.bins, err = dircluster.BuildCommands(root, cfg.Dir, "directory", "enginesim", "agent", "router"); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if !cfg.NoDirectory {
		if f.Directory, err = dircluster.Start(f.bins["directory"], cfg.Dir, cfg.DirectoryNodes, append([]string{"--log-level", "warn"}, cfg.DirectoryArgs...)...); err != nil {
			return nil, fmt.Errorf("fleet: directory: %w", err)
		}
		if _, err = f.Directory.WaitLeader(30 * time.Second); err != nil {
			return nil, fmt.Errorf("fleet: directory leader: %w", err)
		}
	}
	ports, err := dircluster.FreePorts(3*cfg.Engines + cfg.Routers)
	if err != nil {
		return nil, err
	}
	for i := range cfg.Engines {
		p := ports[3*i : 3*i+3]
		e := &Engine{WorkerID: fmt.Sprintf("sim-%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", p[0])}
		args := append([]string{"--addr", fmt.Sprintf("127.0.0.1:%d", p[0]), "--model", cfg.Model, "--seed", fmt.Sprint(i + 1),
			"--kv-events-endpoint", fmt.Sprintf("tcp://*:%d", p[1]), "--kv-events-replay-endpoint", fmt.Sprintf("tcp://*:%d", p[2])},
			cfg.EngineArgs...)
		if e.Sim, err = StartProc("enginesim-"+fmt.Sprint(i), f.bins["enginesim"], args...); err != nil {
			return nil, err
		}
		f.Engines = append(f.Engines, e)
		if cfg.NoDirectory {
			continue
		}
		aargs := append([]string{"--directory", f.DirectoryAddrs(), "--worker-id", e.WorkerID, "--worker-address", e.URL,
			"--model", cfg.Model, "--engine-kind", "enginesim",
			"--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", p[1]),
			"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", p[2]),
			"--http-addr", "127.0.0.1:0", "--log-level", "warn"}, cfg.AgentArgs...)
		if e.Agent, err = StartProc("agent-"+fmt.Sprint(i), f.bins["agent"], aargs...); err != nil {
			return nil, err
		}
	}
	for _, e := range f.Engines {
		if err := waitHTTP(ctx, e.URL+"/health", 30*time.Second); err != nil {
			return nil, fmt.Errorf("fleet: %s: %w\n%s", e.Sim.Name, err, e.Sim.Tail(20))
		}
	}
	for i := range cfg.Routers {
		r := &Router{URL: fmt.Sprintf("http://127.0.0.1:%d", ports[3*cfg.Engines+i])}
		args := []string{"--addr", strings.TrimPrefix(r.URL, "http://"), "--log-level", "warn"}
		if cfg.NoDirectory {
			var ws []string
			for _, e := range f.Engines {
				ws = append(ws, e.WorkerID+"="+e.URL+"@"+cfg.Model)
			}
			args = append(args, "--workers", strings.Join(ws, ","))
		} else {
			args = append(args, "--directory", f.DirectoryAddrs())
		}
		if r.Proc, err = StartProc(fmt.Sprintf("router-%d", i), f.bins["router"], append(args, cfg.RouterArgs...)...); err != nil {
			return nil, err
		}
		f.Routers = append(f.Routers, r)
	}
	for _, r := range f.Routers {
		if err := f.WaitRouterWorkers(ctx, r, cfg.Engines, 60*time.Second); err != nil {
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
	var a []string
	for _, n := range f.Directory.Nodes {
		a = append(a, n.API)
	}
	return strings.Join(a, ",")
}

// WaitRouterWorkers waits until r is ready and its kvdir_router_workers
// gauge reads n.
func (f *Fleet) WaitRouterWorkers(ctx context.Context, r *Router, n int, timeout time.Duration) error {
	want := fmt.Sprintf("kvdir_router_workers %d\n", n)
	return waitCond(ctx, timeout, func() bool {
		if !r.Proc.Running() {
			return false
		}
		body, code, err := get(ctx, r.URL+"/metrics")
		if err != nil || code != 200 || !strings.Contains(body, want) {
			return false
		}
		_, code, err = get(ctx, r.URL+"/readyz")
		return err == nil && code == 200
	}, "router ready with "+fmt.Sprint(n)+" workers")
}

// Stop stops every process: routers, agents, engines, then the directory.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, r := range f.Routers {
		wg.Add(1)
		go func() { defer wg.Done(); r.Proc.Stop(10 * time.Second) }()
	}
	wg.Wait()
	for _, e := range f.Engines {
		if e.Agent != nil {
			wg.Add(1)
			go func() { defer wg.Done(); e.Agent.Stop(10 * time.Second) }()
		}
	}
	wg.Wait()
	for _, e := range f.Engines {
		wg.Add(1)
		go func() { defer wg.Done(); e.Sim.Stop(10 * time.Second) }()
	}
	wg.Wait()
	if f.Directory != nil {
		f.Directory.Stop()
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
		for _, n := range f.Directory.Nodes {
			fmt.Fprintf(&b, "---- directory %s\n%s\n", n.ID, tailOf(n.Log(), lines))
		}
	}
	return b.String()
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	return waitCond(ctx, timeout, func() bool {
		_, code, err := get(ctx, url)
		return err == nil && code == 200
	}, "GET "+url)
}

// waitCond polls cond every 20 ms until it holds, ctx ends or timeout passes.
func waitCond(ctx context.Context, timeout time.Duration, cond func() bool, what string) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
