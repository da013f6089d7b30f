// Package replay runs the live benchmarks: a trace replayed against kvdir
// routers, HAProxy or any OpenAI-compatible URL (Compare, RunEndpoint), on
// a fleet of real processes. The open-loop sender itself is
// internal/loadgen, which the chaos tests use too; its types are
// re-exported here under their old names.
package replay

import (
	"context"

	"github.com/kvdir/kvdir/internal/loadgen"
)

// Engine is one replica behind the endpoint.
type Engine = loadgen.Engine

// Config describes one replay run.
type Config = loadgen.Config

// Result is what a run observed.
type Result = loadgen.Result

// Run replays cfg.Records and returns one sample per record, in order.
func Run(ctx context.Context, cfg Config) (*Result, error) { return loadgen.Run(ctx, cfg) }
