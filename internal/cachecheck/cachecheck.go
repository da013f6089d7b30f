// Package cachecheck is kvdir's misconfiguration check: the one rule, shared
// by the router (over a rolling window of its own turns) and the directory
// and kvdirctl (over a worker's replicated kvdirv1.CacheAccounting), that
// says when the cached tokens the router predicted for a worker and those
// its engine reported serving disagree too often to be chance, and what
// the likely cause is.
//
// A turn is one routed request whose engine reported
// usage.prompt_tokens_details.cached_tokens. Two conditions flag a worker:
//
//   - Unmatched events: at least MinTurns turns on which the engine reported
//     at least one block cached ("hit turns"), and more than half of them
//     turns on which the router predicted nothing although the directory
//     held blocks of the worker. The engine caches, its agent publishes, yet
//     the router's hashes never meet the agent's: the two hash in different
//     namespaces (model name, block size, cache salt) or differently (hash
//     seed, tokenizer, chat template).
//   - Over-prediction: at least MinTurns turns the router predicted at least
//     one block for, more than half of them served less than half of the
//     prediction, and the predicted total more than twice the reported
//     total. The directory claims blocks the engine does not serve: the
//     events come from another engine than the one the requests reach, or
//     the engine does not reuse what it announces.
//
// Turns on which the engine reported nothing cached and the router predicted
// nothing (a cold cache, a new prompt) count toward neither condition, so a
// fleet that is just starting is never flagged; an occasional miss (an
// eviction, events still in flight) stays far below the majorities above.
package cachecheck

import (
	"fmt"
	"strings"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// Thresholds of the rule (see the package comment).
const (
	// Window is how many recent turns the router keeps per worker; the
	// directory halves a worker's accounting when it reaches 2*Window
	// turns, so it too weighs roughly the latest Window to 2*Window turns.
	Window = 32
	// MinTurns is the fewest hit turns (or predicted turns) a verdict
	// needs.
	MinTurns = 6
)

// Kind names a flagged condition.
type Kind string

// The conditions.
const (
	KindNone          Kind = ""
	KindUnmatched     Kind = "unmatched-events"
	KindOverPredicted Kind = "over-predicted"
)

// Describe says what a condition means, for logs and kvdirctl.
func (k Kind) Describe() string {
	switch k {
	case KindUnmatched:
		return "the engine serves cached tokens the router never predicts: the worker's events never match the router's hashes"
	case KindOverPredicted:
		return "the router predicts cached tokens the engine does not serve: the directory claims blocks the engine does not hold"
	}
	return "no mismatch"
}

// Cause is the likely cause of a flagged condition, the cause label of
// kvdir_router_cache_mismatch.
type Cause string

// The causes, from what a router or the directory can see.
const (
	CauseModelName Cause = "model name"
	CauseBlockSize Cause = "block size"
	CauseCacheSalt Cause = "cache salt"
	CauseHashSeed  Cause = "hash seed or tokenizer/chat template"
	// CauseNamespace is named when the observer sees neither the
	// requests' model nor their cache salt (an accounting without turns).
	CauseNamespace Cause = "model name, cache salt, hash seed or tokenizer/chat template"
	CauseEvents    Cause = "worker address or events endpoint"
)

// Advice says what to check for a cause.
func (c Cause) Advice() string {
	switch c {
	case CauseModelName:
		return "the agent's --model must be the model name the router sends (the request's \"model\", or the @model of the router's --workers)"
	case CauseBlockSize:
		return "the agent's --block-size and the router's --block-size must be the engine's KV block size (vLLM --block-size)"
	case CauseCacheSalt:
		return "requests carry a cache_salt the agent's events do not: drop the salt, or run an engine and agent that report it"
	case CauseHashSeed:
		return "the router and the agent must tokenize and render alike (same tokenizer and chat template) and hash with the same seed"
	case CauseNamespace:
		return "compare the agent's --model with the requests' model, look for a cache_salt on the requests, and check that the router and agent share tokenizer, chat template and hash seed (the router's log and metric name the cause exactly)"
	case CauseEvents:
		return "the agent's --kv-events-endpoint must be the engine at the worker's address, and the engine must enable prefix caching"
	}
	return ""
}

// Turn is one routed request as the check sees it.
type Turn struct {
	// Predicted and Reported are the cached tokens the router predicted
	// and the engine reported.
	Predicted, Reported int
	// BlockSize is the block size the router hashed the prompt in;
	// RegisteredBlockSize the worker's (0 when unknown).
	BlockSize, RegisteredBlockSize int
	// DirHoldsBlocks says the directory held blocks of the worker.
	DirHoldsBlocks bool
	// ModelDiffers says the router hashed under another model than the
	// worker's registered one; Salted that the request had a cache salt.
	ModelDiffers, Salted bool
}

// Add counts t into a.
func Add(a *kvdirv1.CacheAccounting, t Turn) {
	bs := max(t.BlockSize, 1)
	a.Turns++
	if t.Reported >= bs {
		a.HitTurns++
		if t.Predicted == 0 && t.DirHoldsBlocks {
			a.UnpredictedHits++
		}
	}
	if t.Predicted >= bs {
		a.PredictedTurns++
		if 2*t.Reported < t.Predicted {
			a.OverPredicted++
		}
	}
	a.PredictedTokens += uint64(max(t.Predicted, 0))
	a.ReportedTokens += uint64(max(t.Reported, 0))
	if t.RegisteredBlockSize > 0 && t.BlockSize > 0 && t.BlockSize != t.RegisteredBlockSize {
		a.BlockSizeMismatches++
	}
	if t.ModelDiffers {
		a.ModelMismatches++
	}
	if t.Salted {
		a.SaltedTurns++
	}
	a.LastBlockSize = uint32(max(t.BlockSize, 0))
}

// Decay halves a's counts once it holds 2*Window turns, keeping the ratios
// the rule reads; the directory calls it after every Add.
func Decay(a *kvdirv1.CacheAccounting) {
	if a.Turns < 2*Window {
		return
	}
	for _, p := range []*uint64{&a.Turns, &a.HitTurns, &a.UnpredictedHits, &a.PredictedTurns, &a.OverPredicted,
		&a.PredictedTokens, &a.ReportedTokens, &a.BlockSizeMismatches, &a.ModelMismatches, &a.SaltedTurns} {
		*p /= 2
	}
}

// Evaluate applies the rule to a.
func Evaluate(a *kvdirv1.CacheAccounting) Kind {
	if a == nil {
		return KindNone
	}
	if a.HitTurns >= MinTurns && 2*a.UnpredictedHits > a.HitTurns {
		return KindUnmatched
	}
	if a.PredictedTurns >= MinTurns && 2*a.OverPredicted > a.PredictedTurns && a.PredictedTokens > 2*a.ReportedTokens {
		return KindOverPredicted
	}
	return KindNone
}

// Evidence is what the observer knows of a flagged worker's configuration.
type Evidence struct {
	// RequestModel is the model of the requests placed on the worker (""
	// when unknown, as to the directory); RegisteredModel the model its
	// agent registered ("" when unknown).
	RequestModel, RegisteredModel string
	// HashedBlockSize is the block size the router hashed in;
	// RegisteredBlockSize the worker's registered one, LearnedBlockSize
	// one learned from its engine's events (0 when unknown).
	HashedBlockSize, RegisteredBlockSize, LearnedBlockSize int
	// BlockSizeMismatches counts turns hashed in another block size than
	// the registered one (the directory's view of the same thing).
	BlockSizeMismatches int
	// Salted says the requests carried a cache salt; SaltKnown that the
	// observer can tell.
	Salted, SaltKnown bool
	// Turns, ModelMismatches and SaltedTurns are a directory accounting's
	// counts (see FromAccounting): the share of turns hashed under another
	// model than the registered one, or salted, tells the directory what
	// a router sees directly.
	Turns, ModelMismatches, SaltedTurns int
}

// FromAccounting is the evidence in a worker's replicated accounting, with
// what the directory knows of the worker: its registered model and block
// size, and the block size learned from its events.
func FromAccounting(a *kvdirv1.CacheAccounting, registeredModel string, registeredBS, learnedBS int) Evidence {
	return Evidence{RegisteredModel: registeredModel, RegisteredBlockSize: registeredBS, LearnedBlockSize: learnedBS,
		HashedBlockSize: int(a.GetLastBlockSize()), BlockSizeMismatches: int(a.GetBlockSizeMismatches()),
		Turns: int(a.GetTurns()), ModelMismatches: int(a.GetModelMismatches()), SaltedTurns: int(a.GetSaltedTurns()),
		Salted: 2*a.GetSaltedTurns() > a.GetTurns(), SaltKnown: a.GetTurns() > 0}
}

// LikelyCause names the likely cause of a flagged condition from e: a
// model name that differs from the registered one, then a block size that
// differs from the engine's (learned, else registered), then a cache salt;
// else, for unmatched events, the hash seed or tokenizer/chat template (or,
// when the observer cannot see the model or salt, any part of the
// namespace), and for over-prediction the wiring of events to engines.
func LikelyCause(k Kind, e Evidence) Cause {
	if k == KindNone {
		return ""
	}
	if e.RequestModel != "" && e.RegisteredModel != "" && e.RequestModel != e.RegisteredModel {
		return CauseModelName
	}
	if e.Turns > 0 && 2*e.ModelMismatches > e.Turns {
		return CauseModelName
	}
	engineBS := e.LearnedBlockSize
	if engineBS == 0 {
		engineBS = e.RegisteredBlockSize
	}
	if (e.HashedBlockSize > 0 && engineBS > 0 && e.HashedBlockSize != engineBS) || e.BlockSizeMismatches > 0 {
		return CauseBlockSize
	}
	if k == KindOverPredicted {
		return CauseEvents
	}
	if e.SaltKnown && e.Salted {
		return CauseCacheSalt
	}
	if (e.RequestModel == "" && e.Turns == 0) || !e.SaltKnown {
		return CauseNamespace
	}
	return CauseHashSeed
}

// Summary states a's numbers for a log line or kvdirctl.
func Summary(a *kvdirv1.CacheAccounting) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d turns: %d with cached tokens reported, %d of them unpredicted; %d predicted, %d of them over-predicted; tokens predicted %d, reported %d",
		a.GetTurns(), a.GetHitTurns(), a.GetUnpredictedHits(), a.GetPredictedTurns(), a.GetOverPredicted(),
		a.GetPredictedTokens(), a.GetReportedTokens())
	return b.String()
}
