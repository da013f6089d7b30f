package placement

import (
	"math/rand/v2"
	"sync"
)

// roundRobin cycles through the candidate slice by position; callers pass
// the workers in a stable order.
type roundRobin struct {
	mu   sync.Mutex
	next uint64
}

func (p *roundRobin) Name() string { return "round-robin" }

func (p *roundRobin) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	i := int(p.next % uint64(len(cands)))
	p.next++
	p.mu.Unlock()
	return decide(req, cands, i), nil
}

// randomPolicy picks uniformly at random.
type randomPolicy struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (p *randomPolicy) Name() string { return "random" }

func (p *randomPolicy) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	i := p.rng.IntN(len(cands))
	p.mu.Unlock()
	return decide(req, cands, i), nil
}

// requestLoad is the load least-load compares: running + waiting + in-flight.
func requestLoad(l Load) int { return l.Running + l.Waiting + l.InFlight }

// leastLoad picks the fewest running + waiting + in-flight requests; ties are
// broken uniformly at random.
type leastLoad struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (p *leastLoad) Name() string { return "least-load" }

func (p *leastLoad) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	best := pickBy(p.rng, len(cands), func(i, j int) int {
		return requestLoad(cands[i].Load) - requestLoad(cands[j].Load)
	})
	return decide(req, cands, best), nil
}

// prefixPolicy picks the longest matched prefix; ties go to the least load
// (as in least-load), then at random.
type prefixPolicy struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (p *prefixPolicy) Name() string { return "prefix" }

func (p *prefixPolicy) Pick(req Request, cands []Candidate) (Decision, error) {
	if err := validate(req, cands); err != nil {
		return Decision{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	best := pickBy(p.rng, len(cands), func(i, j int) int {
		if d := cands[j].MatchedBlocks - cands[i].MatchedBlocks; d != 0 { // < 0: i is longer
			return d
		}
		return requestLoad(cands[i].Load) - requestLoad(cands[j].Load)
	})
	return decide(req, cands, best), nil
}
