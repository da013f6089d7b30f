package main

import (
	"context"
	"fmt"
	"io"

	"github.com/kvdir/kvdir/internal/cachecheck"
	"github.com/kvdir/kvdir/internal/ctlview"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// cacheMismatches fills st's misconfiguration verdicts from the workers'
// cache accounting; a failed read is noted, not fatal (status still
// reports the cluster).
func (a *app) cacheMismatches(ctx context.Context, st *ctlview.Status) {
	st.CacheMismatches = []ctlview.CacheMismatch{}
	lw, err := a.current().ListWorkers(ctx, "", false)
	if err != nil {
		st.CacheCheckError = fmt.Sprintf("cannot list the workers: %v", err)
		return
	}
	st.CacheMismatches = mismatchesOf(lw.GetWorkers())
}

// mismatchesOf judges each worker's accounting by the same rule the
// routers apply to their windows.
func mismatchesOf(ws []*kvdirv1.Worker) []ctlview.CacheMismatch {
	out := []ctlview.CacheMismatch{}
	for _, w := range ws {
		acc := w.GetCacheAccounting()
		kind := cachecheck.Evaluate(acc)
		if kind == cachecheck.KindNone {
			continue
		}
		cause := cachecheck.LikelyCause(kind, cachecheck.FromAccounting(acc,
			w.GetSpec().GetModel(), int(w.GetSpec().GetBlockSize()), int(effectiveLearned(w))))
		out = append(out, ctlview.CacheMismatch{Worker: w.GetSpec().GetId(), Model: w.GetSpec().GetModel(),
			Condition: string(kind), Description: kind.Describe(), LikelyCause: string(cause), Advice: cause.Advice(),
			Turns: acc.GetTurns(), HitTurns: acc.GetHitTurns(), UnpredictedHits: acc.GetUnpredictedHits(),
			PredictedTurns: acc.GetPredictedTurns(), OverPredicted: acc.GetOverPredicted(),
			PredictedTokens: acc.GetPredictedTokens(), ReportedTokens: acc.GetReportedTokens(),
			BlockSize: w.GetSpec().GetBlockSize(), HashedBlockSize: acc.GetLastBlockSize(),
			BlockSizeMismatches: acc.GetBlockSizeMismatches()})
	}
	return out
}

// writeMismatches writes the misconfiguration lines of status.
func writeMismatches(w io.Writer, st *ctlview.Status) {
	if st.CacheCheckError != "" {
		fmt.Fprintf(w, "caches:   not checked: %s\n", st.CacheCheckError)
		return
	}
	if len(st.CacheMismatches) == 0 {
		fmt.Fprintf(w, "caches:   no worker flagged: predicted and engine-reported cached tokens agree\n")
		return
	}
	for _, m := range st.CacheMismatches {
		fmt.Fprintf(w, "MISMATCH: worker %s (model %s): %s (%s)\n", m.Worker, m.Model, m.Condition, m.Description)
		fmt.Fprintf(w, "          %d turns: %d with cached tokens reported, %d of them unpredicted; %d predicted, %d of them over-predicted; tokens predicted %d, reported %d\n",
			m.Turns, m.HitTurns, m.UnpredictedHits, m.PredictedTurns, m.OverPredicted, m.PredictedTokens, m.ReportedTokens)
		fmt.Fprintf(w, "          likely cause: %s; check: %s\n", m.LikelyCause, m.Advice)
	}
}
