package placement

import (
	"container/list"
	"math"
)

// ledger remembers what the policy's own placements left in each worker's
// cache, so that a placement can be charged for the content it pushes out.
//
// A session's content is its latest prompt beyond what its first request
// found cached (a shared system prompt a worker already held is not the
// session's); it sits on the session's latest worker. A worker's hot content
// is the sum over the sessions whose latest worker it is, valued by the
// chance that a session comes back: sessions are taken as memoryless, so
// that chance is the share of sessions that came back among those that came
// back or aged out of the ledger. A session ages out once it more likely
// ended than not (ageLimit, from the mean gap between a session's requests
// and that chance); time is counted in requests placed, so the ledger needs
// no clock. Where sessions are short, few age out and the ledger soon holds
// more than the cluster's KV: its charges then vanish (below), and the term
// does nothing rather than misjudge.
//
// A cache of C tokens holding hot content H misses max(0, H − C) of it at
// each reuse (LRU over content reused at similar rates). Placing a request
// on worker w adds to w the tokens w does not hold yet; if the session's
// latest worker is another one, its content there is freed. What that does
// to the sum of the workers' misses, less what it adds to the cluster's
// unavoidable misses (its hot content beyond all its KV, which no placement
// avoids), is the content the placement displaces. It is zero while hot
// content fits where it sits, and when the cluster's hot content exceeds
// all its KV.
type ledger struct {
	entries map[string]*ledgerEntry
	order   list.List          // *ledgerEntry, least recently seen first
	hot     map[string]float64 // worker → its sessions' content, tokens (unweighted)
	now     uint64             // requests counted
	// exposure is the decayed sum, over requests, of the sessions in the
	// ledger then: their time at risk of coming back, in requests. Exposure
	// over back, the decayed count of returns, estimates the mean gap
	// between a session's requests (the exponential's estimate with
	// censored waits: a session not back yet counts its wait so far, so
	// that long gaps are not missed).
	exposure float64
	// back and aged count (decayed) the sessions that came back and those
	// that aged out: the chance of coming back after a request is
	// back/(back+aged).
	back, aged float64
	// gone holds the bases of sessions aged out, at most ledgerMax (the
	// oldest forgotten first, ring in goneKeys): one that comes back had not
	// ended, so its ageing is undone; it counts as back and keeps its base,
	// instead of taking its own content, still cached, for shared content.
	gone     map[string]goneEntry
	goneKeys []string
	goneNext int
}

// goneEntry is an aged-out session's base and its slot in goneKeys.
type goneEntry struct{ base, slot int }

// ledgerEntry is one session's latest placement.
type ledgerEntry struct {
	key    string
	worker string
	base   int    // tokens its first request found cached: content it shares
	own    int    // its content on worker: its latest prompt less base
	last   uint64 // ledger.now at its latest request
	elem   *list.Element
}

// ledgerMax bounds the sessions remembered; past it the least recently
// seen one ages out.
const ledgerMax = 1 << 16

// lookup counts a request of session key and returns its entry (nil for a
// session not in the ledger or an empty key) after ageing out the sessions
// that more likely ended than not.
func (l *ledger) lookup(key string) *ledgerEntry {
	l.now++
	l.exposure = l.exposure*futureDecay + float64(len(l.entries))
	l.expire()
	if key == "" || l.entries == nil {
		return nil
	}
	e := l.entries[key]
	if e != nil {
		l.back = l.back*futureDecay + 1
		l.aged *= futureDecay
	} else if _, ok := l.gone[key]; ok {
		l.back = l.back*futureDecay + 1
		l.aged = max(l.aged*futureDecay-1, 0) // it had not ended
	}
	return e
}

// expire ages out the sessions unseen for more than ageLimit mean gaps,
// and the oldest past ledgerMax.
func (l *ledger) expire() {
	for f := l.order.Front(); f != nil; f = l.order.Front() {
		e := f.Value.(*ledgerEntry)
		if len(l.entries) <= ledgerMax && (l.back == 0 || float64(l.now-e.last)*l.back <= l.ageLimit()*l.exposure) {
			return
		}
		l.remove(e)
		l.aged = l.aged*futureDecay + 1
		l.back *= futureDecay
		l.bury(e)
	}
}

// bury remembers e as aged out, forgetting the oldest such past ledgerMax.
func (l *ledger) bury(e *ledgerEntry) {
	if l.gone == nil {
		l.gone = make(map[string]goneEntry)
		l.goneKeys = make([]string, ledgerMax)
	}
	if old := l.goneKeys[l.goneNext]; old != "" && l.gone[old].slot == l.goneNext {
		delete(l.gone, old) // unless buried again since, in a newer slot
	}
	l.goneKeys[l.goneNext] = e.key
	l.gone[e.key] = goneEntry{base: e.base, slot: l.goneNext}
	l.goneNext = (l.goneNext + 1) % ledgerMax
}

// ageLimit is how many mean gaps a session may go unseen before it more
// likely ended than not. Sessions are memoryless: after each request one
// comes back with probability p, after an exponential gap of mean g;
// unseen for t, it is still alive with odds p·e^(−t/g) : 1−p, even at
// t = g·ln(p/(1−p)). The odds count one session back and one aged out
// before any evidence, so that the limit is finite from the start.
func (l *ledger) ageLimit() float64 {
	return math.Log((l.back + 1) / (l.aged + 1))
}

// remove drops e and its content.
func (l *ledger) remove(e *ledgerEntry) {
	l.addHot(e.worker, -float64(e.own))
	l.order.Remove(e.elem)
	delete(l.entries, e.key)
}

// addHot adds d tokens to worker's content, dropping a worker left with none.
func (l *ledger) addHot(worker string, d float64) {
	h := l.hot[worker] + d
	if h <= 0.5 {
		delete(l.hot, worker)
		return
	}
	l.hot[worker] = h
}

// comeBack is the chance that a session is seen again after a request:
// the share of sessions that came back among those that came back or aged
// out; 1 until one has aged out.
func (l *ledger) comeBack() float64 {
	if l.aged == 0 {
		return 1
	}
	return l.back / (l.back + l.aged)
}

// placed records that the request of session key, prompt tokens long, went
// to worker finding cached tokens there.
func (l *ledger) placed(key, worker string, prompt, cached int) {
	if key == "" {
		return
	}
	if l.entries == nil {
		l.entries = make(map[string]*ledgerEntry)
		l.hot = make(map[string]float64)
	}
	e := l.entries[key]
	if e == nil {
		e = &ledgerEntry{key: key, worker: worker, base: cached}
		if g, ok := l.gone[key]; ok {
			e.base = g.base
			delete(l.gone, key)
		}
		e.elem = l.order.PushBack(e)
		l.entries[key] = e
	} else {
		l.order.MoveToBack(e.elem)
		if e.worker != worker {
			l.addHot(e.worker, -float64(e.own))
			e.worker, e.own = worker, 0
		}
	}
	own := max(prompt-e.base, 0)
	l.addHot(worker, float64(own-e.own))
	e.own, e.last = own, l.now
}

// overflow is the hot content a cache of capacity tokens misses.
func overflow(hot, capacity float64) float64 { return max(hot-capacity, 0) }

// displacement is the ledger's view of one Pick: the session's entry and
// the candidates' hot content, weighted by the chance of coming back.
type displacement struct {
	e        *ledgerEntry
	weight   float64 // comeBack
	hot      float64 // Σ over the candidates with a known capacity
	capacity float64 // Σ of those capacities
	fromHot  float64 // the session's latest worker's hot content, if a candidate with a capacity
	fromCap  float64 // and its capacity (0: not among them)
}

// view prepares the charges for a request of the session whose entry is e.
func (l *ledger) view(e *ledgerEntry, cands []Candidate) displacement {
	d := displacement{e: e, weight: l.comeBack()}
	for i := range cands {
		c := &cands[i]
		if c.Load.CapacityTokens <= 0 {
			continue
		}
		h := d.weight * l.hot[c.Worker]
		d.hot += h
		d.capacity += float64(c.Load.CapacityTokens)
		if e != nil && c.Worker == e.worker {
			d.fromHot, d.fromCap = h, float64(c.Load.CapacityTokens)
		}
	}
	return d
}

// displaced is the content, in tokens, that placing the request on c
// (prompt tokens, cached of them there) pushes out of caches beyond what the
// cluster's KV could not hold anyway. The session's latest worker is not
// charged; neither is a worker of unknown capacity.
func (l *ledger) displaced(d *displacement, c *Candidate, prompt int, cached float64) float64 {
	capW := float64(c.Load.CapacityTokens)
	if capW <= 0 || (d.e != nil && c.Worker == d.e.worker) {
		return 0
	}
	add := d.weight * max(float64(prompt)-cached, 0)
	hotW := d.weight * l.hot[c.Worker]
	local := overflow(hotW+add, capW) - overflow(hotW, capW)
	net := add
	if d.fromCap > 0 {
		freed := d.weight * float64(d.e.own)
		local += overflow(d.fromHot-freed, d.fromCap) - overflow(d.fromHot, d.fromCap)
		net -= freed
	}
	unavoidable := overflow(d.hot+net, d.capacity) - overflow(d.hot, d.capacity)
	return max(local-unavoidable, 0)
}

// addDisplace charges s with the recomputation its displaced content costs:
// each displaced token is prefilled again at rate ms, at each of the
// session's expected reuses (1 + later), and delays the requests behind it
// on a worker as busy as c's (1 + u/(1−u)).
func addDisplace(s *Score, c *Candidate, tokens, rate, later float64) {
	if tokens <= 0 {
		return
	}
	s.DisplaceMs = tokens * rate * (1 + later) * (1 + backlog(c.Load.Busy))
	s.TotalMs += s.DisplaceMs
}
