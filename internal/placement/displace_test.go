package placement

import (
	"fmt"
	"math"
	"testing"
)

// ledgerCands returns n idle candidates, each with a cache of capacity
// tokens.
func ledgerCands(n, capacity int) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i] = Candidate{Worker: fmt.Sprintf("w%d", i), Load: Load{CapacityTokens: capacity}}
	}
	return cands
}

// displacedOn is what placing a request of key (prompt tokens, none cached
// on the candidate) on cands[i] displaces, as PickInto asks the ledger.
func displacedOn(l *ledger, key string, cands []Candidate, i, prompt int) float64 {
	d := l.view(l.entries[key], cands)
	return l.displaced(&d, &cands[i], prompt, 0)
}

func TestLedgerChargesOnlyContentThatNoLongerFits(t *testing.T) {
	var l ledger
	cands := ledgerCands(2, 10000)
	// Two sessions of 4,000 tokens of their own on w0, taking turns.
	for range 10 {
		for _, k := range []string{"a", "b"} {
			l.lookup(k)
			l.placed(k, "w0", 4000, 0)
		}
	}
	if got := l.hot["w0"]; got != 8000 {
		t.Fatalf("w0 holds %v tokens of content, want 8000", got)
	}
	// A third on w0 overflows its 10,000 tokens by 2,000; w1 has room.
	if got := displacedOn(&l, "c", cands, 0, 4000); got != 2000 {
		t.Fatalf("third session on w0 displaces %v tokens, want 2000", got)
	}
	if got := displacedOn(&l, "c", cands, 1, 4000); got != 0 {
		t.Fatalf("session on the empty w1 displaces %v tokens, want 0", got)
	}
	// The session's own worker is never charged, however full.
	l.lookup("a")
	l.placed("a", "w0", 9000, 0)
	if got := displacedOn(&l, "a", cands, 0, 9000); got != 0 {
		t.Fatalf("a on its own worker displaces %v, want 0", got)
	}
	// Moving a frees its 9,000 tokens on w0 (then 4,000 + 9,000 there):
	// w0's overflow of 3,000 goes, w1 (empty) takes 9,000 within its room.
	if got := displacedOn(&l, "a", cands, 1, 9000); got != 0 {
		t.Fatalf("moving a to w1 displaces %v, want 0 (it relieves w0)", got)
	}
	l.lookup("a")
	l.placed("a", "w1", 9000, 0)
	if l.hot["w0"] != 4000 || l.hot["w1"] != 9000 {
		t.Fatalf("after the move: w0 %v, w1 %v tokens, want 4000 and 9000", l.hot["w0"], l.hot["w1"])
	}
}

func TestLedgerLeavesUnavoidableOverflowUncharged(t *testing.T) {
	var l ledger
	cands := ledgerCands(2, 1000)
	// 1,500 tokens on each of two workers of 1,000: the cluster's 2,000
	// tokens of KV cannot hold its 3,000 of content, whatever the placement.
	for i, k := range []string{"a", "b"} {
		l.lookup(k)
		l.placed(k, cands[i].Worker, 1500, 0)
	}
	if got := displacedOn(&l, "c", cands, 0, 500); got != 0 {
		t.Fatalf("a new session on an over-full cluster displaces %v, want 0", got)
	}
	// Part of a new session's content is avoidable when the cluster has
	// room for part of it: 1,200 + 500 on w0 (cap 1,000) with w1 empty.
	var m ledger
	m.lookup("a")
	m.placed("a", "w0", 1200, 0)
	// Cluster: 1,200 of content in 2,000. Adding 500 on w0 overflows it by
	// 700 against 200 before: 500 more missed, none unavoidable.
	if got := displacedOn(&m, "c", cands, 0, 500); got != 500 {
		t.Fatalf("displaced %v, want 500", got)
	}
	// Adding 1,000 on w0 while w1 holds 500: w0 misses 1,000 more, of
	// which 700 the cluster's KV could not hold anyway (2,700 in 2,000).
	m.lookup("b")
	m.placed("b", "w1", 500, 0)
	if got := displacedOn(&m, "c", cands, 0, 1000); got != 300 {
		t.Fatalf("displaced %v, want 300", got)
	}
}

func TestLedgerSharedContentIsNotTheSessions(t *testing.T) {
	var l ledger
	// A session whose first request found 3,000 tokens cached holds only
	// what it added, also when its prompt grows and when it moves.
	l.lookup("a")
	l.placed("a", "w0", 4000, 3000)
	if got := l.hot["w0"]; got != 1000 {
		t.Fatalf("content %v, want 1000", got)
	}
	l.lookup("a")
	l.placed("a", "w0", 5000, 4500)
	if got := l.hot["w0"]; got != 2000 {
		t.Fatalf("content after a longer turn %v, want 2000", got)
	}
	l.lookup("a")
	l.placed("a", "w1", 5200, 5000)
	if _, ok := l.hot["w0"]; ok || l.hot["w1"] != 2200 {
		t.Fatalf("after moving: %v, want only w1 with 2200", l.hot)
	}
}

func TestLedgerAgesOutEndedSessions(t *testing.T) {
	var l ledger
	// Sessions of four requests each, interleaved two at a time: each comes
	// back after one other request, then ends.
	for s := 0; s < 200; s += 2 {
		for range 4 {
			for _, k := range []string{fmt.Sprint(s), fmt.Sprint(s + 1)} {
				l.lookup(k)
				l.placed(k, "w0", 100, 0)
			}
		}
	}
	if n := len(l.entries); n > 20 {
		t.Fatalf("%d sessions remembered; ended ones should age out", n)
	}
	// Three in four requests come back: the estimate is about 3/4.
	if p := l.comeBack(); math.Abs(p-0.75) > 0.1 {
		t.Fatalf("come-back share %v, want about 0.75", p)
	}
	if got, want := l.hot["w0"], 100*float64(len(l.entries)); got != want {
		t.Fatalf("content %v, want %v for the sessions remembered", got, want)
	}
	// A session aged out that comes back had not ended: it counts as back
	// and keeps the base its first request had.
	var m ledger
	m.lookup("old")
	m.placed("old", "w0", 1000, 600)
	for i := range 400 { // four sessions taking turns: each back after 4 requests
		k := fmt.Sprint("busy", i%4)
		m.lookup(k)
		m.placed(k, "w1", 10, 0)
	}
	if m.entries["old"] != nil {
		t.Fatal("a session unseen for 400 requests, against gaps of 4, is still remembered")
	}
	back := m.back
	m.lookup("old")
	m.placed("old", "w0", 1100, 1000)
	if m.back <= back {
		t.Fatalf("a buried session came back: back %v, was %v", m.back, back)
	}
	if got := m.entries["old"].own; got != 500 {
		t.Fatalf("returning session's content %v, want 500 (its base stays 600)", got)
	}
}

func TestKVDirHomesANewSessionWhereItsContentFits(t *testing.T) {
	pol, err := New("kvdir-displace", Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := pol.(*KVDir)
	if p.Name() != "kvdir-displace" {
		t.Fatalf("name %q", p.Name())
	}
	plain, err := New("kvdir", Options{})
	if err != nil {
		t.Fatal(err)
	}
	cands := ledgerCands(2, 12000)
	req := func(key string) Request { return Request{SessionKey: key, PromptTokens: 4400, BlockSize: 16} }
	// Two sessions homed on w0 (w1 looks busier, so costlier, each time).
	cands[1].Load.QueuedPrefillTokens = 512
	for _, k := range []string{"a", "b"} {
		d, err := p.Pick(req(k), cands)
		if err != nil || d.Worker != "w0" {
			t.Fatalf("session %s: %v %v, want w0", k, d.Worker, err)
		}
	}
	// A third no longer fits on w0: w1's short queue costs less than
	// recomputing what it would push out there. Plain kvdir sends all
	// three to w0.
	for _, k := range []string{"a", "b", "c"} {
		if d, err := plain.Pick(req(k), cands); err != nil || d.Worker != "w0" || d.Scores[0].DisplaceMs != 0 {
			t.Fatalf("kvdir, session %s: %v %v, want w0 and no displacement", k, d.Worker, err)
		}
	}
	d, err := p.Pick(req("c"), cands)
	if err != nil {
		t.Fatal(err)
	}
	if d.Worker != "w1" || d.Scores[0].DisplaceMs <= 0 || d.Scores[1].DisplaceMs != 0 {
		t.Fatalf("third session: %s, displacement %v / %v, want w1 and a charge on w0 only",
			d.Worker, d.Scores[0].DisplaceMs, d.Scores[1].DisplaceMs)
	}
}
