package transcript

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvdir/kvdir/internal/testkit"
)

// Shell is one bash process that runs steps in turn, as a reader pasting a
// guide's commands into one terminal would: variables, functions and
// background jobs carry over from step to step. Close stops it and every
// process it started (they share its process group).
type Shell struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	n     int
	once  sync.Once
}

// NewShell starts bash in dir with env (added to the test's environment).
func NewShell(dir string, env []string) (*Shell, error) {
	cmd := exec.Command("bash", "--norc", "--noprofile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// The steps' stderr joins their stdout (2>&1 around each step); the
	// shell's own messages, such as its reports of killed jobs, are not
	// part of any command's output.
	cmd.Stdout, cmd.Stderr = pw, io.Discard
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	pw.Close()
	return &Shell{cmd: cmd, stdin: stdin, out: bufio.NewReader(pr)}, nil
}

// Run runs one step (stdout and stderr together, as on a terminal) and
// returns its output and exit status. The step must finish within timeout;
// otherwise the shell is stopped and an error returned.
func (s *Shell) Run(command string, timeout time.Duration) (string, int, error) {
	s.n++
	mark := fmt.Sprintf("__transcript_done_%d_", s.n)
	// The command runs in the shell itself (not a subshell), so that its
	// variables, functions and jobs stay; its output goes to the shared pipe.
	script := fmt.Sprintf("{\n%s\n} </dev/null 2>&1\n__rc=$?; echo; echo %s$__rc\n", command, mark)
	if _, err := io.WriteString(s.stdin, script); err != nil {
		return "", -1, err
	}
	type result struct {
		out string
		rc  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		var b strings.Builder
		for {
			line, err := s.out.ReadString('\n')
			if i := strings.Index(line, mark); i >= 0 {
				rc, _ := strconv.Atoi(strings.TrimSpace(line[i+len(mark):]))
				out := strings.TrimSuffix(b.String(), "\n") // the echo before the mark
				done <- result{out, rc, nil}
				return
			}
			if !jobReport.MatchString(line) {
				b.WriteString(line)
			}
			if err != nil {
				done <- result{b.String(), -1, fmt.Errorf("shell ended: %w", err)}
				return
			}
		}
	}()
	select {
	case r := <-done:
		return r.out, r.rc, r.err
	case <-time.After(timeout):
		s.Close()
		return "", -1, errors.New("step did not finish within " + timeout.String())
	}
}

// jobReport is bash's report of a background job killed by a signal,
// which a non-interactive shell writes into whatever command runs next.
var jobReport = regexp.MustCompile(`^bash: line \d+: +\d+ (Killed|Terminated|Aborted|Segmentation fault)\s`)

// Close stops every process of the shell's process group: SIGTERM, then
// SIGKILL to what is left after a grace period.
func (s *Shell) Close() { s.once.Do(s.close) }

func (s *Shell) close() {
	pgid := s.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	s.stdin.Close()
	waited := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(waited) }()
	<-waited
	// Whatever of the group outlives SIGTERM by 10 s is killed.
	_ = testkit.Poll(context.Background(), 10*time.Second, "the shell's process group to exit", func() (bool, string) {
		return syscall.Kill(-pgid, 0) != nil, ""
	})
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}
