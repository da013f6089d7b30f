package main

import (
	"io"
	"testing"

	"github.com/kvdir/kvdir/internal/kvevents"
	"github.com/kvdir/kvdir/internal/simengine"
)

func TestReportModeFlag(t *testing.T) {
	env := func(string) string { return "" }
	cfg, err := parseConfig([]string{"--kv-report-mode", "full", "--kv-cache-groups", "mamba,full_attention"}, env, io.Discard)
	if err != nil || cfg.shape.ReportMode != simengine.ReportFull || cfg.shape.Groups[0].Kind != kvevents.SpecKindMamba {
		t.Fatalf("shape %+v, err %v", cfg.shape, err)
	}
	if cfg, err := parseConfig(nil, env, io.Discard); err != nil || cfg.shape.ReportMode != simengine.ReportIncremental {
		t.Fatalf("default: shape %+v, err %v", cfg.shape, err)
	}
	for _, args := range [][]string{
		{"--kv-report-mode", "all"},
		{"--kv-report-mode", "full", "--kv-events-dialect", "sglang"},
		{"--kv-report-mode", "full", "--kv-events-pull"},
	} {
		if _, err := parseConfig(args, env, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
