package node_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// A follower restarted after missing many entries must not report ready
// (/readyz) while its applied index is more than ReadyMaxLag behind the
// leader's commit index, though its own commit index, bounded by the log
// it holds, says it is close; it becomes ready once caught up.
func TestRestartedFollowerNotReadyUntilCaughtUp(t *testing.T) {
	const lag, entries = 1000, 40_000
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) {
		cfg.HTTPAddr, cfg.ReadyMaxLag = "127.0.0.1:0", lag
	})
	l, f := c.Leader(), c.Follower()
	for _, i := range []int{l, f} {
		testkit.Eventually(t, 10*time.Second, "node ready", func() (bool, string) {
			err := node.Ready(c.Node(i))
			return err == nil, errString(err)
		})
	}
	c.Stop(f)
	// Many writers, so that Raft batches the entries; a write that meets a
	// leadership change is retried on the new leader.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done, failures := 0, 0; done < entries/8; {
				n := c.Node(c.Leader())
				if err := node.ProposeNoop(n); err != nil {
					if failures++; failures > 100 {
						errs <- err
						return
					}
					continue
				}
				done++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("propose: %v", err)
	}
	l = c.Leader()
	commit := c.Node(l).Raft().CommitIndex()

	c.Restart(f)
	n := c.Node(f)
	url := "http://" + n.HTTPAddr() + "/readyz"
	reasons := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("follower not ready 60s after its restart: %v", reasons)
		}
		code, body := get(t, url)
		if code == http.StatusOK {
			if applied := n.FSM().AppliedIndex(); applied+lag < commit {
				t.Fatalf("ready with applied index %d, leader's commit index %d (bound %d); before: %v", applied, commit, lag, reasons)
			}
			break
		}
		reason := body
		if i := strings.Index(body, "applied"); i >= 0 {
			reason = body[:i] // the figures change at every answer
		}
		reasons[strings.TrimSpace(reason)]++
		time.Sleep(time.Millisecond)
	}
	t.Logf("commit index %d; not-ready answers before ready: %v", commit, reasons)
	if reasons["not ready: catching up:"] == 0 {
		t.Errorf("never said it was catching up: %v", reasons)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
