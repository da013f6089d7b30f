package node

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// intentSweep is how often expired intents are forgotten.
const intentSweep = 250 * time.Millisecond

// Relays to the other nodes: how often the set of members is checked, and
// the pauses between attempts to reach one.
const (
	relayCheck    = time.Second
	relayRetryMin = 50 * time.Millisecond
	relayRetryMax = 2 * time.Second
)

// shareState is a node's part in sharing placement intents: the intent
// table, the routers connected to its Share streams, and its relays to
// the other nodes.
type shareState struct {
	n       *Node
	intents *intentTable
	digests digestCache

	mu      sync.Mutex
	routers map[string]*routerEntry
}

// routerEntry is a router connected to this node's Share stream.
type routerEntry struct {
	id      string
	streams int // open streams with this id (a reconnection may overlap the old one)
	view    *kvdirv1.RouterView
	heard   time.Time
	// The latest digest comparison (see RouterStatus).
	checked               bool
	checkedIndex          uint64
	checkedRouter, chNode uint64
}

func newShareState(n *Node) *shareState {
	return &shareState{n: n, routers: map[string]*routerEntry{},
		intents: newIntentTable(n.cfg.IntentMaxCount, n.cfg.IntentMaxBytes, n.metrics)}
}

// run forgets expired intents and keeps a relay running to every other
// member until the node stops.
func (s *shareState) run() {
	n := s.n
	defer n.wg.Done()
	sweep := time.NewTicker(intentSweep)
	defer sweep.Stop()
	check := time.NewTicker(relayCheck)
	defer check.Stop()
	relays := map[string]*relay{} // by member id
	defer func() {
		for _, r := range relays {
			r.stop()
		}
	}()
	s.reconcileRelays(relays)
	for {
		select {
		case <-n.stop:
			return
		case now := <-sweep.C:
			s.intents.expire(now)
		case <-check.C:
			s.reconcileRelays(relays)
		}
	}
}

// reconcileRelays starts a relay to each member with a known API address
// and stops those to members that left or moved.
func (s *shareState) reconcileRelays(relays map[string]*relay) {
	n := s.n
	want := map[string]string{}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		apis := n.fsm.Members()
		for _, srv := range f.Configuration().Servers {
			if id := string(srv.ID); id != n.cfg.ID && apis[id] != "" {
				want[id] = apis[id]
			}
		}
	}
	for id, r := range relays {
		if want[id] != r.addr {
			r.stop()
			delete(relays, id)
		}
	}
	for id, addr := range want {
		if relays[id] == nil {
			relays[id] = s.startRelay(id, addr)
		}
	}
}

// relay streams the intents this node's own routers send to one other
// node, reconnecting while the node runs.
type relay struct {
	to, addr string
	cancel   context.CancelFunc
	done     chan struct{}
}

func (r *relay) stop() {
	r.cancel()
	<-r.done
}

func (s *shareState) startRelay(id, addr string) *relay {
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{to: id, addr: addr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		s.runRelay(ctx, r)
	}()
	return r
}

func (s *shareState) runRelay(ctx context.Context, r *relay) {
	n := s.n
	creds := insecure.NewCredentials()
	if n.cfg.ClientTLS != nil {
		creds = credentials.NewTLS(n.cfg.ClientTLS)
	}
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(maxMessage)))
	if err != nil {
		n.log.Warn("share: cannot relay intents to a member", "member", r.to, "addr", r.addr, "err", err)
		return
	}
	defer conn.Close()
	pause := relayRetryMin
	for {
		sent, err := s.relayOnce(ctx, conn, r)
		if ctx.Err() != nil {
			return
		}
		if sent {
			pause = relayRetryMin
		}
		n.log.Debug("share: relay stream ended; retrying", "member", r.to, "err", err, "pause", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !sent {
			pause = min(2*pause, relayRetryMax)
		}
	}
}

// relayOnce runs one relay stream: every intent this node's routers sent
// that the table holds, then each new one, until the stream breaks. It
// reports whether it sent anything.
func (s *shareState) relayOnce(ctx context.Context, conn *grpc.ClientConn, r *relay) (sent bool, err error) {
	n := s.n
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Authenticated as the node's forwarded writes are (its own router
	// token stands for the routers whose intents it relays), and marked
	// so that the other node does not relay them again.
	md := metadata.Pairs(kvdirv1.MetadataRelay, n.cfg.ID)
	if tok := n.cfg.Tokens.Router; tok != "" {
		md.Set("authorization", "Bearer "+tok)
	}
	stream, err := kvdirv1.NewDirectoryServiceClient(conn).Share(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		return false, err
	}
	broken := make(chan error, 1)
	go func() {
		_, err := stream.Recv() // the other node sends nothing; this ends with the stream
		broken <- err
		cancel()
	}()
	sub := s.intents.subscribe(func(h *heldIntent) bool { return !h.relayed })
	defer s.intents.unsubscribe(sub)
	for {
		select {
		case <-ctx.Done():
			select {
			case err := <-broken:
				return sent, err
			default:
				return sent, ctx.Err()
			}
		case <-sub.wake:
		}
		for more := true; more; {
			var out []*kvdirv1.PlacementIntent
			out, _, more = s.intents.read(sub, time.Now())
			if len(out) == 0 {
				continue
			}
			if err := stream.Send(&kvdirv1.ShareRequest{Intents: out}); err != nil {
				return sent, err
			}
			sent = true
			n.metrics.intentsSent.WithLabelValues("node").Add(float64(len(out)))
		}
	}
}

// isPeer reports whether id is another server in the Raft configuration
// (which every node knows from its start, unlike the replicated member
// table, which a peer's first relay can beat).
func (n *Node) isPeer(id string) bool {
	if id == n.cfg.ID || n.raft == nil {
		return false
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == id {
			return true
		}
	}
	return false
}

// Share is a router's stream of placement intents (or another node's
// relay of its routers' intents, marked with MetadataRelay).
func (d *directoryService) Share(stream kvdirv1.DirectoryService_ShareServer) error {
	s := d.n.share
	if md, ok := metadata.FromIncomingContext(stream.Context()); ok {
		if from := md.Get(kvdirv1.MetadataRelay); len(from) > 0 {
			return s.serveRelay(stream, from[0])
		}
	}
	return s.serveRouter(stream)
}

// recvLoop receives on stream until it ends, passing each message to
// handle; it returns nil at the stream's clean end.
func recvLoop(stream kvdirv1.DirectoryService_ShareServer, handle func(*kvdirv1.ShareRequest) error) error {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := handle(msg); err != nil {
			return err
		}
	}
}

// serveRelay takes the intents another node relays from its routers.
func (s *shareState) serveRelay(stream kvdirv1.DirectoryService_ShareServer, from string) error {
	n := s.n
	done := make(chan error, 1)
	go func() {
		done <- recvLoop(stream, func(msg *kvdirv1.ShareRequest) error {
			return s.take(msg.Intents, "", true)
		})
	}()
	select {
	case err := <-done:
		if err != nil && status.Code(err) != codes.InvalidArgument {
			n.log.Debug("share: relay from a member ended", "member", from, "err", err)
		}
		return err
	case <-n.stop:
		return status.Error(codes.Unavailable, "node is shutting down")
	}
}

// take validates and stores intents; router, if set, is the router whose
// stream they came on (each must carry it).
func (s *shareState) take(intents []*kvdirv1.PlacementIntent, router string, relayed bool) error {
	now := time.Now()
	source := "router"
	if relayed {
		source = "relay"
	}
	for _, p := range intents {
		if p != nil && router != "" && p.RouterId == "" {
			p.RouterId = router
		}
		if err := validIntent(p); err != nil {
			return status.Errorf(codes.InvalidArgument, "share: %v", err)
		}
		if router != "" && p.RouterId != router {
			return status.Errorf(codes.InvalidArgument, "share: intent %d names router %q on the stream of router %q", p.IntentId, p.RouterId, router)
		}
		s.intents.put(p, relayed, now)
	}
	s.n.metrics.intentsReceived.WithLabelValues(source).Add(float64(len(intents)))
	return nil
}

// serveRouter runs one router's stream: it stores the router's intents
// and reports, and sends it the other routers' intents.
func (s *shareState) serveRouter(stream kvdirv1.DirectoryService_ShareServer) error {
	n := s.n
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	id := first.RouterId
	if id == "" || len(id) > maxIntentID {
		return status.Errorf(codes.InvalidArgument, "share: the first message must name the router (router_id, 1 to %d bytes)", maxIntentID)
	}
	e := s.connect(id)
	defer s.disconnect(e)
	handle := func(msg *kvdirv1.ShareRequest) error {
		if msg.RouterId != "" && msg.RouterId != id {
			return status.Errorf(codes.InvalidArgument, "share: router %q sent a message as %q on its stream", id, msg.RouterId)
		}
		if err := s.take(msg.Intents, id, false); err != nil {
			return err
		}
		s.report(e, msg.View)
		return nil
	}
	if err := handle(first); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- recvLoop(stream, handle) }()
	var wake <-chan struct{} // nil: the router wants no intents
	var sub *intentSub
	if !first.NoIntents {
		sub = s.intents.subscribe(func(h *heldIntent) bool { return h.p.RouterId != id })
		defer s.intents.unsubscribe(sub)
		wake = sub.wake
	}
	for {
		select {
		case err := <-done:
			return err
		case <-n.stop:
			return status.Error(codes.Unavailable, "node is shutting down; share with another node")
		case <-wake:
		}
		for more := true; more; {
			out, reset, m := s.intents.read(sub, time.Now())
			more = m
			if len(out) == 0 && !reset {
				continue
			}
			if err := stream.Send(&kvdirv1.ShareResponse{Replace: reset, Intents: out, NodeId: n.cfg.ID}); err != nil {
				return err
			}
			n.metrics.intentsSent.WithLabelValues("router").Add(float64(len(out)))
		}
	}
}

func (s *shareState) connect(id string) *routerEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.routers[id]
	if e == nil {
		e = &routerEntry{id: id}
		s.routers[id] = e
	}
	e.streams++
	e.heard = time.Now()
	return e
}

func (s *shareState) disconnect(e *routerEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.streams--; e.streams == 0 {
		delete(s.routers, e.id)
	}
}

// report records a router's message, and its view when it sent one,
// comparing the view's digest with this node's at the same index when it
// can.
func (s *shareState) report(e *routerEntry, v *kvdirv1.RouterView) {
	var nodeDigest uint64
	var compared bool
	if v.GetFollows() && v.GetSynced() {
		nodeDigest, compared = s.digests.at(s.n, v.AppliedIndex)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e.heard = time.Now()
	if v == nil {
		return
	}
	e.view = v
	if compared {
		e.checked, e.checkedIndex, e.checkedRouter, e.chNode = true, v.AppliedIndex, v.Digest, nodeDigest
	}
}

// statuses returns the routers connected to this node, by id.
func (s *shareState) statuses() []*kvdirv1.RouterStatus {
	_, byRouter := s.intents.stats()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*kvdirv1.RouterStatus, 0, len(s.routers))
	for _, e := range s.routers {
		rs := &kvdirv1.RouterStatus{RouterId: e.id, NodeId: s.n.cfg.ID, View: e.view,
			ReportAge: durationpb.New(now.Sub(e.heard)), Intents: uint64(byRouter[e.id])}
		if e.checked {
			rs.DigestChecked, rs.CheckedIndex, rs.CheckedRouterDigest, rs.CheckedNodeDigest = true, e.checkedIndex, e.checkedRouter, e.chNode
		}
		out = append(out, rs)
	}
	slices.SortFunc(out, func(a, b *kvdirv1.RouterStatus) int { return strings.Compare(a.RouterId, b.RouterId) })
	return out
}

// routerCount returns the number of routers connected.
func (s *shareState) routerCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.routers)
}

// digestCache remembers this node's state digest at the last few applied
// indexes it was asked about, so that routers reporting the same index
// cost one digest.
type digestCache struct {
	mu   sync.Mutex
	ring [64]struct{ index, digest uint64 }
	next int
}

// at returns this node's state digest at applied index idx, if the node
// is at idx now or was when a report last asked.
func (c *digestCache) at(n *Node, idx uint64) (uint64, bool) {
	if idx == 0 {
		return 0, false
	}
	c.mu.Lock()
	for _, e := range c.ring {
		if e.index == idx {
			c.mu.Unlock()
			return e.digest, true
		}
	}
	c.mu.Unlock()
	if n.fsm.AppliedIndex() != idx {
		return 0, false // not there: spare the digest
	}
	d, _, applied := n.fsm.Digests()
	if applied != idx {
		return 0, false
	}
	c.mu.Lock()
	c.ring[c.next] = struct{ index, digest uint64 }{idx, d}
	c.next = (c.next + 1) % len(c.ring)
	c.mu.Unlock()
	return d, true
}
