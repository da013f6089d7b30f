package report

import (
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/workload"
)

// ForTrace returns a report of mode ("sim" or "replay") for recs, with the
// trace statistics and cluster size filled in and no policies yet. ideal is
// workload.IdealHits of recs; timeScale stretches the trace's timestamps
// (the sim's --time-scale; 1 for a replay, which keeps the trace's clock).
func ForTrace(mode, trace string, recs []workload.Record, ideal []int, traceBlockSize, blockSize, replicas int, profile string, kvBlocks int, timeScale float64) *Report {
	ts := workload.Summarize(recs, traceBlockSize)
	var idealSum int64
	for _, v := range ideal {
		idealSum += int64(v)
	}
	rep := &Report{
		Tool: mode, Mode: mode, Machine: benchjson.ThisMachine(), Started: time.Now().UTC().Truncate(time.Second), Trace: trace, Replicas: replicas, Profile: profile,
		KVBlocks: kvBlocks, BlockSize: blockSize, TimeScale: timeScale,
		TraceStats: TraceStats{Requests: ts.Requests, DurationSec: ts.DurationSec * timeScale, InputTokens: ts.InputTokens,
			OutputTokens: ts.OutputTokens, UniqueBlocks: ts.UniqueBlocks, HotWorkingSetTokens: ts.HotWorkingSetTokens,
			IdealHitTokens: idealSum, IdealHitRate: float64(idealSum) / float64(max(ts.InputTokens, 1))},
		ClusterKVTokens: int64(replicas) * int64(kvBlocks) * int64(blockSize),
	}
	if ts.HotWorkingSetTokens > 0 {
		rep.KVToWorkingSet = float64(rep.ClusterKVTokens) / float64(ts.HotWorkingSetTokens)
	}
	return rep
}
