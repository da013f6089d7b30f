package node

import (
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Served models (Config.Models): a fleet may run several directory groups
// side by side, each serving some models. A node of a group refuses the
// registration of a worker of another model, so that a misconfigured agent
// (pointed at the wrong group) fails loudly instead of splitting a model's
// workers over two groups, where each router would see half of them.

// servedModels returns the models this group serves, sorted (nil: every
// model).
func (n *Node) servedModels() []string {
	if len(n.cfg.Models) == 0 {
		return nil
	}
	out := slices.Clone(n.cfg.Models)
	slices.Sort(out)
	return slices.Compact(out)
}

// checkServedModel refuses a worker whose model this group does not serve,
// with FailedPrecondition: retrying cannot help until the agent is pointed
// at its model's group.
func (n *Node) checkServedModel(w *kvdirv1.WorkerSpec) error {
	models := n.servedModels()
	if models == nil || slices.Contains(models, w.GetModel()) {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition,
		"register: worker %s serves model %s, which this directory group does not serve: this group serves %s; that model belongs to another group (point the agent's --directory at that group's nodes)",
		quotePrefix(w.GetId()), quotePrefix(w.GetModel()), strings.Join(models, ", "))
}
