package router

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvdir/kvdir/internal/placement"
	"github.com/kvdir/kvdir/internal/tokenize"
)

func mustPolicy(t testing.TB, name string) placement.Policy {
	t.Helper()
	p, err := placement.New(name, placement.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustRenderer(t testing.TB) *LocalRenderer {
	t.Helper()
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewLocalRenderer(tmpl, 1000, 1<<24)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// counterValue returns the value of the series of a counter family whose
// labels include value (any label).
func counterValue(t *testing.T, s *Server, family, value string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabelValue(m, value) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func hasLabelValue(m *dto.Metric, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetValue() == v {
			return true
		}
	}
	return false
}

func TestSpecSet(t *testing.T) {
	s := newSpecSet(time.Second)
	t0 := time.Unix(100, 0)
	s.add([]uint64{1, 2, 3}, t0)
	for _, c := range []struct {
		chain []uint64
		at    time.Duration
		want  int
	}{
		{[]uint64{1, 2, 3, 4}, 0, 3},
		{[]uint64{1, 2}, 0, 2},
		{[]uint64{2, 3}, 0, 2}, // hashes are chain positions already; presence is what counts
		{[]uint64{9, 1}, 0, 0},
		{[]uint64{1, 2, 3}, 999 * time.Millisecond, 3},
		{[]uint64{1, 2, 3}, time.Second, 0}, // expired
	} {
		if got := s.matched(c.chain, t0.Add(c.at)); got != c.want {
			t.Errorf("matched(%v, +%v) = %d, want %d", c.chain, c.at, got, c.want)
		}
	}
	// A later add sweeps expired entries.
	s.add([]uint64{7}, t0.Add(2*time.Second))
	if len(s.exp) != 1 {
		t.Fatalf("%d entries after the sweep, want 1", len(s.exp))
	}
	// A pending chain (its request still queued) outlives the TTL until its
	// first byte, then lasts the TTL.
	s.pending([]uint64{5, 6}, t0)
	if got := s.matched([]uint64{5, 6}, t0.Add(time.Minute)); got != 2 {
		t.Fatalf("pending chain matched %d blocks a minute later, want 2", got)
	}
	s.add([]uint64{5, 6}, t0.Add(time.Minute))
	if got := s.matched([]uint64{5, 6}, t0.Add(time.Minute+time.Second)); got != 0 {
		t.Fatalf("chain matched %d blocks past the TTL after its first byte, want 0", got)
	}
	off := newSpecSet(-1)
	off.add([]uint64{1}, t0)
	if off.matched([]uint64{1}, t0) != 0 {
		t.Fatal("disabled speculative set matched")
	}
}

// TestBusyMeterIdle checks that a busy meter read without its lock while
// idle (never busy) reads as the locked path does: 0 before a request,
// busy while one waits, decaying after it, and not idle again then.
func TestBusyMeterIdle(t *testing.T) {
	var b busyMeter
	now := time.Now()
	if v := b.valueAt(now); v != 0 || !b.idle.Load() {
		t.Fatalf("unused meter: %v (idle %v), want 0 and idle", v, b.idle.Load())
	}
	if v := b.valueAt(now.Add(time.Minute)); v != 0 {
		t.Fatalf("unused meter a minute on: %v", v)
	}
	b.add(1)
	if b.idle.Load() {
		t.Fatal("meter idle with a request pending")
	}
	busy := b.valueAt(time.Now().Add(placement.DefaultBusyWindow / 2))
	if want := 1 - math.Exp(-0.5); math.Abs(busy-want) > 0.01 {
		t.Fatalf("half a window busy: %v, want about %v", busy, want)
	}
	b.add(-1)
	later := b.valueAt(time.Now().Add(placement.DefaultBusyWindow))
	if !(later > 0 && later < busy) || b.idle.Load() {
		t.Fatalf("after the request: %v (idle %v), want decaying from %v", later, b.idle.Load(), busy)
	}
}

func TestValidateAddress(t *testing.T) {
	for addr, ok := range map[string]bool{
		"http://10.0.0.7:8000":       true,
		"https://engine.svc:443/v1/": true,
		"ftp://x":                    false,
		"10.0.0.7:8000":              false,
		"http://user:pw@x:1":         false,
		"http://x:1/?a=b":            false,
		"http://":                    false,
	} {
		_, err := validateAddress(addr)
		if (err == nil) != ok {
			t.Errorf("validateAddress(%q) err = %v, want ok=%v", addr, err, ok)
		}
	}
	if got, _ := validateAddress("https://engine.svc:443/v1/"); got != "https://engine.svc:443/v1" {
		t.Errorf("trailing slash kept: %q", got)
	}
}

// TestLocalRendererIncremental renders random conversations turn by turn
// through the session cache and checks every turn against a whole-prompt
// rendering.
func TestLocalRendererIncremental(t *testing.T) {
	r := mustRenderer(t)
	tmpl, _ := tokenize.ChatMLCL100K()
	rng := rand.New(rand.NewPCG(7, 7))
	words := []string{"cache", " prefix", "的", " token", "\n\n", "  ", "ünïcode", "<|im_end|>", "123", " 4567", "!!", "tool_call(x)", " "}
	text := func() string {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(words[rng.IntN(len(words))])
		}
		return b.String()
	}
	roles := []string{"user", "assistant", "tool"}
	for conv := range 60 {
		session := "s" + string(rune('a'+conv%26)) + strings.Repeat("x", conv)
		msgs := []tokenize.Message{{Role: "system", Content: tokenize.TextContent(text())}}
		for turn := range 6 {
			msgs = append(msgs, tokenize.Message{Role: roles[rng.IntN(len(roles))], Content: tokenize.TextContent(text())})
			if turn == 3 && rng.IntN(3) == 0 {
				msgs[1].Content = tokenize.TextContent(text()) // an edited history must not reuse stale tokens
			}
			got, err := r.RenderChat(t.Context(), session, msgs, true)
			if err != nil {
				t.Fatal(err)
			}
			want, err := tmpl.RenderChat(msgs, true)
			if err != nil {
				t.Fatal(err)
			}
			if !equalIDs(got, want) {
				t.Fatalf("conversation %d turn %d: incremental rendering differs from whole rendering", conv, turn)
			}
		}
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
