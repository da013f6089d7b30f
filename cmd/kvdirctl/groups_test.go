package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/cli/clitest"
	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestDirectoryGroups runs kvdirctl over two in-process directory groups
// (each node with its --models): workers lists both groups' workers with
// a GROUP column (and group in JSON), "workers get" and drain reach the
// group that holds the worker, status shows each group under its name,
// and one group alone prints what --directory prints, without GROUP.
func TestDirectoryGroups(t *testing.T) {
	ga := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"llama"} })
	gb := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Lease = time.Hour; c.Models = []string{"qwen"} })
	for _, r := range []struct {
		c         *dirtest.Cluster
		id, model string
	}{{ga, "llama-0", "llama"}, {gb, "qwen-0", "qwen"}} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := kvdirv1.NewAgentServiceClient(r.c.Conn(0)).Register(ctx,
			&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: r.id, Model: r.model, Address: "http://127.0.0.1:1", BlockSize: 16}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	groups := []string{"--directory-group", "a=" + ga.APIAddr(0), "--directory-group", "b=" + gb.APIAddr(0)}
	ctl := func(args ...string) clitest.Result {
		t.Helper()
		r := runInProcess(t, nil, args...)
		if r.Code != 0 {
			t.Fatalf("kvdirctl %q: exit %d: %s%s", args, r.Code, r.Stdout, r.Stderr)
		}
		return r
	}

	out := ctl(append(groups, "workers")...).Stdout
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "GROUP") {
		t.Fatalf("workers over two groups:\n%s", out)
	}
	for _, want := range [][2]string{{"a", "llama-0"}, {"b", "qwen-0"}} {
		found := false
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			found = found || (f[0] == want[0] && f[1] == want[1])
		}
		if !found {
			t.Fatalf("no row of worker %s in group %s:\n%s", want[1], want[0], out)
		}
	}
	var doc ctlview.WorkerList
	if err := json.Unmarshal([]byte(ctl(append(groups, "workers", "-o", "json")...).Stdout), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Workers) != 2 || doc.Workers[0].Group != "a" || doc.Workers[1].Group != "b" {
		t.Fatalf("workers -o json: %+v", doc.Workers)
	}

	if out := ctl(append(groups, "workers", "get", "qwen-0")...).Stdout; !strings.Contains(out, "directory group:") || !strings.Contains(out, " b\n") {
		t.Fatalf("workers get qwen-0:\n%s", out)
	}
	ctl(append(groups, "drain", "qwen-0")...)
	ws := ctl("--directory", gb.APIAddr(0), "workers").Stdout
	if !strings.Contains(ws, "DRAINING") || strings.Contains(ws, "GROUP") {
		t.Fatalf("group b after drain qwen-0, through --directory:\n%s", ws)
	}
	if r := runInProcess(t, nil, append(groups, "drain", "nobody")...); r.Code != exitError || !strings.Contains(r.Stderr, `"nobody" is not known to any directory group (a, b)`) {
		t.Fatalf("drain of an unknown worker: exit %d: %s", r.Code, r.Stderr)
	}

	st := ctl(append(groups, "status")...).Stdout
	if !strings.Contains(st, "Directory group a (serves llama):") || !strings.Contains(st, "Directory group b (serves qwen):") {
		t.Fatalf("status over two groups:\n%s", st)
	}

	// One group given as --directory-group prints as --directory does.
	one := ctl("--directory-group", "a="+ga.APIAddr(0), "workers").Stdout
	if plain := ctl("--directory", ga.APIAddr(0), "workers").Stdout; heartbeatless(one) != heartbeatless(plain) {
		t.Fatalf("one --directory-group:\n%s\n--directory:\n%s", one, plain)
	}

	if r := runInProcess(t, nil, "--directory", ga.APIAddr(0), "--directory-group", "a="+ga.APIAddr(0), "workers"); r.Code != exitUsage {
		t.Fatalf("--directory with --directory-group: exit %d: %s", r.Code, r.Stderr)
	}
	if r := runInProcess(t, nil, append(groups, "members")...); r.Code != exitUsage || !strings.Contains(r.Stderr, "acts on one directory group") {
		t.Fatalf("members over two groups: exit %d: %s", r.Code, r.Stderr)
	}
}

// heartbeatless drops the HEARTBEAT column's value, which moves between
// two runs.
func heartbeatless(table string) string {
	var out []string
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		if len(f) > 10 {
			f[10] = "-"
		}
		out = append(out, strings.Join(f, " "))
	}
	return strings.Join(out, "\n")
}
