package chaos

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// raiseFileLimit raises the test process's open-file limit as far as the
// kernel allows (fs.nr_open; the hard limit too when root). The process
// is the load generator, the balancer's fronts and its pools to the
// routers at once: an open-loop load that a fault slows holds two
// descriptors per request in flight: at 135 requests a second, a fault
// that stalls answers for 70 s reached this machine's 20,000, after which
// the harness could not dial or run docker and reported the cluster
// unreachable.
func raiseFileLimit(t *testing.T) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Logf("open-file limit: %v", err)
		return
	}
	want := lim.Max
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil && os.Geteuid() == 0 {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n > want {
			want = n
		}
	}
	if lim.Cur >= want {
		return
	}
	next := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		t.Logf("open-file limit stays %d: %v", lim.Cur, err)
		return
	}
	t.Logf("open-file limit raised from %d to %d", lim.Cur, want)
}
