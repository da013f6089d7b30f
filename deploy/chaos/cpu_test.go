package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU accounting: where the machine's time goes during a fault, to find
// what limits the load the suite can hold (the test records it with each
// fault, as cores busy on average: directory nodes, engines, agents,
// routers, the test process itself, and everything else on the machine).

// cpuSample is the CPU time used so far by each container (by name) and
// by the test process, and when.
type cpuSample struct {
	at    time.Time
	used  map[string]time.Duration
	total time.Duration // the whole machine (/proc/stat), idle excluded
}

// cpuGroup names the group of a compose container.
func cpuGroup(container string) string {
	switch {
	case strings.HasPrefix(container, "kvdir-dir"):
		return "directory"
	case strings.HasPrefix(container, "kvdir-engine"):
		return "engines"
	case strings.HasPrefix(container, "kvdir-agent"):
		return "agents"
	case strings.HasPrefix(container, "kvdir-router"):
		return "routers"
	}
	return "other"
}

// sampleCPU reads the containers' cgroup CPU time (cgroup v1 cpuacct or
// v2 cpu.stat), the test process's and the machine's. Containers whose
// accounting is unreadable are left out.
func (h *harness) sampleCPU(ctx context.Context) cpuSample {
	s := cpuSample{at: time.Now(), used: map[string]time.Duration{}}
	var names []string
	names = append(append(append(append(names, dirNames...), engineNames...), agentNames...), routerNames...)
	for _, n := range names {
		out, err := h.d.Run(ctx, "inspect", "-f", "{{.Id}}", n)
		if err != nil {
			continue
		}
		if d, ok := containerCPU(strings.TrimSpace(out)); ok {
			s.used[n] = d
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.used["test process"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.total = machineCPU()
	return s
}

// containerCPU reads a container's CPU time from its cgroup.
func containerCPU(id string) (time.Duration, bool) {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/cpuacct/docker", id, "cpuacct.usage"),
		filepath.Join("/sys/fs/cgroup/cpu,cpuacct/docker", id, "cpuacct.usage"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			if ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return time.Duration(ns), true
			}
		}
	}
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/system.slice", "docker-"+id+".scope", "cpu.stat"),
		filepath.Join("/sys/fs/cgroup/docker", id, "cpu.stat"),
	} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				f.Close()
				return time.Duration(us) * time.Microsecond, err == nil
			}
		}
		f.Close()
	}
	return 0, false
}

// machineCPU is the machine's busy CPU time (/proc/stat: all but idle
// and iowait), 0 if unreadable.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// coresBetween returns each group's average busy cores from a to b, with
// "other" the rest of the machine's busy time.
func coresBetween(a, b cpuSample) map[string]float64 {
	el := b.at.Sub(a.at).Seconds()
	if el <= 0 {
		return nil
	}
	groups := map[string]time.Duration{}
	var sum time.Duration
	for n, v := range b.used {
		d := v - a.used[n]
		if d < 0 {
			d = v // the container was recreated or restarted: counted from 0
		}
		g := cpuGroup(n)
		if n == "test process" {
			g = n
		}
		groups[g] += d
		sum += d
	}
	out := map[string]float64{}
	for g, d := range groups {
		out[g] = round2(d.Seconds() / el)
	}
	if a.total > 0 && b.total > a.total {
		out["other processes"] = round2(max(0, (b.total-a.total-sum).Seconds()/el))
	}
	return out
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// String lists the groups' cores, for the log.
func cpuString(m map[string]float64) string {
	var parts []string
	for _, g := range []string{"directory", "routers", "engines", "agents", "test process", "other processes"} {
		if v, ok := m[g]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", g, v))
		}
	}
	return strings.Join(parts, ", ")
}
