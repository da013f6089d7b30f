package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/blockhash"
	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/follow"
	"github.com/kvdir/kvdir/internal/placement"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Fallback reasons, as the X-Kvdir-Fallback header and the fallbacks metric
// name them.
const (
	FallbackNoDirectory = "no-directory"      // the router runs without a directory
	FallbackTimeout     = "directory-timeout" // the match missed its deadline
	FallbackError       = "directory-error"   // the match failed (unreachable, no leader, stale, ...)
	FallbackDown        = "directory-down"    // recent look-ups failed; not asked for a moment
)

// Directory circuit breaker: after breakerFailures consecutive failed
// look-ups (errors such as refused connections or no leader; timeouts do not
// count, as a slow directory still answers most requests) the router stops
// asking for breakerPause, so that an outage costs requests nothing; then
// one request tries again. Look-ups are dirclient.FailFast calls, so with
// every node refusing connections each of the breakerFailures fails at once
// rather than at the match deadline.
const (
	breakerFailures = 3
	breakerPause    = time.Second
)

// chainPrefixBlocks is how many leading blocks key session-hash when a
// request has no session id.
const chainPrefixBlocks = 4

// Matcher is the directory look-up the router needs: *dirclient.Client
// asks a directory node, *follow.Follower answers from a local replica of
// the directory's state machine.
type Matcher interface {
	MatchChain(ctx context.Context, hashes []uint64, blockSize uint32, consistent bool) (*kvdirv1.MatchResponse, error)
}

// LocalReplica is a Matcher that answers from a local replica of the
// directory (internal/follow), and says whether it is in sync and how
// many log entries it is behind. Its MatchChain answers from memory: it
// is called without a deadline.
type LocalReplica interface {
	Matcher
	Synced() bool
	Lag() uint64
	// Staleness is how long ago a directory node was last heard from.
	Staleness() time.Duration
	// View reports the replica's position and digests (GET /v1/kvdir/view).
	View() follow.View
}

// Match sources, the source label of kvdir_router_matches_total.
const (
	MatchLocal      = "local"       // the local replica, heard from within Config.LocalStaleAfter
	MatchLocalStale = "local-stale" // the local replica, older than that but within Config.LocalMaxStale
	MatchDirectory  = "directory"   // a directory node, over gRPC
)

// matcherFor returns what answers g's next match: its local replica
// while it is in sync and not older than LocalMaxStale (marked stale past
// LocalStaleAfter: a slightly old view beats hashing), else its directory.
func (s *Server) matcherFor(g *group) (Matcher, string) {
	if l := g.local; l != nil && l.Synced() {
		switch age := l.Staleness(); {
		case age <= s.cfg.LocalStaleAfter:
			return l, MatchLocal
		case age <= s.cfg.LocalMaxStale:
			return l, MatchLocalStale
		}
	}
	return g.matcher, MatchDirectory
}

// decision is the outcome of placing one request, with what explain and the
// metrics report.
type decision struct {
	group    *group // the directory group serving the request's model
	policy   string
	fallback string // why the directory was not used; "" if it was (or was not needed)
	// matchSource says what answered the directory look-up (Match*; ""
	// when there was none).
	matchSource string

	tokens    int      // prompt tokens
	blockSize int      // block size of chain
	chain     []uint64 // content-hash chain in the namespace of the candidates (the first's if they differ)
	prompt    *prompt  // the rendered prompt, with its chains by namespace

	workers []*worker                          // candidates, in candidate order
	ns      nsSet                              // hashing namespace per candidate: its model, the request's adapter there, its block size
	cands   []placement.Candidate              // placement's view of them
	dir     []int                              // blocks the directory reported per candidate, in its block size (-1: not asked)
	spec    []int                              // speculative blocks per candidate, in its block size (-1: not counted, at most dir)
	bs      []int                              // block size each candidate was matched in
	dirBy   map[blockhash.Namespace]*dirAnswer // the directory's match by namespace
	pick    placement.Decision

	// Other routers' shared intents per candidate (nil when not shared):
	// their speculative blocks (in the candidate's block size), queued
	// uncached tokens and requests in flight, included in cands' loads.
	peerSpec, peerQueued, peerInFlight []int
	// pickChain is the prompt's chain in the pick's namespace and block
	// size, which its intent carries.
	pickChain []uint64

	renderDur, hashDur, matchDur, scoreDur time.Duration

	// bufs holds the per-candidate slices above until the decision is
	// compacted or recycled; one keeps the pick's entries after.
	bufs *candBufs
	one  pickOnly
}

// candBufs are a decision's per-candidate slices, reused from one decision
// to the next (Server.candBufs): over a thousand candidates they are over
// 100 KB a decision, which, allocated anew, made the collector run often
// enough to show in the decisions' tail.
type candBufs struct {
	ws    []*worker
	of    []int32
	cands []placement.Candidate
	ints  []int
}

// pickOnly is a compacted decision's per-candidate entries: the pick's.
type pickOnly struct {
	w               [1]*worker
	of              [1]int32
	cand            [1]placement.Candidate
	dir, spec, bs   [1]int
	peerSpec, peerQ [1]int
	peerInF         [1]int
}

// candBufsFor returns buffers for n candidates.
func (s *Server) candBufsFor(n int) *candBufs {
	b, _ := s.candBufs.Get().(*candBufs)
	if b == nil {
		b = &candBufs{}
	}
	if cap(b.ws) < n {
		b.ws, b.of, b.cands, b.ints = make([]*worker, n), make([]int32, n), make([]placement.Candidate, n), make([]int, 3*n)
	}
	return b
}

// recycle returns d's per-candidate buffers for reuse; d's per-candidate
// slices must not be read after. The buffers keep no worker.
func (d *decision) recycle(s *Server) {
	b := d.bufs
	if b == nil {
		return
	}
	d.bufs = nil
	clear(b.ws[:cap(b.ws)])
	clear(b.cands[:cap(b.cands)])
	s.candBufs.Put(b)
}

// compact keeps, of d's per-candidate entries, only the pick's (then
// candidate 0), and recycles the buffers: what a placed request needs
// until it ends (its worker, namespace, match and load at placement).
func (d *decision) compact(s *Server) {
	if d.bufs == nil {
		return
	}
	i, o := d.pick.Index, &d.one
	o.w[0], o.of[0], o.cand[0] = d.workers[i], d.ns.of[i], d.cands[i]
	o.dir[0], o.spec[0], o.bs[0] = d.dir[i], d.spec[i], d.bs[i]
	d.workers, d.ns.of, d.cands = o.w[:], o.of[:], o.cand[:]
	d.dir, d.spec, d.bs = o.dir[:], o.spec[:], o.bs[:]
	if d.peerSpec != nil {
		o.peerSpec[0], o.peerQ[0], o.peerInF[0] = d.peerSpec[i], d.peerQueued[i], d.peerInFlight[i]
		d.peerSpec, d.peerQueued, d.peerInFlight = o.peerSpec[:], o.peerQ[:], o.peerInF[:]
	}
	d.pick.Index = 0
	d.recycle(s)
}

// needsDirectory reports whether a policy uses matched blocks.
func needsDirectory(policy string) bool {
	switch policy {
	case "round-robin", "random", "least-load", "session-hash":
		return false
	}
	return true
}

// candidate is a worker that serves a request's model, with the LoRA
// adapter the request names there ("" for the worker's base model).
type candidate struct {
	w    *worker
	lora string
}

// candidates returns the workers of g serving model (as their own model,
// or as a LoRA adapter their engine lists) and, with a subset, at one of
// its endpoints, the routable ones first selected;
// with none routable, every worker of the model (a down mark may be
// stale). g is the group serving model (groupFor; nil: none does). The
// candidates are appended to buf[:0] (nil: a new slice). An error is an
// apiError for the client.
func (s *Server) candidates(buf []candidate, g *group, model string, exclude []string, subset *endpointSubset, now time.Time) ([]candidate, *apiError) {
	if subset != nil && len(subset.list) == 0 {
		return nil, unavailable("no eligible endpoint: the data plane's subset hint (%s) lists no endpoint", subsetKey)
	}
	sorted := s.pool.sorted()
	// eligible says whether w serves model in g, is not excluded and is in
	// the subset; outside counts the workers of the model outside it.
	var outside int
	eligible := func(w *worker) (lora string, ok bool) {
		if g == nil || s.groupOf(w) != g {
			return "", false
		}
		lora, serves := w.servesModel(model)
		if !serves || slices.Contains(exclude, w.id) {
			return "", false
		}
		if subset != nil && !subset.has(w.endpoint) {
			outside++
			return "", false
		}
		return lora, true
	}
	ok := buf[:0]
	var all, draining int // eligible workers, and those of them draining
	for _, w := range sorted {
		lora, in := eligible(w)
		if !in {
			continue
		}
		all++
		if w.routable(now) {
			ok = append(ok, candidate{w, lora})
		} else if w.draining.Load() {
			draining++
		}
	}
	if all == 0 {
		if subset != nil && outside > 0 {
			return nil, unavailable("no eligible endpoint: none of the %d endpoints of the data plane's subset hint (%s) is a registered worker serving model %q (%d such workers are outside it)",
				len(subset.list), subset.String(), model, outside)
		}
		if len(exclude) > 0 {
			return nil, badGateway("every worker serving model %q failed before responding", model)
		}
		models := s.models()
		if len(models) == 0 || (g == nil && len(s.groups) > 1) {
			// Say whether the directory is down, not the agents: with
			// several groups, any group that may be the model's.
			for _, gr := range s.groups {
				if gr.dir == nil || (g != nil && gr != g) {
					continue
				}
				_, down := gr.dir.LastFailure()
				of := "the directory"
				if len(s.groups) > 1 {
					of = "directory group " + gr.name
				}
				switch synced := gr.synced.Load(); {
				case down && !synced:
					return nil, unavailable("directory unreachable: no worker is known, as the worker list has not been loaded from %s%s", of, s.directoryCause(gr))
				case down && len(models) == 0:
					return nil, unavailable("directory unreachable: no worker is known (the directory's last worker list had none for model %q or any other)%s", model, s.directoryCause(gr))
				case !synced:
					return nil, unavailable("no worker is known yet: the worker list has not been loaded from %s%s", of, s.directoryCause(gr))
				}
			}
		}
		if len(models) == 0 {
			return nil, unavailable("no worker is registered yet, for model %q or any other (are the agents running and registered?)", model)
		}
		if !slices.Contains(models, model) {
			return nil, notFound("The model `%s` does not exist. Served models and LoRA adapters: %s", model, strings.Join(models, ", "))
		}
		return nil, unavailable("no worker serving model %q is available", model)
	}
	if len(ok) == 0 && draining < all {
		// None routable: every one not draining (marked down), in order.
		for _, w := range sorted {
			if lora, in := eligible(w); in && !w.draining.Load() {
				ok = append(ok, candidate{w, lora})
			}
		}
	}
	if len(ok) == 0 {
		return nil, unavailable("every worker serving model %q is draining", model)
	}
	return ok, nil
}

// decideScratch is a decision's transient buffers, reused from one
// decision to the next (Server.scratch): the candidates before they are
// copied into the decision, and the policy's per-candidate breakdown when
// the decision does not keep it.
type decideScratch struct {
	cands  []candidate
	scores []placement.Score
}

// decide renders, hashes, matches and scores req over the workers serving
// its model, minus exclude. The decision has no per-candidate cost
// breakdown (d.pick.Scores is nil): only explain reads it
// (decideExplained).
func (s *Server) decide(ctx context.Context, req *request, exclude []string) (*decision, *apiError) {
	return s.decideWith(ctx, req, exclude, false)
}

// decideExplained is decide keeping the policy's per-candidate breakdown
// in d.pick.Scores, for explain.
func (s *Server) decideExplained(ctx context.Context, req *request) (*decision, *apiError) {
	return s.decideWith(ctx, req, nil, true)
}

// decideWith is decide; keepScores keeps d.pick.Scores.
func (s *Server) decideWith(ctx context.Context, req *request, exclude []string, keepScores bool) (*decision, *apiError) {
	now := time.Now()
	g := s.groupFor(req.model)
	sc, _ := s.scratch.Get().(*decideScratch)
	if sc == nil {
		sc = &decideScratch{}
	}
	defer s.scratch.Put(sc)
	cs, aerr := s.candidates(sc.cands, g, req.model, exclude, req.subset, now)
	if aerr != nil {
		return nil, aerr
	}
	sc.cands = cs[:0] // keep what it grew to
	n := len(cs)
	b := s.candBufsFor(n)
	ws := b.ws[:n]
	d := &decision{group: g, policy: s.policy.Name(), workers: ws, ns: nsSet{of: b.of[:n]}, bufs: b}
	for i, c := range cs {
		ws[i] = c.w
		// The agent indexes its engine's blocks under the model it
		// registered and the adapter the engine names in its events.
		d.ns.set(i, blockhash.Namespace{Model: c.w.model(), LoRA: c.lora, CacheSalt: req.cacheSalt, BlockSize: s.blockSizeOf(c.w)})
	}
	clear(cs) // the buffer holds no worker past this decision

	if aerr := s.checkPromptSize(req); aerr != nil {
		return nil, aerr
	}
	t0 := time.Now()
	p, err := s.render(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, badRequest("request cancelled while rendering the prompt")
		}
		return nil, badRequest("cannot render the prompt: %v", err)
	}
	if p.len() == 0 {
		return nil, badRequest("the prompt is empty")
	}
	if p.len() > s.cfg.MaxPromptTokens {
		return nil, badRequest("the prompt renders to %d tokens, more than the router's limit of %d (--max-prompt-tokens)", p.len(), s.cfg.MaxPromptTokens)
	}
	d.tokens, d.prompt = p.len(), p
	t1 := time.Now()
	d.renderDur = t1.Sub(t0)

	d.blockSize = d.ns.at(0).BlockSize
	chainFor := p.chain
	if d.chain, err = chainFor(d.ns.at(0)); err != nil {
		return nil, badRequest("cannot hash the prompt: %v", err)
	}
	t2 := time.Now()
	d.hashDur = t2.Sub(t1)

	d.cands = b.cands[:n] // each is set below
	ints := b.ints[:3*n]
	clear(ints)
	d.dir, d.spec, d.bs = ints[:n:n], ints[n:2*n:2*n], ints[2*n:]
	match := needsDirectory(d.policy)
	if match {
		d.fallback = s.matchDirectory(ctx, d, chainFor)
	}
	// One pass over the candidates, each worker's state read once
	// (loads, then matched blocks).
	var cache nsCache
	for i, w := range ws {
		d.cands[i] = placement.Candidate{Worker: w.id, Load: w.loadAt(now)}
		d.dir[i] = -1
		d.bs[i] = d.ns.at(i).BlockSize
		g.share.addLoad(d, i)
		if match {
			s.matchCandidateIn(d, i, w, chainFor, now, &cache)
		}
	}
	t3 := time.Now()
	d.matchDur = t3.Sub(t2)

	preq := placement.Request{SessionKey: req.session, PromptTokens: d.tokens, BlockSize: d.blockSize,
		ChainPrefix: d.chain[:min(chainPrefixBlocks, len(d.chain))]}
	pol := s.policy
	if d.fallback != "" {
		pol = s.fallback
		d.policy = pol.Name()
	}
	if sp, ok := pol.(placement.ScorePicker); ok && !keepScores {
		d.pick, err = sp.PickInto(preq, d.cands, sc.scores)
		if cap(d.pick.Scores) > cap(sc.scores) {
			sc.scores = d.pick.Scores[:0]
		}
		d.pick.Scores = nil // sc.scores is the next decision's
	} else {
		d.pick, err = pol.Pick(preq, d.cands)
	}
	if err != nil {
		return nil, unavailable("placement failed: %v", err)
	}
	d.pickChain = g.share.chainOf(d, chainFor)
	d.scoreDur = time.Since(t3)
	return d, nil
}

// checkPromptSize refuses a request whose prompt text or token ids exceed
// the router's bounds, before any of it is tokenized.
func (s *Server) checkPromptSize(req *request) *apiError {
	if !req.chat && req.prompt.IsTokens {
		if n := len(req.prompt.Tokens); n > s.cfg.MaxPromptTokens {
			return badRequest("the prompt has %d token ids, more than the router's limit of %d (--max-prompt-tokens)", n, s.cfg.MaxPromptTokens)
		}
		return nil
	}
	n := len(req.prompt.Text)
	for _, m := range req.messages {
		n += len(m.Role) + len(m.Content.Text)
		for _, p := range m.Content.Parts {
			n += len(p.Text)
		}
	}
	if n > s.cfg.MaxPromptBytes {
		return badRequest("the prompt has %d bytes of text, more than the router's limit of %d (--max-prompt-bytes)", n, s.cfg.MaxPromptBytes)
	}
	return nil
}

// render renders req's prompt: a session's chat turn incrementally, as
// pieces shared with its previous turn, when the renderer can.
func (s *Server) render(ctx context.Context, req *request) (*prompt, error) {
	if !req.chat {
		ids, err := s.renderer.RenderCompletion(ctx, req.prompt)
		return newIDsPrompt(ids), err
	}
	if sr, ok := s.renderer.(sessionRenderer); ok && req.session != "" {
		r, base, shared, err := sr.RenderSession(ctx, req.session, req.messages, req.addGen)
		if err != nil {
			return nil, err
		}
		return newRenderedPrompt(r, base, shared), nil
	}
	ids, err := s.renderer.RenderChat(ctx, req.session, req.messages, req.addGen)
	return newIDsPrompt(ids), err
}

// matchDirectory fills d.dir from the directory of d's group and returns
// the fallback reason, or "" on success. Each group has its own breaker:
// one group's outage does not switch the others off.
func (s *Server) matchDirectory(ctx context.Context, d *decision, chainFor func(blockhash.Namespace) ([]uint64, error)) string {
	g := d.group
	if g.matcher == nil && g.local == nil {
		return FallbackNoDirectory
	}
	if len(d.chain) == 0 {
		return "" // shorter than a block: nothing to match anywhere
	}
	now := time.Now().UnixNano()
	if until := g.pausedUntil.Load(); until > now {
		return FallbackDown
	} else if until != 0 && !g.pausedUntil.CompareAndSwap(until, 0) {
		return FallbackDown // another request is the one trying again
	}
	reason, err := s.lookup(ctx, d, chainFor)
	switch {
	case reason == "":
		g.failures.Store(0)
	case reason == FallbackTimeout:
		// Slow, not down: a busy machine must not switch the directory off.
	case g.failures.Add(1) >= breakerFailures:
		g.failures.Store(0)
		g.pausedUntil.Store(time.Now().Add(s.breakerPause).UnixNano())
		if refused(err) {
			s.log.Warn("router: directory unreachable; placing by the fallback policy for a moment", "group", g.name, "reason", reason, "pause", s.breakerPause, "last_error", strings.TrimSpace(s.directoryCause(g)), "err", err)
		} else {
			s.log.Warn("router: directory look-ups failing; placing by the fallback policy for a moment", "group", g.name, "reason", reason, "pause", s.breakerPause, "err", err)
		}
	}
	return reason
}

// refused reports whether err is a look-up that no directory node took:
// every node tried refused the connection or answered Unavailable (down,
// no leader) rather than being slow: a FailFast look-up that gave up after
// one round, or one whose deadline passed while the nodes kept refusing.
func refused(err error) bool {
	var ue *dirclient.UnreachableError
	if !errors.As(err, &ue) || len(ue.Attempts) == 0 {
		return false
	}
	for _, e := range ue.Attempts {
		if status.Code(e) != codes.Unavailable {
			return false
		}
	}
	return true
}

// directoryCause says why g's directory has not answered, from its
// client's latest failed attempt ("" if none is known).
func (s *Server) directoryCause(g *group) string {
	if g.dir == nil {
		return ""
	}
	f, ok := g.dir.LastFailure()
	if !ok {
		return " (no node has answered yet)"
	}
	return fmt.Sprintf(" (last attempt, at %s %v ago: %v)", f.Addr, time.Since(f.At).Round(time.Millisecond), f.Err)
}

// lookup asks the directory for d's chain in every namespace (model, LoRA
// adapter, block size: each of a worker's learned sizes) of its workers and
// fills d.dirBy; it returns the fallback reason, or "", and the error.
func (s *Server) lookup(ctx context.Context, d *decision, chainFor func(blockhash.Namespace) ([]uint64, error)) (string, error) {
	// The distinct namespaces: the candidates' (d.ns), and those of a
	// worker's further learned block sizes.
	groups := d.ns.list
	var more *nsSet // groups and the further ones, once there are any
	for i, w := range d.workers {
		sizes := s.blockSizesOf(w)
		ns := d.ns.at(i)
		if len(sizes) == 1 && sizes[0] == ns.BlockSize {
			continue // the usual case: in d.ns.list already
		}
		if more == nil {
			more = &nsSet{list: slices.Clone(groups)}
		}
		for _, bs := range sizes {
			ns.BlockSize = bs
			more.index(ns)
		}
	}
	if more != nil {
		groups = more.list
	}
	// The local replica answers from memory and needs no deadline: arming
	// its timer would wake the runtime's timer thread, which on a busy
	// machine can take the decision's CPU for a scheduler slice.
	m, source := s.matcherFor(d.group)
	mctx := ctx
	if source == MatchDirectory {
		var cancel context.CancelFunc
		// Fail fast: with every node refusing, the look-up fails at once
		// (an error the breaker counts) instead of at the deadline.
		mctx, cancel = context.WithTimeout(dirclient.FailFast(ctx), s.cfg.MatchTimeout)
		defer cancel()
	}
	d.matchSource = source
	d.dirBy = make(map[blockhash.Namespace]*dirAnswer, len(groups))
	for _, ns := range groups {
		chain, err := chainFor(ns)
		if err != nil {
			return FallbackError, err
		}
		start := time.Now()
		resp, err := m.MatchChain(mctx, chain, uint32(ns.BlockSize), false)
		s.metrics.matches.WithLabelValues(d.group.name, source).Inc()
		s.metrics.dirLookup.WithLabelValues(d.group.name).Observe(time.Since(start).Seconds())
		if err != nil {
			if errors.Is(mctx.Err(), context.DeadlineExceeded) && !refused(err) {
				return FallbackTimeout, err
			}
			s.log.Debug("router: directory match failed", "err", err)
			return FallbackError, err
		}
		ans := &dirAnswer{}
		for _, m := range resp.GetMatches() {
			// A directory that predates gpu_or_cpu_blocks bounds it by the
			// longer of the GPU and CPU runs; one that reports no medium
			// at all is counted as GPU-held, as before media were reported.
			dm := dirMatch{blocks: int(m.GetBlocks()), gpu: int(m.GetGpuBlocks()),
				fast: int(max(m.GetGpuOrCpuBlocks(), m.GetGpuBlocks(), m.GetCpuBlocks()))}
			if m.GetGpuBlocks()|m.GetCpuBlocks()|m.GetDiskBlocks()|m.GetRemoteBlocks() == 0 {
				dm.gpu, dm.fast = dm.blocks, dm.blocks
			}
			ans.put(m.GetWorkerId(), dm)
		}
		d.dirBy[ns] = ans
	}
	return "", nil
}

// nsSet is a namespace per candidate of a decision. The candidates mostly
// share one or a few, so each is kept once (list) and a candidate's is an
// index into them (of): 4 bytes a candidate rather than a Namespace's 56,
// and the distinct ones known without a pass over the candidates.
type nsSet struct {
	list []blockhash.Namespace
	of   []int32
	// seen indexes list once it is longer than nsListMax.
	seen map[blockhash.Namespace]int32
}

// nsListMax is how many distinct namespaces an nsSet searches in its list
// before it also keeps them in a map.
const nsListMax = 8

// at returns candidate i's namespace.
func (n *nsSet) at(i int) blockhash.Namespace { return n.list[n.of[i]] }

// set makes ns candidate i's namespace.
func (n *nsSet) set(i int, ns blockhash.Namespace) { n.of[i] = n.index(ns) }

// index returns the index of ns in n.list, adding it if it is not there.
func (n *nsSet) index(ns blockhash.Namespace) int32 {
	if k := len(n.list) - 1; k >= 0 && n.list[k] == ns {
		return int32(k) // the previous candidate's
	}
	if n.seen != nil {
		if k, ok := n.seen[ns]; ok {
			return k
		}
	} else if k := slices.Index(n.list, ns); k >= 0 {
		return int32(k)
	} else if len(n.list) >= nsListMax {
		n.seen = make(map[blockhash.Namespace]int32, 2*nsListMax)
		for j, x := range n.list {
			n.seen[x] = int32(j)
		}
	}
	k := int32(len(n.list))
	n.list = append(n.list, ns)
	if n.seen != nil {
		n.seen[ns] = k
	}
	return k
}

// dirMatch is one worker's answer from the directory: its leading blocks on
// any medium, on the GPU, and on the GPU or in host memory.
type dirMatch struct{ blocks, gpu, fast int }

// dirAnswer is the directory's answer in one namespace by worker. The
// workers holding a prompt's blocks are usually a few of a decision's
// candidates, each of which looks itself up: a short list, searched
// without hashing the worker's id, then a map past dirListMax workers.
type dirAnswer struct {
	ids  []string
	ms   []dirMatch
	byID map[string]dirMatch // past dirListMax (ids and ms are then nil)
}

// dirListMax is how many workers a dirAnswer keeps in its list.
const dirListMax = 8

// put records worker id's match; a later one replaces an earlier one.
func (a *dirAnswer) put(id string, m dirMatch) {
	if a.byID != nil {
		a.byID[id] = m
		return
	}
	if i := slices.Index(a.ids, id); i >= 0 {
		a.ms[i] = m
		return
	}
	if len(a.ids) == dirListMax {
		a.byID = make(map[string]dirMatch, 2*dirListMax)
		for i, x := range a.ids {
			a.byID[x] = a.ms[i]
		}
		a.byID[id], a.ids, a.ms = m, nil, nil
		return
	}
	a.ids, a.ms = append(a.ids, id), append(a.ms, m)
}

// get returns worker id's match (zero when the directory reported none).
func (a *dirAnswer) get(id string) dirMatch {
	if a.byID != nil {
		return a.byID[id]
	}
	for i, x := range a.ids {
		if x == id {
			return a.ms[i]
		}
	}
	return dirMatch{}
}

// String summarises d for logs.
func (d *decision) String() string {
	return fmt.Sprintf("policy=%s worker=%s tokens=%d cached=%d fallback=%q", d.policy, d.pick.Worker, d.tokens, d.pick.PredictedCachedTokens, d.fallback)
}
