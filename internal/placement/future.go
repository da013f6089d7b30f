package placement

// future estimates what a placement commits the worker to beyond the
// request itself: a session's later requests carry its prefix and follow
// it to the worker that holds it, so they will queue there.
//
// The expected number of later requests of a session is estimated from the
// session keys seen: with R requests over S distinct sessions (both
// decayed, so the estimate follows the traffic), a session has R/S requests
// on average, and, taking session lengths as memoryless, R/S − 1 more after
// any one of them. Each of them waits, on average, what a request arriving
// at a worker with busy fraction u waits in an M/G/1 queue with exponential
// service: u/(1−u) times the mean service time (the modelled prefill of
// the requests placed, decayed the same way).
type future struct {
	recent   [futureSlots]uint64 // hashes of recent session keys (a lossy set)
	requests float64
	sessions float64
	service  float64 // mean modelled prefill of the placed requests, ms
	weight   float64 // decayed count behind service
}

// futureSlots sizes the set of recent session keys; a key evicted by a
// collision counts again as a new session, which only lowers the estimate.
const futureSlots = 1 << 14

// futureDecay is the weight an observation keeps after one more: the
// estimates are means over about the last 1/(1−futureDecay) requests.
const futureDecay = 1 - 1.0/2048

// maxBusy caps the busy fraction in the queueing formula, which grows
// without bound as u → 1.
const maxBusy = 0.9

// observe counts a request of session key and returns the expected number
// of later requests of its session and the mean service time in ms, and
// whether the session is new (its key not seen recently).
func (f *future) observe(key string) (later, service float64, fresh bool) {
	f.requests = f.requests*futureDecay + 1
	f.sessions *= futureDecay
	fresh = true
	if key == "" {
		f.sessions++
	} else {
		h := fnv64(key) | 1
		slot := &f.recent[h%futureSlots]
		if *slot != h {
			*slot = h
			f.sessions++
		} else {
			fresh = false
		}
	}
	if f.sessions > 0 {
		later = max(f.requests/f.sessions-1, 0)
	}
	return later, f.service, fresh
}

// served records the modelled prefill of the placed request.
func (f *future) served(prefillMs float64) {
	f.weight = f.weight*futureDecay + 1
	f.service += (prefillMs - f.service) / f.weight
}

// backlog is the mean number of requests in an M/M/1 queue whose server is
// busy a fraction u of the time, u/(1−u): how many requests, on average,
// extra work added to a worker that busy delays, however short its queue
// is at the moment.
func backlog(u float64) float64 {
	u = min(max(u, 0), maxBusy)
	return u / (1 - u)
}

// addFuture charges s with the expected queueing of the session's later
// requests on c's worker.
func addFuture(s *Score, c *Candidate, later, service float64) {
	q := backlog(c.Load.Busy)
	if later <= 0 || q <= 0 || service <= 0 {
		return
	}
	s.FutureMs = later * q * service
	s.TotalMs += s.FutureMs
}

// fnv64 is the FNV-1a hash of s (deterministic, so runs repeat).
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}
