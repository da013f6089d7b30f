package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/node"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// TestServedModelsRefuseOtherModels checks Config.Models (--models): a
// group's node registers workers of its models, through a follower as
// through the leader, and refuses another model's with FailedPrecondition,
// naming the model and the models this group serves; the served models
// are reported by ListWorkers, WatchWorkers and Status, and the refused
// worker appears nowhere.
func TestServedModelsRefuseOtherModels(t *testing.T) {
	c := dirtest.New(t, 3, func(_ int, cfg *node.Config) { cfg.Models = []string{"llama", "qwen"} })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	register := func(i int, id, model string) error {
		_, err := kvdirv1.NewAgentServiceClient(c.Conn(i)).Register(ctx,
			&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: id, Model: model, BlockSize: 16}})
		return err
	}
	if err := register(c.Leader(), "w-llama", "llama"); err != nil {
		t.Fatalf("own model through the leader: %v", err)
	}
	if err := register(c.Follower(), "w-qwen", "qwen"); err != nil {
		t.Fatalf("own model through a follower: %v", err)
	}
	for _, i := range []int{c.Leader(), c.Follower()} {
		err := register(i, "w-mistral", "mistral")
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("another model through node %d: %v, want FailedPrecondition", i, err)
		}
		for _, want := range []string{`"mistral"`, "this group serves llama, qwen", "belongs to another group"} {
			if !strings.Contains(status.Convert(err).Message(), want) {
				t.Fatalf("refusal %q lacks %q", status.Convert(err).Message(), want)
			}
		}
	}
	c.Converged()
	for i := range c.Size() {
		lw, err := kvdirv1.NewDirectoryServiceClient(c.Conn(i)).ListWorkers(ctx, &kvdirv1.ListWorkersRequest{IncludeGone: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(lw.ServedModels, ","); got != "llama,qwen" {
			t.Fatalf("node %d ListWorkers served models %q", i, got)
		}
		if len(lw.Workers) != 2 {
			t.Fatalf("node %d lists %d workers, want the two of its models", i, len(lw.Workers))
		}
		for _, w := range lw.Workers {
			if w.GetSpec().GetModel() == "mistral" {
				t.Fatalf("node %d lists the refused worker", i)
			}
		}
		st, err := kvdirv1.NewAdminServiceClient(c.Conn(i)).Status(ctx, &kvdirv1.StatusRequest{})
		if err != nil || strings.Join(st.ServedModels, ",") != "llama,qwen" {
			t.Fatalf("node %d Status served models %v (%v)", i, st.GetServedModels(), err)
		}
	}
	ws, err := kvdirv1.NewDirectoryServiceClient(c.Conn(0)).WatchWorkers(ctx, &kvdirv1.WatchWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := ws.Recv()
	if err != nil || !first.Snapshot || strings.Join(first.ServedModels, ",") != "llama,qwen" {
		t.Fatalf("WatchWorkers snapshot: served models %v (%v)", first.GetServedModels(), err)
	}
}

// TestNoServedModelsTakesEveryModel checks the default: a node without
// Config.Models registers any model and reports no served models.
func TestNoServedModelsTakesEveryModel(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, m := range []string{"a", "b"} {
		if _, err := kvdirv1.NewAgentServiceClient(c.Conn(0)).Register(ctx,
			&kvdirv1.RegisterRequest{Worker: &kvdirv1.WorkerSpec{Id: "w-" + m, Model: m, BlockSize: 16}}); err != nil {
			t.Fatalf("model %s: %v", m, err)
		}
	}
	lw, err := kvdirv1.NewDirectoryServiceClient(c.Conn(0)).ListWorkers(ctx, &kvdirv1.ListWorkersRequest{})
	if err != nil || len(lw.ServedModels) != 0 || len(lw.Workers) != 2 {
		t.Fatalf("ListWorkers: %d workers, served %v (%v)", len(lw.GetWorkers()), lw.GetServedModels(), err)
	}
}
