package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/router"
)

func TestParseWorkersRanks(t *testing.T) {
	got, err := parseWorkers("dp0=http://10.0.0.7:8000@deepseek#0, dp1=http://10.0.0.7:8000#1,plain=http://h:1@m,bare=http://h:2")
	if err != nil {
		t.Fatal(err)
	}
	want := []router.StaticWorker{
		{ID: "dp0", Address: "http://10.0.0.7:8000", Model: "deepseek", Rank: 0, HasRank: true},
		{ID: "dp1", Address: "http://10.0.0.7:8000", Rank: 1, HasRank: true},
		{ID: "plain", Address: "http://h:1", Model: "m"},
		{ID: "bare", Address: "http://h:2"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"a=http://h:1#", "a=http://h:1#-1", "a=http://h:1#x", "a=http://h:1#01", "a=http://h:1#1.5"} {
		if _, err := parseWorkers(bad); err == nil || !strings.Contains(err.Error(), "rank") {
			t.Errorf("parseWorkers(%q) = %v, want a rank error", bad, err)
		}
	}
}

func TestEngineKindFlag(t *testing.T) {
	_, o, err := parseFlags([]string{"--workers", "a=http://h:1", "--engine-kind", "sglang"}, func(string) string { return "" }, nil, nil)
	if err != nil || o.cfg.EngineKind != "sglang" {
		t.Fatalf("--engine-kind sglang: %v, %+v", err, o)
	}
	_, o, err = parseFlags([]string{"--workers", "a=http://h:1"}, func(k string) string {
		if k == "KVDIR_ROUTER_ENGINE_KIND" {
			return "trtllm"
		}
		return ""
	}, nil, nil)
	if err != nil || o.cfg.EngineKind != "trtllm" {
		t.Fatalf("KVDIR_ROUTER_ENGINE_KIND: %v, %+v", err, o)
	}
}
