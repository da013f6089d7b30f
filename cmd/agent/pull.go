package main

import (
	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/trtevents"
)

// pullDefaults applies --kv-events-pull-url: the ZeroMQ endpoint's default
// gives way (an endpoint given too is a usage error), and the engine kind
// and block size default to TensorRT-LLM's.
func pullDefaults(p *cli.Program, o *options) error {
	if o.cfg.PullURL == "" {
		return nil
	}
	if p.Source("kv-events-endpoint") != cli.FromDefault {
		return cli.Usagef("--kv-events-endpoint and --kv-events-pull-url are mutually exclusive: give the ZeroMQ endpoint of a vLLM or SGLang engine, or the pull URL of a TensorRT-LLM one")
	}
	if o.cfg.ReplayEndpoint != "" || o.cfg.Bind {
		return cli.Usagef("--kv-events-replay-endpoint and --kv-events-bind are for a ZeroMQ endpoint; the pull endpoint has no replay")
	}
	if o.dpSize > 1 {
		return cli.Usagef("--data-parallel-size %d with --kv-events-pull-url: one pull endpoint serves one worker", o.dpSize)
	}
	o.cfg.Endpoint = ""
	if p.Source("engine-kind") == cli.FromDefault {
		o.engineKind = "trtllm"
	}
	if p.Source("block-size") == cli.FromDefault {
		o.cfg.BlockSize = trtevents.DefaultBlockSize
	}
	return nil
}
