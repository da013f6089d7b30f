package k8s

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// directoryClientVars are the variables that list directory API addresses
// (one group's members).
var directoryClientVars = []string{"KVDIR_AGENT_DIRECTORY", "KVDIR_ROUTER_DIRECTORY", "KVDIR_CTL_DIRECTORY"}

// GroupFlag is the router's and kvdirctl's repeatable flag naming one
// directory group and its members: --directory-group NAME=HOST:PORT,...
const GroupFlag = "directory-group"

// DirectoryGroup is one directory StatefulSet: a Raft group, its members'
// API addresses (pod.headless-service:port, in pod order) and the models it
// serves (KVDIR_DIRECTORY_MODELS; empty: every model).
type DirectoryGroup struct {
	Obj     Object
	Members []string
	Models  []string
}

// serves reports whether the group takes agents of model among groups: it
// lists the model, or lists none and no other group lists it.
func (g DirectoryGroup) serves(model string, groups []DirectoryGroup) bool {
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

// DirectoryGroups returns the directory StatefulSets of objs as groups, in
// the order of objs.
func DirectoryGroups(objs []Object) []DirectoryGroup {
	var out []DirectoryGroup
	for _, o := range objs {
		s, ok := o.Obj.(*appsv1.StatefulSet)
		if !ok || directoryContainer(s) == nil {
			continue
		}
		c := directoryContainer(s)
		port := containerPort(c, "api")
		replicas := int32(1)
		if s.Spec.Replicas != nil {
			replicas = *s.Spec.Replicas
		}
		g := DirectoryGroup{Obj: o}
		for i := range replicas {
			g.Members = append(g.Members, fmt.Sprintf("%s-%d.%s:%d", s.Name, i, s.Spec.ServiceName, port))
		}
		if m, _ := env(c, "KVDIR_DIRECTORY_MODELS"); m != "" {
			for _, x := range strings.Split(m, ",") {
				if x = strings.TrimSpace(x); x != "" {
					g.Models = append(g.Models, x)
				}
			}
		}
		out = append(out, g)
	}
	return out
}

// flagValues returns every value of the repeatable flag --name, given as
// "--name=v" or "--name v".
func flagValues(args []string, name string) []string {
	var out []string
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			out = append(out, v)
		} else if a == "--"+name && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	return out
}

// groupArgs returns a container's --directory-group values.
func groupArgs(c *corev1.Container) []string {
	return flagValues(append(slices.Clone(c.Command), c.Args...), GroupFlag)
}

// checkDirectoryGroups checks the directory groups and their clients: no
// model is listed by two groups and at most one group lists none; every
// address list (KVDIR_*_DIRECTORY, each --directory-group) names exactly
// the members of one group, by headless-Service DNS name and API port; an
// agent's group serves the agent's model; a router or kvdirctl given
// --directory-group names every group once, and one given a single list
// (with several groups) is reported, since it would reach one group only.
func checkDirectoryGroups(objs []Object, ws []workload) []error {
	var errs []error
	groups := DirectoryGroups(objs)
	owner := map[string]int{} // member address -> group index
	var all []string
	byModel := map[string]string{}
	catchAll := ""
	for i, g := range groups {
		for _, m := range g.Members {
			owner[m] = i
			all = append(all, m)
		}
		for _, m := range g.Models {
			if o, ok := byModel[m]; ok {
				errs = append(errs, fmt.Errorf("%s: model %s is also served by %s: a model's blocks live in one group", g.Obj, m, o))
			}
			byModel[m] = g.Obj.Name
		}
		if len(g.Models) == 0 {
			if catchAll != "" {
				errs = append(errs, fmt.Errorf("%s: serves every model, as %s does: give one of them KVDIR_DIRECTORY_MODELS", g.Obj, catchAll))
			}
			catchAll = g.Obj.Name
		}
	}
	// resolve returns the group a list names, or -1 with the reasons.
	resolve := func(list string) (int, []string) {
		got := strings.Split(list, ",")
		gi := -1
		var why []string
		for _, a := range got {
			i, ok := owner[a]
			switch {
			case !ok:
				why = append(why, fmt.Sprintf("lists %q, which is not a directory member's headless address (members: %s)", a, strings.Join(all, ",")))
			case gi >= 0 && i != gi:
				why = append(why, fmt.Sprintf("mixes members of %s and %s", groups[gi].Obj.Name, groups[i].Obj.Name))
			case gi < 0:
				gi = i
			}
		}
		if gi < 0 {
			return -1, why
		}
		for _, m := range groups[gi].Members {
			if !slices.Contains(got, m) {
				why = append(why, fmt.Sprintf("leaves out member %s", m))
			}
		}
		return gi, why
	}
	for _, w := range ws {
		for _, c := range containers(&w.template.Spec) {
			bad := func(format string, args ...any) {
				errs = append(errs, fmt.Errorf("%s: container %s: %s", w.obj, c.Name, fmt.Sprintf(format, args...)))
			}
			flags := groupArgs(c)
			for _, v := range directoryClientVars {
				list, ok := env(c, v)
				if !ok {
					continue
				}
				if len(groups) == 0 {
					bad("sets %s but no directory StatefulSet exists", v)
					continue
				}
				gi, why := resolve(list)
				for _, y := range why {
					bad("%s %s", v, y)
				}
				if gi < 0 {
					continue
				}
				if v == "KVDIR_AGENT_DIRECTORY" {
					if model, _ := env(c, "KVDIR_AGENT_MODEL"); !groups[gi].serves(model, groups) {
						bad("KVDIR_AGENT_DIRECTORY names %s, which does not serve the agent's model %q (its models: %v)", groups[gi].Obj.Name, model, groups[gi].Models)
					}
					continue
				}
				if len(flags) > 0 {
					bad("sets both %s and --%s: give one group's list or every group's flags", v, GroupFlag)
				} else if len(groups) > 1 {
					bad("%s names %s only, of %d directory groups: give --%s NAME=MEMBERS for each", v, groups[gi].Obj.Name, len(groups), GroupFlag)
				}
			}
			if len(flags) == 0 {
				continue
			}
			if len(groups) == 0 {
				bad("--%s given but no directory StatefulSet exists", GroupFlag)
				continue
			}
			named := map[int]string{}
			names := map[string]bool{}
			for _, f := range flags {
				name, list, ok := strings.Cut(f, "=")
				if !ok || name == "" || list == "" {
					bad("--%s %q is not NAME=HOST:PORT[,HOST:PORT...]", GroupFlag, f)
					continue
				}
				if names[name] {
					bad("--%s names group %s twice", GroupFlag, name)
				}
				names[name] = true
				gi, why := resolve(list)
				for _, y := range why {
					bad("--%s %s %s", GroupFlag, name, y)
				}
				if gi < 0 {
					continue
				}
				if prev, ok := named[gi]; ok {
					bad("--%s %s and %s both name %s", GroupFlag, prev, name, groups[gi].Obj.Name)
				}
				named[gi] = name
			}
			for i, g := range groups {
				if _, ok := named[i]; !ok {
					bad("no --%s names directory group %s", GroupFlag, g.Obj.Name)
				}
			}
		}
	}
	return errs
}
