package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/ctlview"
	"github.com/kvdir/kvdir/internal/dirclient"
)

// Several directory groups (--directory-group, as the router's): a fleet
// may run several Raft groups side by side, each serving some models.
// Commands that list things ask every group and add a GROUP column when
// there is more than one; a command on one worker finds the group that
// holds it; a model's command goes to the model's group; a command on the
// cluster itself (members, snapshot, leader) needs a single group.

// dirGroup is one directory group kvdirctl talks to.
type dirGroup struct {
	name   string
	addrs  []string
	client *dirclient.Client
}

// current is the current group's client once dialled (nil before, or
// with no group current).
func (a *app) current() *dirclient.Client {
	if a.cur < 0 || a.cur >= len(a.groups) {
		return nil
	}
	return a.groups[a.cur].client
}

// multiGroup reports whether more than one group was given.
func (a *app) multiGroup() bool { return len(a.groups) > 1 }

// useGroup makes group i the one a.dir() returns.
func (a *app) useGroup(i int) { a.cur = i }

// groupNames lists the groups' names, in order.
func (a *app) groupNames() string {
	names := make([]string, len(a.groups))
	for i, g := range a.groups {
		names[i] = g.name
	}
	return strings.Join(names, ", ")
}

// eachGroup calls fn with each group current, in order; a group that fails
// ends the walk with its error, naming it.
func (a *app) eachGroup(fn func(g *dirGroup) error) error {
	defer a.useGroup(-1)
	for i, g := range a.groups {
		a.useGroup(i)
		if err := fn(g); err != nil {
			if a.multiGroup() {
				return fmt.Errorf("directory group %s: %w", g.name, err)
			}
			return err
		}
	}
	return nil
}

// groupOfWorker makes the group that knows worker id current (with one
// group, that group, unasked).
func (a *app) groupOfWorker(ctx context.Context, id string) error {
	if !a.multiGroup() {
		a.useGroup(0)
		return nil
	}
	var errs []error
	for i, g := range a.groups {
		a.useGroup(i)
		c, err := a.dir()
		if err != nil {
			return err
		}
		if _, err := c.GetWorker(ctx, id, 0); err == nil {
			return nil
		} else if status.Code(err) != codes.NotFound {
			errs = append(errs, fmt.Errorf("directory group %s: %w", g.name, err))
		}
	}
	a.useGroup(-1)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return fmt.Errorf("worker %q is not known to any directory group (%s)", id, a.groupNames())
}

// groupOfModel makes the group serving model current: the first whose
// nodes list it in their --models, else the first with a worker of it.
func (a *app) groupOfModel(ctx context.Context, model string) error {
	if !a.multiGroup() {
		a.useGroup(0)
		return nil
	}
	for pass := range 2 {
		for i := range a.groups {
			a.useGroup(i)
			c, err := a.dir()
			if err != nil {
				return err
			}
			lw, err := c.ListWorkers(ctx, model, false)
			if err != nil {
				continue // another group may answer for it
			}
			if (pass == 0 && slices.Contains(lw.ServedModels, model)) || (pass == 1 && len(lw.ServedModels) == 0 && len(lw.Workers) > 0) {
				return nil
			}
		}
	}
	a.useGroup(-1)
	return fmt.Errorf("no directory group (%s) serves model %q", a.groupNames(), model)
}

// parseGroups checks --directory and --directory-group and sets a.groups.
func (a *app) parseGroups(addrs []string) error {
	a.groups = nil
	if len(a.groupFlags) == 0 {
		a.groups = []*dirGroup{{name: "default", addrs: addrs}}
		a.cur = 0
		return nil
	}
	if a.prog.Source("directory") != cli.FromDefault {
		return usageErrorf("give --directory (one directory group) or --directory-group (one or more, named), not both")
	}
	for _, g := range a.groupFlags {
		if err := checkAddrs("--directory-group "+g.Name, g.Items); err != nil {
			return err
		}
		a.groups = append(a.groups, &dirGroup{name: g.Name, addrs: g.Items})
	}
	a.cur = 0
	if a.multiGroup() {
		a.cur = -1
	}
	return nil
}

// checkAddrs checks a list of directory node addresses.
func checkAddrs(flag string, addrs []string) error {
	for _, d := range addrs {
		if strings.Contains(d, "://") {
			return usageErrorf("%s %q: give host:port, without a scheme (TLS is --tls)", flag, d)
		}
		if !strings.Contains(d, ":") {
			return usageErrorf("%s %q: missing port (the directory's gRPC port, 7001 by default)", flag, d)
		}
	}
	return nil
}

// groupStatus is one group's part of status with several groups.
type groupStatus struct {
	Group string `json:"group"`
	// ServedModels are the group's --models (empty: every model).
	ServedModels []string `json:"served_models,omitempty"`
	*ctlview.Status
}

// groupStatusList is status's document with several groups.
type groupStatusList struct {
	Groups []groupStatus `json:"groups"`
}

// groupsStatus is status over several groups: each group's, one after
// the other, each under a line naming it.
func (a *app) groupsStatus(ctx context.Context, out io.Writer) error {
	doc := groupStatusList{}
	err := a.eachGroup(func(g *dirGroup) error {
		st, err := a.clusterStatus(ctx)
		if err != nil {
			return err
		}
		a.cacheMismatches(ctx, st)
		gs := groupStatus{Group: g.name, Status: st}
		if c, err := a.dir(); err == nil {
			if s, err := c.Status(ctx); err == nil {
				gs.ServedModels = s.ServedModels
			}
		}
		doc.Groups = append(doc.Groups, gs)
		return nil
	})
	if err != nil {
		return err
	}
	return a.write(out, doc, func(out io.Writer) error {
		for i, g := range doc.Groups {
			if i > 0 {
				fmt.Fprintln(out)
			}
			serves := "every model"
			if len(g.ServedModels) > 0 {
				serves = strings.Join(g.ServedModels, ", ")
			}
			fmt.Fprintf(out, "Directory group %s (serves %s):\n", g.Group, serves)
			if err := writeStatus(out, g.Status); err != nil {
				return err
			}
		}
		return nil
	})
}
