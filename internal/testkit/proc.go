package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a child process that can be started again with the same
// arguments after it exits or is killed. Its output (every run's) is kept
// for failure reports.
type Proc struct {
	Name string
	// Env is added to the child's environment: the test's own, less every
	// KVDIR* variable (KVDIR_, KVDIRCTL_...), so that the host's configuration
	// does not leak in.
	Env []string

	bin  string
	args []string
	out  Buffer

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// NewProc returns a process of bin with args, not started.
func NewProc(name, bin string, args ...string) *Proc {
	return &Proc{Name: name, bin: bin, args: args}
}

// StartProc starts bin with args for t: it fails t if the process cannot
// start, and at the end of t terminates it and, if t failed (or
// TEST_DUMP_LOGS is set), logs the tail of its output.
func StartProc(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	p := NewProc(name, bin, args...)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.Cleanup(t)
	return p
}

// Cleanup makes p end with t: terminated, and its output's tail logged if
// t failed or TEST_DUMP_LOGS is set.
func (p *Proc) Cleanup(t testing.TB) {
	t.Cleanup(func() {
		_ = p.Terminate(10 * time.Second)
		if t.Failed() || os.Getenv("TEST_DUMP_LOGS") != "" {
			t.Logf("---- output of %s ----\n%s", p.Name, p.Tail(150))
		}
	})
}

// Start starts the process (again); it must not be running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s: already running", p.Name)
		}
	}
	cmd := exec.Command(p.bin, p.args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVDIR") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, p.Env...)
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	p.starts++
	fmt.Fprintf(&p.out, "=== start %d: %s %s\n", p.starts, filepath.Base(p.bin), strings.Join(p.args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// Restart kills the process if it runs and starts it again.
func (p *Proc) Restart() error {
	p.Kill9()
	return p.Start()
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

// Pid is the current run's process id (0 before the first start).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Done is closed when the current run of the process has exited (nil
// before the first start).
func (p *Proc) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// ExitCode is the last run's exit code (-1 while running or if killed).
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return -1
	}
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Kill9 kills the process with SIGKILL and waits for it to exit.
func (p *Proc) Kill9() {
	p.signal(syscall.SIGKILL, time.Minute)
}

// Terminate sends SIGTERM and waits up to timeout for the exit, then
// kills it. It reports a process that had to be killed or exited non-zero;
// a process not running is no error.
func (p *Proc) Terminate(timeout time.Duration) error {
	if !p.Running() {
		return nil
	}
	if !p.signal(syscall.SIGTERM, timeout) {
		return fmt.Errorf("%s did not stop within %v of SIGTERM", p.Name, timeout)
	}
	if code := p.ExitCode(); code != 0 {
		return fmt.Errorf("%s exited %d after SIGTERM", p.Name, code)
	}
	return nil
}

// signal sends sig and waits up to timeout for the exit, then kills the
// process; it reports whether the process exited within timeout.
func (p *Proc) signal(sig syscall.Signal, timeout time.Duration) bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return false
	}
}

// Signal sends sig to the process without waiting.
func (p *Proc) Signal(sig os.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return errors.New(p.Name + " was never started")
	}
	return cmd.Process.Signal(sig)
}

// Log returns what the process printed, over all its runs.
func (p *Proc) Log() string { return p.out.String() }

// Tail returns the last n lines of the process's output.
func (p *Proc) Tail(n int) string { return Tail(p.Log(), n) }

// Tail returns the last n lines of s, saying how many it cut.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines cut)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// Buffer collects output; safe for concurrent writers and readers.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
