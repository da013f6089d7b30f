package placement

import "math"

// CacheOutcome is what became of a placement's expected cache hit: the
// tokens the worker held for the request at placement (MatchedTokens, before
// any discount), the worker's KV-cache usage then, and the prompt tokens the
// engine actually served from its cache (usage.prompt_tokens_details.
// cached_tokens, or the engine model's count).
type CacheOutcome struct {
	MatchedTokens int
	KVUsage       float64
	CachedTokens  int
	// OutputTokens is how many tokens the request generated (0: not known).
	OutputTokens int
}

// survival learns the eviction-survival curve from outcomes: per band of
// KV-cache usage at placement, the fraction of matched tokens the engine
// served from cache. Until a band has evidence it answers the prior curve
// (Retain); each outcome moves it towards what engines really do, with
// exponential forgetting so that it follows a change of traffic.
type survival struct {
	served  [survivalBands]float64 // decayed cached tokens
	matched [survivalBands]float64 // decayed matched tokens
}

// survivalBands splits usage [0, 1] into bands of 5 %.
const survivalBands = 20

// survivalPrior is how many tokens of evidence the prior curve is worth in
// a band: about one typical request's prefix.
const survivalPrior = 4096

// survivalDecay is the weight past evidence keeps per token observed in a
// band: a band's estimate is a mean over about its last 2 M matched tokens.
const survivalDecay = 1.0 / (2 << 20)

func survivalBand(u float64) int {
	if !(u > 0) { // also NaN
		return 0
	}
	return min(int(u*survivalBands), survivalBands-1)
}

// observe records one outcome.
func (s *survival) observe(o CacheOutcome) {
	if o.MatchedTokens <= 0 {
		return
	}
	b := survivalBand(o.KVUsage)
	m := float64(o.MatchedTokens)
	keep := math.Exp(-m * survivalDecay)
	s.served[b] = s.served[b]*keep + float64(min(max(o.CachedTokens, 0), o.MatchedTokens))
	s.matched[b] = s.matched[b]*keep + m
}

// retain returns the expected fraction of matched tokens served at usage u.
func (s *survival) retain(u float64) float64 {
	b := survivalBand(u)
	return (s.served[b] + survivalPrior*Retain(u)) / (s.matched[b] + survivalPrior)
}

// CacheObserver is implemented by policies that learn from what became of
// their placements' expected hits (kvdir); routers report every outcome.
type CacheObserver interface {
	ObserveCache(CacheOutcome)
}
