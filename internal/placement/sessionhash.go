package placement

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// SessionHash is bounded-load consistent hashing on the session key, with the
// semantics of HAProxy's "hash-balance-factor" (HAProxy configuration manual,
// https://docs.haproxy.org/ configuration.txt, "hash-balance-factor", added in
// HAProxy 1.7; see also Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing
// with Bounded Loads", SODA 2018): the factor is the maximum load of a server as a
// percentage of the average load, e.g. 150 lets a server take 1.5 times the
// average; 0 disables it; it applies to "hash-type consistent").
//
// What is implemented, with equal weights and load counted as Load.InFlight:
//
//   - Each worker owns VirtualNodes points on a 64-bit ring, at
//     hash(worker + "#" + i). The request's key is hashed to a point; its
//     home worker owns the first ring point at or after it (wrapping).
//   - The bound counts the request being placed, as HAProxy does:
//     cap = max(1, ⌈(Σ InFlight + 1) · factor / (100 · N)⌉). A worker is
//     eligible when InFlight < cap.
//   - If the home worker is not eligible the walk continues clockwise to the
//     next distinct worker until one is eligible. With factor ≥ 100 one always
//     is, since N workers all at cap would hold more than the total.
//   - The key is Request.SessionKey; when it is empty, the chain prefix hashes;
//     when both are empty the request goes round-robin (as HAProxy does for a
//     missing hash key).
//
// Adding or removing a worker moves only the keys whose ring arcs change owner,
// about 1/N of them.
type SessionHash struct {
	factor int // ≥ 100, or < 0 for no bound
	vnodes int

	mu      sync.Mutex
	ring    []ringPoint    // sorted by hash
	names   []string       // ring worker index → name
	index   map[string]int // name → ring worker index
	toCand  []int          // scratch: ring worker index → candidate index
	visited []bool         // scratch
	rr      uint64
}

type ringPoint struct {
	h uint64
	w int32
}

// NewSessionHash returns a session-hash policy configured by opts
// (HashBalanceFactor, VirtualNodes).
func NewSessionHash(opts Options) (*SessionHash, error) {
	f := opts.HashBalanceFactor
	switch {
	case f == 0:
		f = 150
	case f > 0 && f < 100:
		return nil, fmt.Errorf("placement: hash balance factor %d: want ≥ 100 (percent of the average load), or negative to disable", f)
	}
	vn := opts.VirtualNodes
	if vn <= 0 {
		vn = 512
	}
	return &SessionHash{factor: f, vnodes: vn}, nil
}

// Name returns "session-hash".
func (p *SessionHash) Name() string { return "session-hash" }

// Pick returns the key's ring owner, or the next eligible worker on the ring.
func (p *SessionHash) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	key, ok := requestKey(req)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		i := int(p.rr % uint64(len(cands)))
		p.rr++
		return decide(req, cands, i), nil
	}
	p.sync(cands)
	total := 0
	for i := range cands {
		total += cands[i].Load.InFlight
	}
	capacity := 0
	if p.factor > 0 {
		n := 100 * len(p.names)
		capacity = max(1, ((total+1)*p.factor+n-1)/n)
	}
	clear(p.visited)
	start, _ := slices.BinarySearchFunc(p.ring, key, func(pt ringPoint, k uint64) int {
		switch {
		case pt.h < k:
			return -1
		case pt.h > k:
			return 1
		}
		return 0
	})
	first := -1
	for k := range p.ring {
		w := p.ring[(start+k)%len(p.ring)].w
		if p.visited[w] {
			continue
		}
		p.visited[w] = true
		ci := p.toCand[w]
		if first < 0 {
			first = ci
		}
		if capacity == 0 || cands[ci].Load.InFlight < capacity {
			return decide(req, cands, ci), nil
		}
	}
	return decide(req, cands, first), nil // unreachable with factor ≥ 100
}

// sync rebuilds the ring when the candidate set changed and maps ring workers
// to candidate indexes. Duplicate names share one worker's points (the last
// candidate with the name wins).
func (p *SessionHash) sync(cands []Candidate) {
	same := len(cands) == len(p.names)
	for i := 0; same && i < len(cands); i++ {
		_, same = p.index[cands[i].Worker]
	}
	if !same {
		p.build(cands)
	}
	for i := range cands {
		p.toCand[p.index[cands[i].Worker]] = i
	}
}

func (p *SessionHash) build(cands []Candidate) {
	names := make([]string, 0, len(cands))
	for i := range cands {
		names = append(names, cands[i].Worker)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	p.names = names
	p.index = make(map[string]int, len(names))
	p.ring = make([]ringPoint, 0, len(names)*p.vnodes)
	buf := make([]byte, 0, 64)
	for w, name := range names {
		p.index[name] = w
		for v := range p.vnodes {
			buf = append(append(append(buf[:0], name...), '#'), strconv.Itoa(v)...)
			p.ring = append(p.ring, ringPoint{h: hashBytes(buf), w: int32(w)})
		}
	}
	slices.SortFunc(p.ring, func(a, b ringPoint) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return int(a.w - b.w)
	})
	p.toCand = make([]int, len(names))
	p.visited = make([]bool, len(names))
}

// requestKey hashes the session key, or else the chain prefix. ok is false
// when the request has neither.
func requestKey(req Request) (uint64, bool) {
	if req.SessionKey != "" {
		return hashString(req.SessionKey), true
	}
	if len(req.ChainPrefix) == 0 {
		return 0, false
	}
	h := uint64(fnvOffset)
	for _, b := range req.ChainPrefix {
		h = mix64(h ^ b)
	}
	return h, true
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// hashString is FNV-1a 64 followed by a finalizer, stable across processes so
// that every router replica agrees on the ring.
func hashString(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return mix64(h)
}

func hashBytes(b []byte) uint64 {
	h := uint64(fnvOffset)
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return mix64(h)
}

// mix64 is the SplitMix64 finalizer; it spreads FNV's weak low bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
