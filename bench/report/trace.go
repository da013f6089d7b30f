package report

import (
	"time"

	"github.com/kvdir/kvdir/internal/benchjson"
	"github.com/kvdir/kvdir/internal/workload"
)

// Pooled returns the hit tokens and hit rate of one LRU prefix cache of
// capacityTokens serving recs in order (workload.PooledHits).
func Pooled(recs []workload.Record, traceBlockSize, blockSize int, capacityTokens int64) (int64, float64) {
	var hit, input int64
	for i, h := range workload.PooledHits(recs, traceBlockSize, blockSize, capacityTokens) {
		hit += int64(h)
		input += int64(recs[i].InputLength)
	}
	return hit, ratio(float64(hit), float64(input))
}

// ForTrace returns a report of mode ("sim" or "replay") for recs, with the
// trace statistics, cluster size and pooled-cache bound filled in and no
// policies yet (RelateToPooled relates the policies to the bound once they
// are added). ideal is
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
	rep.PooledHitTokens, rep.PooledHitRate = Pooled(recs, traceBlockSize, blockSize, rep.ClusterKVTokens)
	if ts.HotWorkingSetTokens > 0 {
		rep.KVToWorkingSet = float64(rep.ClusterKVTokens) / float64(ts.HotWorkingSetTokens)
	}
	return rep
}
