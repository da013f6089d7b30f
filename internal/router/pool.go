package router

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvdir/kvdir/internal/placement"
)

// worker is one engine replica the router may send requests to.
//
// The fields a decision reads for every candidate come first, so that
// they share a few cache lines: a decision over a thousand candidates
// reads a thousand workers.
type worker struct {
	id string

	// Load scraped from the engine (or from the directory until the first scrape).
	running atomic.Int32
	waiting atomic.Int32
	kvUsage atomic.Uint64 // math.Float64bits
	// capacityTokens is the engine's KV cache size (0 until a scrape says).
	capacityTokens atomic.Int64

	// The router's own accounting.
	inFlight      atomic.Int64 // requests sent and not finished
	queuedPrefill atomic.Int64 // uncached prompt tokens sent and not yet past their first byte
	downUntil     atomic.Int64 // unix nanos: excluded after a connection failure until then
	draining      atomic.Bool

	blockSize atomic.Int32
	// learned holds the indexed block sizes the directory learned from the
	// worker's events (ascending; nil while none is known).
	learned atomic.Pointer[[]int]
	modelp  atomic.Pointer[string] // served model; "" until known (static workers learn it from metrics)
	// group is the directory group the worker was discovered from (nil:
	// a static worker, or one given without a group: the first group).
	group *group
	spec  *specSet  // speculative entries: chains this router placed here recently
	busy  busyMeter // how much of the recent past a request sent here awaited its first byte

	address string // base URL, e.g. "http://10.0.0.7:8000"; validated
	// endpoint is address's host:port ("10.0.0.7:8000"; the scheme's
	// default port when address names none): the pod endpoint an
	// endpoint picker's data plane names the worker by.
	endpoint string

	// rank, with hasRank, is the data-parallel rank of the engine at
	// address this worker is (fixed for the worker's life).
	rank    int
	hasRank bool

	scrapeAt atomic.Int64 // unix nanos of the last successful scrape
	scrapeKO atomic.Int32 // consecutive failed scrapes

	// served is the engine's last readable /v1/models (nil until one was
	// read); modelsKO counts the failed reads since.
	served   atomic.Pointer[servedModels]
	modelsKO atomic.Int32

	stop chan struct{} // closed when the worker leaves the pool (ends its scraper)
}

// model returns the model w serves, or "" while unknown.
func (w *worker) model() string {
	if p := w.modelp.Load(); p != nil {
		return *p
	}
	return ""
}

// setModel records the model w serves.
func (w *worker) setModel(m string) {
	if w.model() != m {
		w.modelp.Store(&m)
	}
}

// routable reports whether new requests may go to w at now.
func (w *worker) routable(now time.Time) bool {
	return !w.draining.Load() && w.downUntil.Load() <= now.UnixNano()
}

// load returns w's load as placement sees it.
func (w *worker) load() placement.Load { return w.loadAt(time.Now()) }

// loadAt is load with the busy fraction at now: a decision reads every
// candidate's load at its own start, not the clock once per candidate.
func (w *worker) loadAt(now time.Time) placement.Load {
	return placement.Load{
		Running:             int(w.running.Load()),
		Waiting:             int(w.waiting.Load()),
		KVUsage:             loadFloat(&w.kvUsage),
		QueuedPrefillTokens: int(w.queuedPrefill.Load()),
		InFlight:            int(w.inFlight.Load()),
		Busy:                w.busy.valueAt(now),
		CapacityTokens:      int(w.capacityTokens.Load()),
	}
}

// workerSpec is what discovery knows of a worker.
type workerSpec struct {
	ID, Address, Model string
	BlockSize          int
	// BlockSizes are the indexed block sizes the directory learned from
	// the worker's events (Worker.layout), ascending; nil when none is
	// known (which clears what was learned before).
	BlockSizes []int
	Draining   bool
	// Rank, with HasRank, is the engine's data-parallel rank this worker
	// stands for (a static worker's #rank, or the registered
	// data_parallel_rank). Several such workers share one address.
	Rank    int
	HasRank bool
	// Load from the directory (agents' heartbeats), used until the router's
	// own scrape of the engine succeeds.
	Running, Waiting int
	KVUsage          float64
}

// validateAddress checks that a worker address is an absolute http(s) URL
// with a host and nothing a client could abuse (no user info, query or
// fragment), and returns it without a trailing slash.
func validateAddress(addr string) (string, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("worker address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("worker address %q: scheme must be http or https", addr)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("worker address %q: want scheme://host:port[/path] without user, query or fragment", addr)
	}
	s := u.String()
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s, nil
}

// endpointOf returns the host:port of a validated worker address, with the
// scheme's default port when it names none.
func endpointOf(addr string) string {
	u, err := url.Parse(addr)
	if err != nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// workerSet is one immutable version of the pool: the workers by id, and
// the same workers ordered by id (the order candidates are offered in).
type workerSet struct {
	byID   map[string]*worker
	sorted []*worker
}

// pool is the set of known workers. Reads (every request) load the current
// set without locking; updates (discovery) build a new one.
type pool struct {
	mu      sync.Mutex // serialises updates
	set     atomic.Pointer[workerSet]
	onAdd   func(*worker) // starts a new worker's scraper
	specTTL time.Duration
}

func newPool(specTTL time.Duration, onAdd func(*worker)) *pool {
	p := &pool{onAdd: onAdd, specTTL: specTTL}
	p.set.Store(&workerSet{byID: map[string]*worker{}})
	return p
}

// snapshot returns the current workers by id; the map must not be modified.
func (p *pool) snapshot() map[string]*worker { return p.set.Load().byID }

// sorted returns the current workers ordered by id; the slice must not be
// modified.
func (p *pool) sorted() []*worker { return p.set.Load().sorted }

// store makes byID the current set.
func (p *pool) store(byID map[string]*worker) {
	sorted := make([]*worker, 0, len(byID))
	for _, w := range byID {
		sorted = append(sorted, w)
	}
	slices.SortFunc(sorted, func(a, b *worker) int { return strings.Compare(a.id, b.id) })
	p.set.Store(&workerSet{byID: byID, sorted: sorted})
}

// replace makes specs the complete worker set (a discovery snapshot).
func (p *pool) replace(specs []workerSpec) []error {
	return p.update(nil, specs, true, nil)
}

// replaceGroup makes specs the complete set of g's workers (a discovery
// snapshot of g's directory); the other groups' workers stay.
func (p *pool) replaceGroup(g *group, specs []workerSpec) []error {
	return p.update(g, specs, true, nil)
}

// applyGroup adds or updates g's workers specs and removes g's workers in
// gone.
func (p *pool) applyGroup(g *group, specs []workerSpec, gone []string) []error {
	return p.update(g, specs, false, gone)
}

// update applies a discovery message of group g. A worker id another
// group already holds is refused: ids are unique across the fleet.
func (p *pool) update(g *group, specs []workerSpec, full bool, gone []string) (errs []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.snapshot()
	next := make(map[string]*worker, len(old)+len(specs))
	for id, w := range old {
		if !full || w.group != g {
			next[id] = w
		}
	}
	for _, id := range gone {
		if w := next[id]; w != nil && w.group == g {
			delete(next, id)
		}
	}
	for _, s := range specs {
		addr, err := validateAddress(s.Address)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %s: %w", s.ID, err))
			continue
		}
		if other := next[s.ID]; other != nil && other.group != g {
			errs = append(errs, fmt.Errorf("worker %s: registered in directory group %s as well as %s; ids must be unique across groups, keeping %s's",
				s.ID, groupName(other.group), groupName(g), groupName(other.group)))
			continue
		}
		w, ok := old[s.ID]
		if !ok || w.group != g || w.address != addr || (s.Model != "" && w.model() != s.Model) || w.hasRank != s.HasRank || w.rank != s.Rank {
			w = &worker{id: s.ID, address: addr, endpoint: endpointOf(addr), rank: s.Rank, hasRank: s.HasRank, group: g, spec: newSpecSet(p.specTTL), stop: make(chan struct{})}
			w.setModel(s.Model)
			if s.Running != 0 || s.Waiting != 0 || s.KVUsage != 0 {
				w.running.Store(int32(s.Running))
				w.waiting.Store(int32(s.Waiting))
				storeFloat(&w.kvUsage, s.KVUsage)
			}
		} else if w.scrapeAt.Load() == 0 {
			w.running.Store(int32(s.Running))
			w.waiting.Store(int32(s.Waiting))
			storeFloat(&w.kvUsage, s.KVUsage)
		}
		if s.BlockSize > 0 {
			w.blockSize.Store(int32(s.BlockSize))
		}
		w.setLearned(s.BlockSizes)
		w.draining.Store(s.Draining)
		next[s.ID] = w
	}
	p.store(next)
	for id, w := range old {
		if nw, ok := next[id]; !ok || nw != w {
			close(w.stop)
		}
	}
	for id, w := range next {
		if ow, ok := old[id]; (!ok || ow != w) && p.onAdd != nil {
			p.onAdd(w)
		}
	}
	return errs
}

// groupName names g in messages ("" for no group: the first).
func groupName(g *group) string {
	if g == nil {
		return DefaultGroup
	}
	return g.name
}

// close stops every worker's scraper.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.snapshot() {
		close(w.stop)
	}
	p.store(map[string]*worker{})
}

// busyMeter is placement.BusyMeter on the wall clock, safe for concurrent
// use; the zero value is ready.
type busyMeter struct {
	// idle says the meter reads 0 and nothing is pending, so that it will
	// read 0 until the next add: reading it then needs no lock. Set under
	// mu.
	idle  atomic.Bool
	mu    sync.Mutex
	start time.Time
	m     placement.BusyMeter
}

func (b *busyMeter) since(now time.Time) time.Duration {
	if b.start.IsZero() {
		b.start = now
	}
	return now.Sub(b.start)
}

// add records delta more (or fewer) requests awaiting their first byte.
func (b *busyMeter) add(delta int) {
	b.mu.Lock()
	b.m.Add(b.since(time.Now()), delta)
	b.idle.Store(false) // the next read (under mu) says whether it is idle
	b.mu.Unlock()
}

// value returns the busy fraction now.
func (b *busyMeter) value() float64 { return b.valueAt(time.Now()) }

// valueAt returns the busy fraction at now. A now before the meter's last
// change counts as that change's time (placement.BusyMeter does not go
// back).
//
// An idle meter (nothing pending, its value decayed to 0, or never used)
// reads 0 without the lock: every decision reads every candidate's.
func (b *busyMeter) valueAt(now time.Time) float64 {
	if b.idle.Load() {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.m.Value(b.since(now))
	b.idle.Store(v == 0 && b.m.Pending() == 0)
	return v
}
