package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/testkit"
)

// viewReplica is a LocalReplica in sync, reporting a fixed view.
type viewReplica struct {
	noReplica
	v follow.View
}

func (r viewReplica) Synced() bool             { return r.v.Synced }
func (r viewReplica) Staleness() time.Duration { return r.v.Staleness }
func (r viewReplica) View() follow.View        { return r.v }
func (r viewReplica) Lag() uint64              { return r.v.LagEntries }

func getView(t *testing.T, s *Server) View {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, PathView, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", PathView, rec.Code, rec.Body)
	}
	var v View
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("GET %s: %v: %s", PathView, err, rec.Body)
	}
	return v
}

func TestViewReportsTheReplica(t *testing.T) {
	rv := follow.View{Node: "10.0.0.1:7001", Synced: true, Staleness: 120 * time.Millisecond,
		AppliedIndex: 41, CommitIndex: 44, LagEntries: 3, Digest: 0xabc, IndexDigest: 0x1234, Snapshots: 1}
	s := newViewServer(t, viewReplica{v: rv})
	v := getView(t, s)
	want := View{Following: true, Source: MatchLocal, Node: rv.Node, Synced: true, StalenessMs: 120,
		AppliedIndex: 41, CommitIndex: 44, LagEntries: 3, IndexDigest: "0000000000001234", Digest: "0000000000000abc", Snapshots: 1}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("view\n got %+v\nwant %+v", v, want)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range []string{`kvdir_router_view_lag_entries{group="default"} 3`, `kvdir_router_view_staleness_seconds{group="default"} 0.12`} {
		if !strings.Contains(rec.Body.String(), "\n"+line+"\n") {
			t.Fatalf("metrics lack %q", line)
		}
	}
	// Past the stale bound the matches are marked stale; past the max the
	// directory answers them.
	rv.Staleness = DefaultLocalStaleAfter + time.Second
	if v := getView(t, newViewServer(t, viewReplica{v: rv})); v.Source != MatchLocalStale {
		t.Fatalf("stale replica: source %q, want %q", v.Source, MatchLocalStale)
	}
	rv.Staleness = DefaultLocalMaxStale + time.Second
	if v := getView(t, newViewServer(t, viewReplica{v: rv})); v.Source != MatchDirectory {
		t.Fatalf("replica past the max: source %q, want %q", v.Source, MatchDirectory)
	}
}

func TestViewWithoutReplica(t *testing.T) {
	v := getView(t, newViewServer(t, nil))
	if v.Following || v.Source != MatchDirectory || v.IndexDigest != "" {
		t.Fatalf("view of a router without --follow-log: %+v", v)
	}
}

// newViewServer is a router with a directory that is never dialled (Run is
// not called) and local as its replica (none when nil).
func newViewServer(t *testing.T, local LocalReplica) *Server {
	t.Helper()
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{"127.0.0.1:1"}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	cfg := Config{Policy: mustPolicy(t, "kvdir"), Renderer: mustRenderer(t), Directory: dir}
	if local != nil {
		cfg.Local = local
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
