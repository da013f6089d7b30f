package node_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
)

// Config.Pprof serves the runtime profiles on the HTTP address; without it
// the address has no /debug/pprof/ at all.
func TestPprofOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		c := dirtest.New(t, 1, func(_ int, cfg *node.Config) {
			cfg.HTTPAddr, cfg.Pprof = "127.0.0.1:0", on
		})
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline"} {
			resp, err := http.Get("http://" + c.Node(0).HTTPAddr() + path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			want := http.StatusNotFound
			if on {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Errorf("pprof %v: GET %s: status %d, want %d", on, path, resp.StatusCode, want)
			}
		}
	}
}
