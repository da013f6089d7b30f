package agent

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/dirclient"
	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/dirtest"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// engineMsg encodes one engine batch of stores of block size bs.
func engineMsg(seq uint64, bs int, evs ...*kvevents.BlockStored) kvevents.Msg {
	b := kvevents.Batch{}
	for _, e := range evs {
		e.BlockSize = bs
		b.Events = append(b.Events, e)
	}
	return kvevents.Msg{Seq: seq, Payload: kvevents.EncodeBatch(b, kvevents.FormMap)}
}

func kinds(evs []*kvdirv1.Event) []string {
	var out []string
	for _, e := range evs {
		switch {
		case e.GetLayout() != nil:
			out = append(out, "layout")
		case e.GetStored() != nil:
			out = append(out, "stored")
		case e.GetRemoved() != nil:
			out = append(out, "removed")
		case e.GetCleared() != nil:
			out = append(out, "cleared")
		}
	}
	return out
}

// TestLayoutBeforeBlocksAndAfterRegistration drives the agent's main-loop
// steps against an in-process directory: the first batch of 64-token
// blocks is preceded by the layout naming 64; the same layout is not sent
// again; a new block size sends a new one; a re-registration (new epoch,
// which clears the directory's layout) sends it again with no new event.
func TestLayoutBeforeBlocksAndAfterRegistration(t *testing.T) {
	c := dirtest.New(t, 1, nil)
	dir, err := dirclient.New(dirclient.Config{Addrs: c.APIAddrs(), Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	a, err := New(Config{WorkerID: "w", WorkerAddress: "http://127.0.0.1:1", Model: "m", Endpoint: "tcp://127.0.0.1:1",
		BatchBlocks: 1 << 20, Logger: testkit.Logger(t)}, dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fsm := c.Nodes()[0].FSM()
	worker := func() *kvdirv1.Worker {
		w, _ := fsm.Worker("w")
		return w
	}

	a.register(ctx)
	if a.pub == nil {
		t.Fatal("not registered")
	}
	if bs := worker().GetSpec().GetBlockSize(); bs != 0 {
		t.Fatalf("registered block size %d, want 0 (not told)", bs)
	}
	a.process(ctx, engineMsg(0, 64, stored(nil, tokens(128, 1), 1, 2)))
	if got := kinds(a.pending); !slices.Equal(got, []string{"layout", "stored"}) {
		t.Fatalf("pending after the first store: %v, want the layout before the blocks", got)
	}
	a.flush(ctx)
	if err := a.pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := &kvdirv1.WorkerLayout{BlockSizes: []uint32{64}, Groups: []*kvdirv1.KVGroup{{BlockSize: 64, Indexed: true}}}
	testkit.Eventually(t, 10*time.Second, "the directory to learn block size 64", func() (bool, string) {
		w := worker()
		return proto.Equal(w.GetLayout(), want) && w.GetBlocks() == 2, w.String()
	})

	// The same layout: no layout event.
	a.process(ctx, engineMsg(1, 64, stored(ptr(eh(2)), tokens(64, 9), 3)))
	if got := kinds(a.pending); !slices.Equal(got, []string{"stored"}) {
		t.Fatalf("pending after a store of a known size: %v, want no layout", got)
	}
	// A new size: a new layout first.
	a.process(ctx, engineMsg(2, 16, stored(nil, tokens(16, 5), 4)))
	if got := kinds(a.pending); !slices.Equal(got, []string{"stored", "layout", "stored"}) {
		t.Fatalf("pending after a new block size: %v", got)
	}
	if l := a.pending[1].GetLayout(); !slices.Equal(l.GetBlockSizes(), []uint32{16, 64}) {
		t.Fatalf("layout after a new block size: %v", l)
	}
	a.flush(ctx)
	if err := a.pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// Re-registration clears the directory's layout; the next batch sends
	// it again, though the engine sent nothing new.
	epoch := a.Epoch()
	a.register(ctx)
	if a.Epoch() <= epoch {
		t.Fatalf("epoch %d after re-registration, want > %d", a.Epoch(), epoch)
	}
	if l := worker().GetLayout(); l != nil {
		t.Fatalf("layout right after re-registration: %v, want none", l)
	}
	a.flush(ctx)
	if err := a.pub.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the layout to be sent again in the new epoch", func() (bool, string) {
		return slices.Equal(worker().GetLayout().GetBlockSizes(), []uint32{16, 64}), worker().String()
	})
}

// TestBlockSizeMismatchWarnsOnce checks the warning names both sizes and
// the fix, once per distinct size, and the counter counts every block.
func TestBlockSizeMismatchWarnsOnce(t *testing.T) {
	var logs strings.Builder
	tr := NewTranslator("m", 0, slog.New(slog.NewTextHandler(&logs, nil)))
	tr.SetBlockSize(16)
	for i := range 3 {
		st := stored(nil, tokens(64, uint32(i)), uint64(10+i))
		st.BlockSize = 64
		tr.Translate(nil, batch(st))
	}
	if n := strings.Count(logs.String(), "engine sends blocks of 64"); n != 1 {
		t.Fatalf("%d warnings for block size 64, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "--block-size 16") || !strings.Contains(logs.String(), "set --block-size 64 or leave it unset") {
		t.Fatalf("warning does not name both sizes and the fix:\n%s", logs.String())
	}
	if got := tr.Stats().Problems[ProblemBlockSizeMismatch]; got != 3 {
		t.Fatalf("%s counted %d, want 3", ProblemBlockSizeMismatch, got)
	}
}

// TestBlockSizeMismatchMetric checks the mismatch counter is exported on
// the agent's /metrics.
func TestBlockSizeMismatchMetric(t *testing.T) {
	dir, err := dirclient.New(dirclient.Config{Addrs: []string{"127.0.0.1:1"}, Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dir.Close() })
	a, err := New(Config{WorkerID: "w", Model: "m", Endpoint: "tcp://127.0.0.1:1", BlockSize: 16,
		BatchBlocks: 1 << 20, Logger: testkit.Logger(t)}, dir)
	if err != nil {
		t.Fatal(err)
	}
	a.process(context.Background(), engineMsg(0, 64, stored(nil, tokens(128, 1), 1, 2)))
	if v := metricValue(t, a, "kvdir_agent_problems_total", ProblemBlockSizeMismatch); v != 2 {
		t.Fatalf("kvdir_agent_problems_total{kind=%q} = %v, want 2", ProblemBlockSizeMismatch, v)
	}
}
