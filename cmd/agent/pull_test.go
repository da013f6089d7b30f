package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvdir/kvdir/internal/cli"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

func TestPullFlags(t *testing.T) {
	base := []string{"--directory", "a:1", "--worker-id", "w", "--kv-events-pull-url", "http://e:8000/kv_cache_events"}
	_, o, err := parseFlags(base, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Endpoint != "" || o.cfg.PullURL == "" || o.cfg.PullInterval != 100*time.Millisecond ||
		o.cfg.Engine != kvdirv1.EngineKind_ENGINE_KIND_TRTLLM || o.cfg.BlockSize != 32 {
		t.Fatalf("pull defaults: endpoint %q, url %q, interval %v, engine %v, block size %d",
			o.cfg.Endpoint, o.cfg.PullURL, o.cfg.PullInterval, o.cfg.Engine, o.cfg.BlockSize)
	}
	// Given values win over the pull defaults.
	_, o, err = parseFlags(append(base, "--engine-kind", "enginesim", "--block-size", "64", "--kv-events-pull-interval", "1s"),
		env(map[string]string{}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.Engine != kvdirv1.EngineKind_ENGINE_KIND_ENGINESIM || o.cfg.BlockSize != 64 || o.cfg.PullInterval != time.Second {
		t.Fatalf("given values: engine %v, block size %d, interval %v", o.cfg.Engine, o.cfg.BlockSize, o.cfg.PullInterval)
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: append(base, "--kv-events-endpoint", "tcp://e:5557"), want: "mutually exclusive"},
		{args: base, env: map[string]string{"KVDIR_AGENT_KV_EVENTS_ENDPOINT": "tcp://e:5557"}, want: "mutually exclusive"},
		{args: append(base, "--kv-events-replay-endpoint", "tcp://e:5558"), want: "no replay"},
		{args: append(base, "--data-parallel-size", "2"), want: "one pull endpoint serves one worker"},
		{args: []string{"--directory", "a:1", "--worker-id", "w", "--kv-events-pull-url", "e:8000"}, want: "pull URL"},
	} {
		_, _, err := parseFlags(c.args, env(c.env), io.Discard, io.Discard)
		if err == nil || !cli.IsUsage(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want a usage error with %q", c.args, c.env, err, c.want)
		}
	}
}
