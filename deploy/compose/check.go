package compose

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Config is the part of docker-compose config's output the checks read.
type Config struct {
	Services map[string]Service `json:"services"`
}

// Service is one compose service, as docker-compose config prints it.
type Service struct {
	Image         string                `json:"image"`
	ContainerName string                `json:"container_name"`
	Environment   map[string]any        `json:"environment"`
	Command       []string              `json:"command"`
	DependsOn     map[string]Dependency `json:"depends_on"`
	Volumes       []string              `json:"volumes"`
}

// Dependency is a depends_on entry (file format 2.4: a condition).
type Dependency struct {
	Condition string `json:"condition"`
}

// Env returns the service's variable name ("" and false if unset).
func (s Service) Env(name string) (string, bool) {
	v, ok := s.Environment[name]
	if !ok || v == nil {
		return "", ok
	}
	return fmt.Sprint(v), true
}

// Group is one directory group of a compose configuration: the services
// sharing a Raft membership, their API addresses and the models they serve.
type Group struct {
	Nodes   []string // service names, sorted
	Members []string // API addresses (KVDIR_DIRECTORY_API_ADVERTISE), in Nodes' order
	Models  []string // KVDIR_DIRECTORY_MODELS; empty: every model
}

// Name names the group in messages: its nodes.
func (g Group) Name() string { return strings.Join(g.Nodes, ",") }

func splitList(s string) []string {
	var out []string
	for x := range strings.SplitSeq(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

// GroupFlag is the router's and kvdirctl's repeatable flag naming one
// directory group: --directory-group NAME=HOST:PORT[,HOST:PORT...].
const GroupFlag = "--directory-group"

// Groups returns the directory groups of c (the services with
// KVDIR_DIRECTORY_INITIAL_CLUSTER, grouped by it) and every problem with
// them: a node whose Raft membership does not name itself, a member that is
// not a node of the same membership, a node whose Raft address is not its
// own name, a certificate mounted for another name, a model served by two
// groups, or two groups serving every model.
func Groups(c Config) ([]Group, []error) {
	var errs []error
	bad := func(svc, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", svc, fmt.Sprintf(format, args...)))
	}
	byCluster := map[string]*Group{}
	raftOf := map[string]string{} // raft address -> service
	var names []string
	for name := range c.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := c.Services[name]
		cluster, ok := s.Env("KVDIR_DIRECTORY_INITIAL_CLUSTER")
		if !ok {
			continue
		}
		id, _ := s.Env("KVDIR_DIRECTORY_NODE_ID")
		raft, _ := s.Env("KVDIR_DIRECTORY_RAFT_ADVERTISE")
		api, _ := s.Env("KVDIR_DIRECTORY_API_ADVERTISE")
		if host, _, _ := strings.Cut(raft, ":"); host != s.ContainerName || host != name {
			bad(name, "KVDIR_DIRECTORY_RAFT_ADVERTISE %q is not on its own name %s (members tell each other apart by it)", raft, name)
		}
		if host, _, _ := strings.Cut(api, ":"); host != name {
			bad(name, "KVDIR_DIRECTORY_API_ADVERTISE %q is not on its own name %s", api, name)
		}
		if !slices.Contains(splitList(cluster), id+"="+raft) {
			bad(name, "KVDIR_DIRECTORY_INITIAL_CLUSTER %q does not list the node itself, %s=%s", cluster, id, raft)
		}
		want := "/" + name + ".crt:/etc/kvdir/tls/node.crt:ro"
		if !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasSuffix(v, want) }) {
			bad(name, "mounts no %s.crt as its certificate (it is valid for that name only)", name)
		}
		raftOf[raft] = name
		g := byCluster[cluster]
		if g == nil {
			g = &Group{}
			byCluster[cluster] = g
			if m, _ := s.Env("KVDIR_DIRECTORY_MODELS"); m != "" {
				g.Models = splitList(m)
			}
		} else if m, _ := s.Env("KVDIR_DIRECTORY_MODELS"); !sameSet(splitList(m), g.Models) {
			bad(name, "KVDIR_DIRECTORY_MODELS %q differs from its group's %v", m, g.Models)
		}
		g.Nodes = append(g.Nodes, name)
		g.Members = append(g.Members, api)
	}
	var clusters []string
	for cl := range byCluster {
		clusters = append(clusters, cl)
	}
	sort.Strings(clusters)
	var groups []Group
	owner := map[string]string{}
	catchAll := ""
	for _, cl := range clusters {
		g := byCluster[cl]
		for _, m := range splitList(cl) {
			_, raft, _ := strings.Cut(m, "=")
			svc, ok := raftOf[raft]
			switch {
			case !ok:
				bad(g.Name(), "initial cluster member %s is no directory node", m)
			case !slices.Contains(g.Nodes, svc):
				bad(g.Name(), "initial cluster member %s is %s, a node of another group", m, svc)
			}
		}
		if n := len(splitList(cl)); n != len(g.Nodes) {
			bad(g.Name(), "initial cluster %q has %d members, the group %d nodes", cl, n, len(g.Nodes))
		}
		for _, m := range g.Models {
			if o, ok := owner[m]; ok {
				bad(g.Name(), "model %s is also served by group %s: a model's blocks live in one group", m, o)
			}
			owner[m] = g.Name()
		}
		if len(g.Models) == 0 {
			if catchAll != "" {
				bad(g.Name(), "serves every model, as group %s does", catchAll)
			}
			catchAll = g.Name()
		}
		groups = append(groups, *g)
	}
	return groups, errs
}

// serves reports whether g takes agents of model: it lists it, or lists no
// model and no other group lists it.
func serves(g Group, model string, groups []Group) bool {
	if len(g.Models) > 0 {
		return slices.Contains(g.Models, model)
	}
	for _, o := range groups {
		if slices.Contains(o.Models, model) {
			return false
		}
	}
	return true
}

// groupOf returns the index of the group whose members list names exactly,
// or -1 with the reason.
func groupOf(groups []Group, list string) (int, string) {
	got := splitList(list)
	for i, g := range groups {
		if sameSet(got, g.Members) {
			return i, ""
		}
	}
	var all []string
	for _, g := range groups {
		all = append(all, strings.Join(g.Members, ","))
	}
	return -1, fmt.Sprintf("%q is not the members of one directory group (groups: %s)", list, strings.Join(all, " | "))
}

// Check checks a compose configuration: its directory groups (Groups);
// every agent's KVDIR_AGENT_DIRECTORY names one group's members, a group
// serving the agent's model, which is its engine's model, and the agent
// waits for that group's nodes; every router either names the only group
// with KVDIR_ROUTER_DIRECTORY or gives a --directory-group for every group
// (and then no KVDIR_ROUTER_DIRECTORY).
func Check(c Config) error {
	groups, errs := Groups(c)
	if len(groups) == 0 {
		return errors.New("no directory nodes (no service sets KVDIR_DIRECTORY_INITIAL_CLUSTER)")
	}
	bad := func(svc, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", svc, fmt.Sprintf(format, args...)))
	}
	var names []string
	for name := range c.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := c.Services[name]
		if list, ok := s.Env("KVDIR_AGENT_DIRECTORY"); ok {
			gi, why := groupOf(groups, list)
			if gi < 0 {
				bad(name, "KVDIR_AGENT_DIRECTORY %s", why)
				continue
			}
			g := groups[gi]
			model, _ := s.Env("KVDIR_AGENT_MODEL")
			if !serves(g, model, groups) {
				bad(name, "KVDIR_AGENT_DIRECTORY names group %s, which does not serve the agent's model %q (its models: %v)", g.Name(), model, g.Models)
			}
			addr, _ := s.Env("KVDIR_AGENT_WORKER_ADDRESS")
			engine := strings.TrimPrefix(addr, "http://")
			engine, _, _ = strings.Cut(engine, ":")
			if e, ok := c.Services[engine]; !ok {
				bad(name, "KVDIR_AGENT_WORKER_ADDRESS %q names no service", addr)
			} else if em, _ := e.Env("KVDIR_ENGINESIM_MODEL"); em != model {
				bad(name, "KVDIR_AGENT_MODEL %q, its engine %s serves %q", model, engine, em)
			}
			for _, n := range g.Nodes {
				if s.DependsOn[n].Condition != "service_healthy" {
					bad(name, "does not wait for its group's node %s to be healthy", n)
				}
			}
		}
		if !strings.Contains(s.Image, "router:") {
			continue
		}
		list, _ := s.Env("KVDIR_ROUTER_DIRECTORY")
		var flags []string
		for i, a := range s.Command {
			if v, ok := strings.CutPrefix(a, GroupFlag+"="); ok {
				flags = append(flags, v)
			} else if a == GroupFlag && i+1 < len(s.Command) {
				flags = append(flags, s.Command[i+1])
			}
		}
		switch {
		case list != "" && len(flags) > 0:
			bad(name, "sets both KVDIR_ROUTER_DIRECTORY and %s", GroupFlag)
		case list != "":
			gi, why := groupOf(groups, list)
			if gi < 0 {
				bad(name, "KVDIR_ROUTER_DIRECTORY %s", why)
			} else if len(groups) > 1 {
				bad(name, "KVDIR_ROUTER_DIRECTORY names group %s only, of %d groups: give %s NAME=MEMBERS for each", groups[gi].Name(), len(groups), GroupFlag)
			}
		case len(flags) == 0:
			bad(name, "names no directory group (neither KVDIR_ROUTER_DIRECTORY nor %s)", GroupFlag)
		default:
			named := map[int]string{}
			seen := map[string]bool{}
			for _, f := range flags {
				gname, members, ok := strings.Cut(f, "=")
				if !ok || gname == "" || members == "" {
					bad(name, "%s %q is not NAME=HOST:PORT[,HOST:PORT...]", GroupFlag, f)
					continue
				}
				if seen[gname] {
					bad(name, "%s names group %s twice", GroupFlag, gname)
				}
				seen[gname] = true
				gi, why := groupOf(groups, members)
				if gi < 0 {
					bad(name, "%s %s: %s", GroupFlag, gname, why)
					continue
				}
				if prev, ok := named[gi]; ok {
					bad(name, "%s %s and %s both name group %s", GroupFlag, prev, gname, groups[gi].Name())
				}
				named[gi] = gname
			}
			for i, g := range groups {
				if _, ok := named[i]; !ok {
					bad(name, "no %s names group %s", GroupFlag, g.Name())
				}
			}
		}
		for _, g := range groups {
			for _, n := range g.Nodes {
				if s.DependsOn[n].Condition != "service_healthy" {
					bad(name, "does not wait for directory node %s to be healthy", n)
				}
			}
		}
	}
	return errors.Join(errs...)
}
