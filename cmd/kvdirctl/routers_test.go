package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func routerStatus(id, node string, follows bool, applied, digest uint64, checked bool, nodeDigest uint64) *kvdirv1.RouterStatus {
	rs := &kvdirv1.RouterStatus{RouterId: id, NodeId: node, ReportAge: durationpb.New(300 * time.Millisecond), Intents: 3,
		View: &kvdirv1.RouterView{Follows: follows, Synced: follows, AppliedIndex: applied, Digest: digest, IndexDigest: digest + 1, LagEntries: 1,
			HeardAge: durationpb.New(20 * time.Millisecond)}}
	if checked {
		rs.DigestChecked, rs.CheckedIndex, rs.CheckedRouterDigest, rs.CheckedNodeDigest = true, applied, digest, nodeDigest
	}
	return rs
}

// TestStatusListsRouters: the routers the nodes report are listed, the
// following ones in the text table with their digest comparison.
func TestStatusListsRouters(t *testing.T) {
	answers := []*kvdirv1.StatusResponse{
		{NodeId: "n1", Routers: []*kvdirv1.RouterStatus{routerStatus("r-a", "n1", true, 750, 0xab, true, 0xab), routerStatus("r-plain", "n1", false, 0, 0, false, 0)}},
		{NodeId: "n2", Routers: []*kvdirv1.RouterStatus{routerStatus("r-b", "n2", true, 751, 0xcd, true, 0xcd)}},
	}
	st := &ctlview.Status{Routers: routersOf(answers)}
	st.RouterDigests = compareRouterDigests(st.Routers)
	if len(st.Routers) != 3 || st.Routers[0].ID != "r-a" || st.Routers[2].Follows {
		t.Fatalf("routers %+v", st.Routers)
	}
	if d := st.RouterDigests; !d.Agree || !strings.HasPrefix(d.Detail, "agree: 2 router(s)") || !strings.Contains(d.Detail, "r-a at 750 on n1, r-b at 751 on n2") {
		t.Fatalf("router digests %+v", d)
	}
	var out bytes.Buffer
	if err := writeStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"ROUTER", "r-a  ", "00000000000000ac", "routers:  agree: 2 router(s)"} {
		if !strings.Contains(text, want) {
			t.Fatalf("status text lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "r-plain") {
		t.Fatalf("a router that does not follow the log is in the text table:\n%s", text)
	}

	// A diverged replica, and one not compared yet.
	st.Routers = routersOf([]*kvdirv1.StatusResponse{{Routers: []*kvdirv1.RouterStatus{
		routerStatus("r-a", "n1", true, 750, 0xab, true, 0xff), routerStatus("r-b", "n2", true, 751, 0xcd, false, 0)}}})
	d := compareRouterDigests(st.Routers)
	if d.Agree || !strings.HasPrefix(d.Detail, "DIFFER: r-a at applied index 750 has 00000000000000ab, n1 has 00000000000000ff") ||
		!strings.Contains(d.Detail, "not compared yet: r-b") {
		t.Fatalf("router digests %+v", d)
	}
	// No following router: no table and no line, as before routers shared.
	st = &ctlview.Status{Routers: routersOf([]*kvdirv1.StatusResponse{{Routers: []*kvdirv1.RouterStatus{routerStatus("r-plain", "n1", false, 0, 0, false, 0)}}})}
	st.RouterDigests = compareRouterDigests(st.Routers)
	out.Reset()
	if err := writeStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	if st.RouterDigests != nil || strings.Contains(out.String(), "ROUTER") || strings.Contains(out.String(), "routers:") {
		t.Fatalf("without following routers:\n%s", out.String())
	}
}
