package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestBlockSizeMismatch(t *testing.T) {
	w := func(reg uint32, learned ...uint32) *kvdirv1.Worker {
		dw := &kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "w", BlockSize: reg}}
		if learned != nil {
			dw.Layout = &kvdirv1.WorkerLayout{BlockSizes: learned}
		}
		return dw
	}
	m, ok := blockSizeMismatch(w(16, 64))
	if !ok || m.Registered != 16 || len(m.Learned) != 1 || m.Learned[0] != 64 {
		t.Fatalf("16 registered, 64 learned: %+v %v", m, ok)
	}
	if want := "agent --block-size 16, engine sends 64: set --block-size 64 or leave it unset"; !strings.Contains(m.Detail, want) {
		t.Fatalf("detail %q, want it to contain %q", m.Detail, want)
	}
	for _, c := range []*kvdirv1.Worker{w(0, 64), w(16), w(64, 64), w(16, 16, 64)} {
		if m, ok := blockSizeMismatch(c); ok {
			t.Fatalf("%v flagged: %+v", c, m)
		}
	}
	if bs := effectiveBlockSize(w(16, 64)); bs != 64 {
		t.Fatalf("effective block size %d, want the learned 64", bs)
	}
	if bs := effectiveBlockSize(w(0)); bs != defaultBlockSize {
		t.Fatalf("effective block size %d, want the default", bs)
	}
	if !holdsBlockSize(w(16, 16, 64), 64) || holdsBlockSize(w(16, 64), 16) {
		t.Fatalf("holdsBlockSize wrong")
	}
}

func TestWorkerViewLayout(t *testing.T) {
	a := &app{}
	dw := &kvdirv1.Worker{Spec: &kvdirv1.WorkerSpec{Id: "w", BlockSize: 16}, Layout: &kvdirv1.WorkerLayout{
		BlockSizes: []uint32{64},
		Groups: []*kvdirv1.KVGroup{{Index: 0, Kind: "full_attention", BlockSize: 64, Indexed: true},
			{Index: 1, Kind: "mamba", BlockSize: 64}}}}
	v := a.workerView(dw)
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var back ctlview.Worker
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.BlockSize != 16 || len(back.BlockSizes) != 1 || back.BlockSizes[0] != 64 || len(back.Groups) != 2 || !back.Groups[0].Indexed || back.Groups[1].Kind != "mamba" {
		t.Fatalf("JSON view %s", b)
	}
	if got := blockSizesText(v); got != "64" {
		t.Fatalf("BLOCK-SIZE %q", got)
	}
	if got := groupsText(v); !strings.Contains(got, "0: full_attention, block size 64, indexed") || !strings.Contains(got, "1: mamba, block size 64, not indexed") {
		t.Fatalf("groups %q", got)
	}
	var out bytes.Buffer
	st := &ctlview.Status{BlockSizeMismatches: []ctlview.BlockSizeMismatch{{Worker: "w", Detail: "agent --block-size 16, engine sends 64"}}}
	if err := writeStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "warning:  worker w block size: agent --block-size 16, engine sends 64") {
		t.Fatalf("status text:\n%s", out.String())
	}
}
