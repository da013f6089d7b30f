package main

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// hostileDirectory is a directory (a real gRPC server with a fake
// service) whose workers have what a broken or hostile agent could put
// there: a NaN or infinite KV usage, and terminal escape sequences, a
// carriage return and a bidirectional override in ids and addresses.
type hostileDirectory struct {
	kvdirv1.UnimplementedDirectoryServiceServer
}

// The hostile workers' ids: ESC [ ... m recolours a terminal, ESC ] 0 ;
// sets its title, CSI (U+009B) is the one-character ESC [, CR returns to
// the start of the line, U+202E reverses what follows.
var hostileIDs = []string{"w-\x1b[31mred\x1b[0m", "w-\x1b]0;owned\x07", "w-\u009b2J", "w-\rspoof", "w-\u202etxt.exe"}

func hostileWorkers() []*kvdirv1.Worker {
	usage := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0.5, math.NaN()}
	var ws []*kvdirv1.Worker
	for i, id := range hostileIDs {
		ws = append(ws, &kvdirv1.Worker{
			Spec:  &kvdirv1.WorkerSpec{Id: id, Address: "http://10.0.0.1:8000/\x1b[2J", Model: "m\x7f", BlockSize: 16},
			State: kvdirv1.WorkerState_WORKER_STATE_ACTIVE, Epoch: 1,
			Load: &kvdirv1.Load{KvUsage: usage[i], Running: 1}, LoadTimeUnixNano: time.Now().UnixNano(),
		})
	}
	return ws
}

func (hostileDirectory) ListWorkers(context.Context, *kvdirv1.ListWorkersRequest) (*kvdirv1.ListWorkersResponse, error) {
	return &kvdirv1.ListWorkersResponse{Workers: hostileWorkers()}, nil
}

func (hostileDirectory) GetWorker(_ context.Context, r *kvdirv1.GetWorkerRequest) (*kvdirv1.GetWorkerResponse, error) {
	if r.GetWorkerId() == "err" {
		return nil, status.Error(codes.NotFound, "worker \x1b[2J\u009b3J not found")
	}
	return &kvdirv1.GetWorkerResponse{Worker: hostileWorkers()[0]}, nil
}

func (hostileDirectory) ListSessions(context.Context, *kvdirv1.ListSessionsRequest) (*kvdirv1.ListSessionsResponse, error) {
	return &kvdirv1.ListSessionsResponse{}, nil
}

// startHostile serves hostileDirectory on loopback and returns its address.
func startHostile(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	kvdirv1.RegisterDirectoryServiceServer(srv, hostileDirectory{})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// terminalSafe fails t if s has a byte a terminal would act on: a control
// character other than newline and tab (C0, DEL; C1 in UTF-8), or a
// bidirectional override.
func terminalSafe(t *testing.T, what, s string) {
	t.Helper()
	for i, r := range s {
		if (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
			t.Fatalf("%s: raw %U at byte %d reaches the terminal:\n%q", what, r, i, s)
		}
	}
}

// TestHostileWorkerValues runs kvdirctl against a directory that returns
// non-finite loads and control characters in worker fields: every format
// prints the whole fleet; the table and plain output carry the control
// characters escaped (\u001b...), never raw; JSON and YAML decode, with
// null for the non-finite loads and the ids exactly as the directory
// holds them.
func TestHostileWorkerValues(t *testing.T) {
	addr := startHostile(t)
	args := func(extra ...string) []string {
		return append([]string{"--directory", addr, "--timeout", "5s"}, extra...)
	}

	out, errOut, code := ctl(t, nil, args("workers")...)
	if code != 0 {
		t.Fatalf("workers: exit %d\n%s\n%s", code, out, errOut)
	}
	terminalSafe(t, "workers table", out)
	if !strings.Contains(out, `w-\u001b[31mred\u001b[0m`) || !strings.Contains(out, `w-\u202etxt.exe`) || !strings.Contains(out, `w-\u009b2J`) {
		t.Fatalf("workers table does not show the escaped ids:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n != len(hostileIDs)+1 {
		t.Fatalf("workers table has %d lines, want a header and %d workers:\n%s", n, len(hostileIDs), out)
	}

	out, errOut, code = ctl(t, nil, args("workers", "get", "x", "--top", "0")...)
	if code != 0 {
		t.Fatalf("workers get: exit %d\n%s\n%s", code, out, errOut)
	}
	terminalSafe(t, "workers get", out)

	// An error from the directory reaches stderr escaped.
	out, errOut, code = ctl(t, nil, args("workers", "get", "err")...)
	if code == 0 || !strings.Contains(errOut, `\u001b[2J`) {
		t.Fatalf("workers get err: exit %d\n%s\n%q", code, out, errOut)
	}
	terminalSafe(t, "workers get err (stderr)", errOut)

	for _, format := range []string{"json", "yaml"} {
		out, errOut, code = ctl(t, nil, args("workers", "-o", format)...)
		if code != 0 {
			t.Fatalf("workers -o %s: exit %d\n%s\n%s", format, code, out, errOut)
		}
		terminalSafe(t, "workers -o "+format, out)
		doc := []byte(out)
		if format == "yaml" {
			var err error
			if doc, err = yaml.YAMLToJSON(doc); err != nil {
				t.Fatalf("workers -o yaml: %v\n%s", err, out)
			}
		}
		var got struct {
			Workers []struct {
				ctlview.Worker
				RawUsage json.RawMessage `json:"kv_usage"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(doc, &got); err != nil {
			t.Fatalf("workers -o %s: %v\n%s", format, err, out)
		}
		if len(got.Workers) != len(hostileIDs) {
			t.Fatalf("workers -o %s: %d workers, want %d", format, len(got.Workers), len(hostileIDs))
		}
		for i, w := range got.Workers {
			if w.ID != hostileIDs[i] || w.Address != "http://10.0.0.1:8000/\x1b[2J" {
				t.Errorf("-o %s worker %d: id %q address %q, want %q", format, i, w.ID, w.Address, hostileIDs[i])
			}
			wantNull := i != 3
			if isNull := string(w.RawUsage) == "null"; isNull != wantNull {
				t.Errorf("-o %s worker %d: kv_usage %s", format, i, w.RawUsage)
			}
		}
	}
}
