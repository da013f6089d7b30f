package ctlview

// CacheMismatch is a worker flagged by the misconfiguration check: the
// routers' predicted cached tokens and those its engine reported disagree
// (see internal/cachecheck for the rule).
type CacheMismatch struct {
	Worker string `json:"worker"`
	Model  string `json:"model"`
	// Condition is "unmatched-events" or "over-predicted"; Description
	// says what it means.
	Condition   string `json:"condition"`
	Description string `json:"description"`
	// LikelyCause is what to suspect, Advice what to check.
	LikelyCause string `json:"likely_cause"`
	Advice      string `json:"advice"`
	// The numbers behind the verdict (the worker's cache accounting).
	Turns               uint64 `json:"turns"`
	HitTurns            uint64 `json:"hit_turns"`
	UnpredictedHits     uint64 `json:"unpredicted_hits"`
	PredictedTurns      uint64 `json:"predicted_turns"`
	OverPredicted       uint64 `json:"over_predicted"`
	PredictedTokens     uint64 `json:"predicted_tokens"`
	ReportedTokens      uint64 `json:"reported_tokens"`
	BlockSize           uint32 `json:"block_size"`
	HashedBlockSize     uint32 `json:"hashed_block_size"`
	BlockSizeMismatches uint64 `json:"block_size_mismatches"`
}
