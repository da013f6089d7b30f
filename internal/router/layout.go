package router

import (
	"context"
	"slices"
	"time"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// maxLearnedSizes bounds the block sizes the router hashes one worker's
// prompts in (the directory bounds a layout to 16).
const maxLearnedSizes = 16

// learnedSizes returns the indexed block sizes of a directory worker's
// layout, ascending and in range; nil when it has none.
func learnedSizes(w *kvdirv1.Worker) []int {
	var out []int
	for _, bs := range w.GetLayout().GetBlockSizes() {
		if bs >= 1 && bs <= blockhash.MaxBlockSize && len(out) < maxLearnedSizes {
			out = append(out, int(bs))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// setLearned records the block sizes learned for w (nil: none).
func (w *worker) setLearned(sizes []int) {
	if len(sizes) == 0 {
		if w.learned.Load() != nil {
			w.learned.Store(nil)
		}
		return
	}
	if p := w.learned.Load(); p != nil && slices.Equal(*p, sizes) {
		return
	}
	c := slices.Clone(sizes)
	w.learned.Store(&c)
}

// blockSizesOf returns the block sizes w's prompts are hashed in: the
// indexed block sizes the directory learned from its events, ascending;
// else the block size its agent registered; else the configured default.
func (s *Server) blockSizesOf(w *worker) []int {
	if p := w.learned.Load(); p != nil && len(*p) > 0 {
		return *p
	}
	if bs := int(w.blockSize.Load()); bs > 0 {
		return oneBlockSize(bs)
	}
	return oneBlockSize(s.cfg.BlockSize)
}

// singleSizes are the one-size lists of the usual block sizes, shared so
// that a decision does not allocate one per candidate; callers only read
// what blockSizesOf returns.
var singleSizes = func() (out [257][]int) {
	for i := range out {
		out[i] = []int{i}
	}
	return out
}()

func oneBlockSize(bs int) []int {
	if bs >= 0 && bs < len(singleSizes) {
		return singleSizes[bs]
	}
	return []int{bs}
}

// blockSizeOf returns w's (first) KV block size: the smallest learned from
// its events when the directory knows one, else its registered one, else
// the configured default.
func (s *Server) blockSizeOf(w *worker) int { return s.blockSizesOf(w)[0] }

// watchStaticLayouts gives static workers the layout the directory learned
// for the directory worker of the same id, until ctx ends. Static workers
// without one keep hashing with the configured block size.
func (s *Server) watchStaticLayouts(ctx context.Context) {
	err := s.groups[0].dir.WatchWorkers(ctx, "", func(resp *kvdirv1.WatchWorkersResponse) error {
		byID := s.pool.snapshot()
		seen := map[string]bool{}
		for _, dw := range resp.GetWorkers() {
			id := dw.GetSpec().GetId()
			w := byID[id]
			if w == nil {
				continue
			}
			seen[id] = true
			st := dw.GetState()
			if st == kvdirv1.WorkerState_WORKER_STATE_EXPIRED || st == kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED {
				w.setLearned(nil)
				continue
			}
			w.setLearned(learnedSizes(dw))
		}
		if resp.GetSnapshot() {
			for id, w := range byID {
				if !seen[id] {
					w.setLearned(nil)
				}
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("router: watching the directory for static workers' layouts stopped; they keep the block sizes known so far", "err", err)
	}
}

// nsCache keeps the chain and the directory's answers of the namespace the
// previous candidate was matched in: the candidates of a decision mostly
// share one, and looking both up by namespace (three strings hashed) for
// each of a thousand candidates showed in the decision's time.
type nsCache struct {
	ns    blockhash.Namespace
	ok    bool // ns, chain, err and ans are set
	chain []uint64
	err   error
	ans   *dirAnswer // nil: the directory was not asked in ns
}

func (c *nsCache) get(d *decision, ns blockhash.Namespace, chainFor func(blockhash.Namespace) ([]uint64, error)) *nsCache {
	if c.ok && c.ns == ns {
		return c
	}
	c.ns, c.ok = ns, true
	c.chain, c.err = chainFor(ns)
	c.ans = d.dirBy[ns]
	return c
}

// matchCandidateIn sets candidate i's matched blocks: in each of its block
// sizes, the longest of what the directory, this router's speculative
// entries and the other routers' shared intents hold; with several sizes (a worker that indexes blocks of more
// than one size) the size matching the most tokens wins, the smaller on a
// tie. The result is expressed in blocks of d.blockSize, and d.bs, d.dir
// and d.spec say the size used and the blocks found in it.
//
// The speculative entries are walked only when they can hold more than the
// directory does, that is when they hold the block after the directory's:
// for a session's next turn the directory already holds the earlier turns,
// and walking them again in the speculative set would cost a look-up per
// block. d.spec is then -1 (at most d.dir; speculativeBlocks counts them),
// and so is d.peerSpec for the other routers' entries (peerSpeculativeBlocks).
// cache holds the namespace of the previous candidate of the decision's
// loop (nsCache).
func (s *Server) matchCandidateIn(d *decision, i int, w *worker, chainFor func(blockhash.Namespace) ([]uint64, error), now time.Time, cache *nsCache) {
	bestTokens := -1
	var bestDir dirMatch // the directory's answer in the winning size
	bestSpec := 0        // the speculative blocks (both kinds) in it
	for _, bs := range s.blockSizesOf(w) {
		ns := d.ns.at(i)
		ns.BlockSize = bs
		c := cache.get(d, ns, chainFor)
		chain, err := c.chain, c.err
		if err != nil {
			continue
		}
		dir := -1
		var dm dirMatch
		if c.ans != nil {
			dm = c.ans.get(w.id)
			dir = dm.blocks
		}
		spec, peer := -1, -1
		if dir < 0 || (dir < len(chain) && w.spec.matched(chain[dir:dir+1], now) == 1) {
			spec = w.spec.matched(chain, now)
		}
		if dir < 0 || (dir < len(chain) && d.group.share.matched(w.id, chain[dir:dir+1]) == 1) {
			peer = d.group.share.matched(w.id, chain)
		}
		if tokens := max(spec, peer, dir, 0) * bs; tokens > bestTokens {
			bestTokens = tokens
			d.bs[i], d.spec[i], d.dir[i] = bs, spec, dir
			bestDir, bestSpec = dm, max(spec, peer, 0)
			if d.peerSpec != nil {
				d.peerSpec[i] = peer
			}
		}
	}
	if bestTokens > 0 {
		d.cands[i].MatchedBlocks = bestTokens / d.blockSize
		// The tiers: a speculative entry is a placement's prefix, on the
		// GPU; beyond it and the directory's GPU run, host memory up to
		// the GPU-or-host run, then disk (placement.TierSplit).
		bs := d.bs[i]
		gpu := max(bestSpec, bestDir.gpu)
		host, disk := placement.TierSplit(bestTokens/bs, gpu, max(gpu, bestDir.fast))
		d.cands[i].HostBlocks, d.cands[i].DiskBlocks = host*bs/d.blockSize, disk*bs/d.blockSize
	}
}

// speculativeBlocks returns candidate i's speculative blocks in its
// block size d.bs[i], counting them when matchCandidateIn did not.
func (s *Server) speculativeBlocks(d *decision, i int) int {
	if d.spec[i] >= 0 || d.prompt == nil {
		return max(d.spec[i], 0)
	}
	ns := d.ns.at(i)
	ns.BlockSize = d.bs[i]
	chain, err := d.prompt.chain(ns)
	if err != nil {
		return 0
	}
	return d.workers[i].spec.matched(chain, time.Now())
}

// peerSpeculativeBlocks returns the other routers' speculative blocks of
// candidate i in its block size d.bs[i], counting them when
// matchCandidateIn did not.
func (s *Server) peerSpeculativeBlocks(d *decision, i int) int {
	if d.peerSpec == nil {
		return 0
	}
	if d.peerSpec[i] >= 0 || d.prompt == nil {
		return max(d.peerSpec[i], 0)
	}
	ns := d.ns.at(i)
	ns.BlockSize = d.bs[i]
	chain, err := d.prompt.chain(ns)
	if err != nil {
		return 0
	}
	return d.group.share.matched(d.workers[i].id, chain)
}

// engineBlockSize is the block size w's engine uses, for the
// misconfiguration check: the first learned from its events, else the one
// its agent registered (0 when neither is known).
func engineBlockSize(w *kvdirv1.Worker) int {
	if l := learnedSizes(w); len(l) > 0 {
		return l[0]
	}
	return int(w.GetSpec().GetBlockSize())
}
