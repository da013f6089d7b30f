package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/dirclient"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// DefaultGroup names the directory group of Config.Directory (the
// router's --directory).
const DefaultGroup = "default"

// groupLoadWait is how long, with several groups, readiness waits for a
// group's first worker list: a group whose nodes are all down when the
// router starts must not keep the other groups' models out of service.
const groupLoadWait = 30 * time.Second

// DirectoryGroup is one directory group: a Raft cluster of directory
// nodes serving a set of models. A large fleet runs several side by side,
// each node started with the group's --models; the router keeps one
// directory client (and local replica) per group.
type DirectoryGroup struct {
	// Name names the group in logs, metrics (the group label) and status.
	Name string
	// Directory is the group's client (required).
	Directory *dirclient.Client
	// Local, when set, is the group's local replica (Config.Local).
	Local LocalReplica
}

// group is the router's state of one directory group: its client and
// local replica, its circuit breaker, its session recorder and intent
// sharer, and the models it serves. A request for a model is matched,
// recorded and shared in the model's group only, and a group's outage
// trips its own breaker: the other groups' requests do not notice.
type group struct {
	name    string
	dir     *dirclient.Client // nil for a router without a directory
	matcher Matcher           // dir (tests may stand another in); nil without a directory
	local   LocalReplica      // nil without a local replica
	rec     *recorder         // nil without a directory
	share   *sharer           // nil without a directory, or with neither intents nor a local replica

	synced atomic.Bool // its worker list has been loaded once
	// unloadedLogged: readiness stopped waiting for the worker list
	// (groupLoadWait) and said so.
	unloadedLogged atomic.Bool
	localReady     atomic.Bool  // the local replica was seen in sync, or readiness stopped waiting for it
	failures       atomic.Int32 // consecutive failed directory look-ups
	pausedUntil    atomic.Int64 // unix nanos: the directory is not asked until then

	// served is the group's --models as its nodes report them (nil: not
	// reported, or every model: the group's workers say which).
	served atomic.Pointer[[]string]
}

// newGroup returns the state of a group; dir and local may be nil.
func newGroup(name string, dir *dirclient.Client, local LocalReplica) *group {
	g := &group{name: name, dir: dir, local: local}
	if dir != nil {
		g.matcher = dir
	}
	return g
}

// servedModels returns the models the group's nodes say it serves (nil:
// they set none).
func (g *group) servedModels() []string {
	if p := g.served.Load(); p != nil {
		return *p
	}
	return nil
}

// setServed records the served models a node reported.
func (g *group) setServed(models []string) {
	if len(models) == 0 {
		g.served.Store(nil)
		return
	}
	m := slices.Clone(models)
	g.served.Store(&m)
}

// validateGroups checks the groups of a Config: names unique and given,
// each with a directory.
func validateGroups(gs []DirectoryGroup) error {
	seen := map[string]bool{}
	for _, g := range gs {
		if g.Name == "" {
			return errors.New("router: a directory group has no name")
		}
		if seen[g.Name] {
			return fmt.Errorf("router: directory group %q given twice", g.Name)
		}
		seen[g.Name] = true
		if g.Directory == nil {
			return fmt.Errorf("router: directory group %q has no directory client", g.Name)
		}
	}
	return nil
}

// groupOf returns the group w was discovered from (the first group for a
// static worker).
func (s *Server) groupOf(w *worker) *group {
	if w.group != nil {
		return w.group
	}
	return s.groups[0]
}

// claims reports whether g serves model: its nodes' served models list it,
// or, when they list none, one of its workers serves it (as its model or a
// LoRA adapter its engine lists).
func (s *Server) claims(g *group, model string, workers []*worker) bool {
	if served := g.servedModels(); served != nil {
		return slices.Contains(served, model)
	}
	for _, w := range workers {
		if s.groupOf(w) != g {
			continue
		}
		if _, ok := w.servesModel(model); ok {
			return true
		}
	}
	return false
}

// groupFor returns the group serving model: with one group, that group;
// else the first group, in flag order, that claims it (nil: none does). A
// model two groups claim is a misconfiguration: logged once, and routed
// with the first.
func (s *Server) groupFor(model string) *group {
	if len(s.groups) == 1 {
		return s.groups[0]
	}
	workers := s.pool.sorted()
	var first *group
	var names []string
	for _, g := range s.groups {
		if s.claims(g, model, workers) {
			if first == nil {
				first = g
			}
			names = append(names, g.name)
		}
	}
	if len(names) > 1 {
		if _, logged := s.conflictLogged.LoadOrStore(model, true); !logged {
			s.log.Error("router: a model is served by several directory groups; routing it with the first (give each group its own --models, and point each agent at its model's group)",
				"model", model, "groups", strings.Join(names, ", "), "using", first.name)
		}
	}
	return first
}

// modelConflicts returns the models several groups claim, each with those
// groups in flag order (nil with one group).
func (s *Server) modelConflicts() map[string][]string {
	if len(s.groups) < 2 {
		return nil
	}
	workers := s.pool.sorted()
	models := map[string]bool{}
	for _, g := range s.groups {
		for _, m := range g.servedModels() {
			models[m] = true
		}
	}
	for _, w := range workers {
		if m := w.model(); m != "" {
			models[m] = true
		}
		for _, a := range w.served.Load().adapterNames() {
			models[a] = true
		}
	}
	var out map[string][]string
	for m := range models {
		var names []string
		for _, g := range s.groups {
			if s.claims(g, m, workers) {
				names = append(names, g.name)
			}
		}
		if len(names) > 1 {
			if out == nil {
				out = map[string][]string{}
			}
			out[m] = names
		}
	}
	return out
}

// conflictNotes describes modelConflicts for readiness and status, one
// line a model, sorted ("" without conflicts).
func (s *Server) conflictNotes() []string {
	c := s.modelConflicts()
	var out []string
	for m, names := range c {
		out = append(out, fmt.Sprintf("model %q is served by directory groups %s: routing it with %s (misconfiguration: give each group its own --models)",
			m, strings.Join(names, ", "), names[0]))
	}
	sort.Strings(out)
	return out
}

// groupGetter is the misconfiguration check's directory: it asks the
// worker's own group.
type groupGetter struct{ s *Server }

func (g groupGetter) GetWorker(ctx context.Context, workerID string, topChains uint32) (*kvdirv1.GetWorkerResponse, error) {
	gr := g.s.groups[0]
	if w := g.s.pool.snapshot()[workerID]; w != nil {
		gr = g.s.groupOf(w)
	}
	if gr.dir == nil {
		return nil, errors.New("router: no directory")
	}
	return gr.dir.GetWorker(ctx, workerID, topChains)
}

// watchGroup keeps the pool's workers of g current from g's directory
// until ctx ends.
func (s *Server) watchGroup(ctx context.Context, g *group) error {
	return g.dir.WatchWorkers(ctx, "", func(resp *kvdirv1.WatchWorkersResponse) error {
		var specs []workerSpec
		var gone []string
		for _, w := range resp.GetWorkers() {
			st := w.GetState()
			// A worker outside the selector is gone to this router (one
			// that registered again with other labels leaves the pool).
			if st == kvdirv1.WorkerState_WORKER_STATE_EXPIRED || st == kvdirv1.WorkerState_WORKER_STATE_DEREGISTERED || !s.selected(w) {
				gone = append(gone, w.GetSpec().GetId())
				continue
			}
			specs = append(specs, specOf(w))
		}
		var errs []error
		if resp.GetSnapshot() {
			g.setServed(resp.GetServedModels())
			errs = s.pool.replaceGroup(g, specs)
			g.synced.Store(true)
		} else {
			errs = s.pool.applyGroup(g, specs, gone)
		}
		for _, e := range errs {
			s.log.Warn("router: ignoring worker", "group", g.name, "err", e)
		}
		return nil
	})
}

// runGroups watches every group's workers until ctx ends; it returns the
// first error a group's directory made final.
func (s *Server) runGroups(ctx context.Context) error {
	if len(s.groups) == 1 {
		return s.watchGroup(ctx, s.groups[0])
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(s.groups))
	var wg sync.WaitGroup
	for i, g := range s.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.watchGroup(ctx, g); err != nil && ctx.Err() == nil {
				errs[i] = fmt.Errorf("directory group %s: %w", g.name, err)
				cancel() // final (a refused token, say): the router stops, as with one group
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// groupCollector exports each group's local replica position and the
// models several groups claim, at scrape time.
type groupCollector struct {
	s                         *Server
	lag, staleness, conflicts *prometheus.Desc
}

func newGroupCollector(s *Server) *groupCollector {
	return &groupCollector{s: s,
		lag: prometheus.NewDesc("kvdir_router_view_lag_entries",
			"Log entries the router's local replica of the directory group is behind the last commit index a node reported.", []string{"group"}, nil),
		staleness: prometheus.NewDesc("kvdir_router_view_staleness_seconds",
			"Seconds since a current node of the directory group last sent the router's local replica anything (entries, a snapshot or a keepalive); very large before the first.", []string{"group"}, nil),
		conflicts: prometheus.NewDesc("kvdir_router_model_group_conflicts",
			"Models more than one directory group serves (a misconfiguration: each is routed with the first group given).", nil, nil)}
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.staleness
	ch <- c.conflicts
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.s.groups {
		if l := g.local; l != nil {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(l.Lag()), g.name)
			ch <- prometheus.MustNewConstMetric(c.staleness, prometheus.GaugeValue, l.Staleness().Seconds(), g.name)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.conflicts, prometheus.GaugeValue, float64(len(c.s.modelConflicts())))
}

// sharing reports whether any group shares intents or reports a view.
func (s *Server) sharing() bool {
	for _, g := range s.groups {
		if g.share != nil {
			return true
		}
	}
	return false
}
