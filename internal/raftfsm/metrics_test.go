package raftfsm_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, raftfsm.Options{Metrics: raftfsm.NewMetrics(reg)})
	h.register("w")
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 1, 2, 3), removed(gpu, false, 3, 2), cleared()), stApplied)
	h.publish1(batch("w", 1, 1, 1, stored(0, gpu, 7)), stDuplicate) // not applied: not counted
	h.apply(tDrain, &kvdirv1.DrainCommand{WorkerId: "w"})

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]float64{}
	applies := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			label := m.Label[0].GetValue()
			switch mf.GetName() {
			case "kvdir_fsm_events_applied_total":
				events[label] = m.Counter.GetValue()
			case "kvdir_fsm_apply_seconds":
				applies[label] = m.Histogram.GetSampleCount()
			}
		}
	}
	if events["stored"] != 3 || events["removed"] != 2 || events["cleared"] != 1 {
		t.Fatalf("event counters %v, want stored 3 removed 2 cleared 1", events)
	}
	if applies["register"] != 1 || applies["publish"] != 2 || applies["drain"] != 1 {
		t.Fatalf("apply counts %v, want register 1 publish 2 drain 1", applies)
	}
	// An ignorable command of an unknown type is timed as "unknown".
	h.applyData(envelope(t, &kvdirv1.Command{Version: 1, Type: 555, Ignorable: true}))
	mfs, _ = reg.Gather()
	found := false
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if mf.GetName() == "kvdir_fsm_apply_seconds" && m.Label[0].GetValue() == "unknown" && m.Histogram.GetSampleCount() == 1 {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("unknown command type not timed under \"unknown\"")
	}
}
