package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

type dropCounter map[string]int

func (d dropCounter) intentDropped(reason string, n int) { d[reason] += n }

func testIntent(router string, id, version uint64, ttl time.Duration, chain ...uint64) *kvdirv1.PlacementIntent {
	return &kvdirv1.PlacementIntent{RouterId: router, IntentId: id, Version: version, WorkerId: "w0", Chain: chain,
		BlockSize: 16, PromptTokens: 100, UncachedTokens: 50, State: kvdirv1.IntentState_INTENT_STATE_QUEUED,
		Ttl: durationpb.New(ttl), Hold: durationpb.New(ttl)}
}

// readAll drains s, returning the keys read as "router/id@version" and
// whether the first message had reset set.
func readAll(t *testing.T, tab *intentTable, s *intentSub, now time.Time) ([]string, bool) {
	t.Helper()
	var got []string
	first, reset := true, false
	for more := true; more; {
		var out []*kvdirv1.PlacementIntent
		var r bool
		out, r, more = tab.read(s, now)
		if first {
			reset, first = r, false
		}
		for _, p := range out {
			got = append(got, fmt.Sprintf("%s/%d@%d", p.RouterId, p.IntentId, p.Version))
		}
	}
	return got, reset
}

func TestIntentTableExpiresAtTTL(t *testing.T) {
	tab := newIntentTable(0, 0, nil)
	t0 := time.Unix(1000, 0)
	tab.put(testIntent("r1", 1, 1, time.Second), false, t0)
	tab.put(testIntent("r1", 2, 1, 3*time.Second), false, t0)
	if n := tab.expire(t0.Add(999 * time.Millisecond)); n != 0 {
		t.Fatalf("expired %d intents before their TTL", n)
	}
	if n := tab.expire(t0.Add(time.Second)); n != 1 || tab.len() != 1 {
		t.Fatalf("at 1 s: expired %d, %d left; want 1 and 1", n, tab.len())
	}
	// A reader is sent what remains of the TTL, not the TTL received.
	s := tab.subscribe(func(*heldIntent) bool { return true })
	out, reset, _ := tab.read(s, t0.Add(2*time.Second))
	if !reset || len(out) != 1 || out[0].Ttl.AsDuration() != time.Second || out[0].Hold.AsDuration() != time.Second {
		t.Fatalf("read at 2 s: reset %v, %v; want one intent with 1 s left", reset, out)
	}
	if n := tab.expire(t0.Add(3 * time.Second)); n != 1 || tab.len() != 0 {
		t.Fatalf("at 3 s: expired %d, %d left", n, tab.len())
	}
	// A TTL past the cap is shortened to it.
	tab.put(testIntent("r1", 3, 1, time.Hour), false, t0)
	if n := tab.expire(t0.Add(maxIntentTTL)); n != 1 {
		t.Fatalf("an intent of a 1 h TTL outlived the %v cap", maxIntentTTL)
	}
}

func TestIntentTableBoundsDropOldest(t *testing.T) {
	drops := dropCounter{}
	tab := newIntentTable(3, 0, drops)
	t0 := time.Unix(1000, 0)
	for id := uint64(1); id <= 3; id++ {
		tab.put(testIntent("r1", id, 1, time.Minute), false, t0)
	}
	// Updating intent 1 makes it the newest: intent 2 is the oldest now.
	tab.put(testIntent("r1", 1, 2, time.Minute), false, t0)
	tab.put(testIntent("r1", 4, 1, time.Minute), false, t0)
	s := tab.subscribe(func(*heldIntent) bool { return true })
	got, _ := readAll(t, tab, s, t0)
	if want := []string{"r1/3@1", "r1/1@2", "r1/4@1"}; !slices.Equal(got, want) {
		t.Fatalf("held %v, want %v (oldest update dropped)", got, want)
	}
	if drops["bound"] != 1 {
		t.Fatalf("drops %v, want bound 1", drops)
	}

	// The byte bound: intents of 1,000 hashes (about 8 kB each) in 20 kB.
	drops = dropCounter{}
	tab = newIntentTable(0, 20_000, drops)
	chain := make([]uint64, 1000)
	for id := uint64(1); id <= 5; id++ {
		tab.put(testIntent("r1", id, 1, time.Minute, chain...), false, t0)
	}
	if tab.len() != 2 || drops["bound"] != 3 || tab.bytes > 20_000 {
		t.Fatalf("byte bound: %d held in %d bytes, drops %v; want 2, at most 20000, 3 dropped", tab.len(), tab.bytes, drops)
	}
}

func TestIntentTableKeepsNewestVersion(t *testing.T) {
	drops := dropCounter{}
	tab := newIntentTable(0, 0, drops)
	t0 := time.Unix(1000, 0)
	s := tab.subscribe(func(*heldIntent) bool { return true })
	readAll(t, tab, s, t0)
	if !tab.put(testIntent("r1", 1, 5, time.Minute), false, t0) {
		t.Fatal("first version refused")
	}
	// The same update by a second path (relayed), and an older one that
	// arrives late: neither replaces version 5 nor reaches readers again.
	if tab.put(testIntent("r1", 1, 5, time.Minute), true, t0) || tab.put(testIntent("r1", 1, 4, time.Minute), true, t0) {
		t.Fatal("a duplicate or older version was stored")
	}
	got, reset := readAll(t, tab, s, t0)
	if want := []string{"r1/1@5"}; reset || !slices.Equal(got, want) {
		t.Fatalf("reader got %v (reset %v), want %v once", got, reset, want)
	}
	if drops["stale"] != 2 {
		t.Fatalf("drops %v, want stale 2", drops)
	}
	// Several updates before a read reach it once, as the newest.
	tab.put(testIntent("r1", 1, 6, time.Minute), false, t0)
	tab.put(testIntent("r1", 1, 7, time.Minute), false, t0)
	if got, _ := readAll(t, tab, s, t0); !slices.Equal(got, []string{"r1/1@7"}) {
		t.Fatalf("after two updates the reader got %v, want only the newest", got)
	}
}

func TestIntentTableReadersFilter(t *testing.T) {
	tab := newIntentTable(0, 0, nil)
	t0 := time.Unix(1000, 0)
	tab.put(testIntent("r1", 1, 1, time.Minute), false, t0)
	tab.put(testIntent("r2", 1, 1, time.Minute), true, t0)
	// A router's stream gets the other routers' intents; a relay only the
	// intents this node's own routers sent (relayed ones are not relayed
	// again, so a full mesh of nodes sends each intent once per node).
	r1 := tab.subscribe(func(h *heldIntent) bool { return h.p.RouterId != "r1" })
	relay := tab.subscribe(func(h *heldIntent) bool { return !h.relayed })
	if got, reset := readAll(t, tab, r1, t0); !reset || !slices.Equal(got, []string{"r2/1@1"}) {
		t.Fatalf("router r1 got %v (reset %v), want r2's intent with reset", got, reset)
	}
	if got, _ := readAll(t, tab, relay, t0); !slices.Equal(got, []string{"r1/1@1"}) {
		t.Fatalf("relay got %v, want only r1's (not relayed) intent", got)
	}
	tab.put(testIntent("r1", 2, 1, time.Minute), false, t0)
	tab.put(testIntent("r3", 1, 1, time.Minute), true, t0)
	if got, _ := readAll(t, tab, r1, t0); !slices.Equal(got, []string{"r3/1@1"}) {
		t.Fatalf("router r1 then got %v", got)
	}
	if got, _ := readAll(t, tab, relay, t0); !slices.Equal(got, []string{"r1/2@1"}) {
		t.Fatalf("relay then got %v", got)
	}
	// An intent that expired before the read is not sent.
	tab.put(testIntent("r2", 2, 1, time.Second), true, t0)
	if got, _ := readAll(t, tab, r1, t0.Add(time.Second)); len(got) != 0 {
		t.Fatalf("read an expired intent: %v", got)
	}
	tab.unsubscribe(r1)
	tab.put(testIntent("r2", 3, 1, time.Minute), true, t0)
	if len(r1.pending) != 0 {
		t.Fatal("an unsubscribed reader was still queued intents")
	}
}

func TestValidIntent(t *testing.T) {
	ok := testIntent("r1", 1, 1, time.Second)
	if err := validIntent(ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(p *kvdirv1.PlacementIntent)
		want string
	}{
		{"no router", func(p *kvdirv1.PlacementIntent) { p.RouterId = "" }, "router id"},
		{"no worker", func(p *kvdirv1.PlacementIntent) { p.WorkerId = "" }, "worker id"},
		{"long chain", func(p *kvdirv1.PlacementIntent) { p.Chain = make([]uint64, MaxIntentChain+1) }, "at most 8192"},
		{"no state", func(p *kvdirv1.PlacementIntent) { p.State = 0 }, "unknown state"},
		{"no ttl", func(p *kvdirv1.PlacementIntent) { p.Ttl = nil }, "ttl"},
	} {
		p := testIntent("r1", 1, 1, time.Second)
		tc.edit(p)
		if err := validIntent(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}
