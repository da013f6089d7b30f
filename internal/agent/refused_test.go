package agent

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// A directory group that does not serve the worker's model (its nodes'
// --models) refuses the registration: the agent logs an error saying why
// and what to fix, and retries after a pause that doubles each time
// instead of at RegisterRetry's pace.
func TestRefusedRegistrationBacksOff(t *testing.T) {
	nodes := dirtest.New(t, 1, func(_ int, c *node.Config) { c.Models = []string{"other-model"} }).Nodes()
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{nodes[0].APIAddr()}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	var logs testkit.Buffer
	a, err := New(Config{
		WorkerID: itWorker, WorkerAddress: "http://127.0.0.1:1", Model: itModel, BlockSize: itBS,
		Endpoint: "inproc://agent-refused", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		RegisterRetry: 20 * time.Millisecond,
	}, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	retryRE := regexp.MustCompile(`level=ERROR msg="agent: the directory refused to register the worker[^"]*point --directory at the nodes of the group serving it" worker=w1 model=llama retry_in=(\S+) err=`)
	var pauses []string
	testkit.Eventually(t, 10*time.Second, "four refused registrations logged", func() (bool, string) {
		pauses = nil
		for _, m := range retryRE.FindAllStringSubmatch(logs.String(), -1) {
			pauses = append(pauses, m[1])
		}
		return len(pauses) >= 4, logs.String()
	})
	if got := strings.Join(pauses[:4], " "); got != "20ms 40ms 80ms 160ms" {
		t.Fatalf("pauses after refusals %q, want doubling from RegisterRetry", got)
	}
	if l := logs.String(); !strings.Contains(l, "this group serves other-model; that model belongs to another group") {
		t.Fatalf("the log does not give the directory's reason:\n%s", l)
	}
	if a.Epoch() != 0 {
		t.Fatal("registered in a group that does not serve the model")
	}
}
