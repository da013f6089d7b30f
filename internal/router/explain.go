package router

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvdir/kvdir/internal/costmodel"
	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/placement"
)

// Explanation is the answer of POST /v1/kvdir/explain: how the router would
// place a request, without sending it.
type Explanation struct {
	Model string `json:"model"`
	// LoRA is the adapter the request is hashed under on the picked worker
	// ("" when model is a base model).
	LoRA         string `json:"lora"`
	SessionID    string `json:"session_id"`
	Policy       string `json:"policy"`
	PromptTokens int    `json:"prompt_tokens"`
	BlockSize    int    `json:"block_size"`
	ChainBlocks  int    `json:"chain_blocks"`
	Fallback     string `json:"fallback"`
	// MatchSource says what answered the directory look-up: local (the
	// router's replica of the directory), local-stale (the same, not heard
	// from the directory within --follow-stale-after), or directory.
	MatchSource string `json:"match_source,omitempty"`
	// Group is the directory group serving the model, with several
	// (--directory-group); omitted with one.
	Group                 string  `json:"group,omitempty"`
	Pick                  string  `json:"pick"`
	PredictedCachedTokens int     `json:"predicted_cached_tokens"`
	DecisionMicros        float64 `json:"decision_us"`
	RenderMicros          float64 `json:"render_us"` // render and tokenize (new messages only, for a cached session)
	HashMicros            float64 `json:"hash_us"`
	MatchMicros           float64 `json:"match_us"` // directory look-up plus speculative entries
	ScoreMicros           float64 `json:"score_us"`
	// Profile is the cost model the policy priced with (kvdir only): the
	// calibrated one with --calibrate.
	Profile *ExplainProfile `json:"profile,omitempty"`
	Workers []WorkerScore   `json:"workers"`
}

// ExplainProfile is the cost model in an Explanation, with the names of a
// profile file (costmodel.LoadProfile).
type ExplainProfile struct {
	Name             string  `json:"name"`
	PrefillA         float64 `json:"a_ms"`
	PrefillB         float64 `json:"b_ms_per_token"`
	PrefillC         float64 `json:"c_ms_per_token2"`
	PrefillD         float64 `json:"d_ms_per_prefix_token"`
	DecodeFloor      float64 `json:"floor_ms"`
	DecodePerSeq     float64 `json:"per_seq_ms"`
	DecodePerToken   float64 `json:"per_context_token_ms"`
	CalibratedFrom   string  `json:"calibrated_from,omitempty"` // the prior, with --calibrate
	CalibrationCount uint64  `json:"calibration_observations"`  // observations fitted so far
}

// profiled is a policy that prices with a cost model (placement.KVDir).
type profiled interface {
	Profile() costmodel.Profile
}

// explainProfile returns the cost model of the policy named policy, if it
// has one.
func (s *Server) explainProfile(policy string) *ExplainProfile {
	var pol placement.Policy
	switch policy {
	case s.policy.Name():
		pol = s.policy
	case s.fallback.Name():
		pol = s.fallback
	}
	pp, ok := pol.(profiled)
	if !ok {
		return nil
	}
	p := pp.Profile()
	e := &ExplainProfile{Name: p.Name, PrefillA: p.Prefill.A, PrefillB: p.Prefill.B, PrefillC: p.Prefill.C, PrefillD: p.Prefill.D,
		DecodeFloor: p.Decode.Floor, DecodePerSeq: p.Decode.PerSeq, DecodePerToken: p.Decode.PerToken}
	if c := s.cfg.Calibrator; c != nil {
		e.CalibratedFrom, e.CalibrationCount = c.Prior().Name, c.Stats().Accepted
	}
	return e
}

// WorkerScore is one candidate in an Explanation. The cost fields are those
// of placement.Score, filled by the kvdir policy only.
type WorkerScore struct {
	Worker        string `json:"worker"`
	Address       string `json:"address"`
	MatchedBlocks int    `json:"matched_blocks"` // in blocks of the Explanation's block_size
	// BlockSize is the block size the prompt was hashed in for this
	// worker (learned from its events, else registered, else the router's
	// --block-size); DirectoryBlocks and SpeculativeBlocks count blocks of
	// this size.
	BlockSize       int `json:"block_size"`
	DirectoryBlocks int `json:"directory_blocks"` // -1 when the directory was not asked
	// HostBlocks and DiskBlocks are the matched blocks (in the
	// Explanation's block_size) the worker holds beyond its GPU-held run,
	// in host memory and on disk or further: the engine loads them before
	// the prefill, in LoadedTokens' worth and TransferMs (kvdir only;
	// LoadedTokens is 0 when recomputing them is cheaper).
	HostBlocks          int     `json:"host_blocks"`
	DiskBlocks          int     `json:"disk_blocks"`
	SpeculativeBlocks   int     `json:"speculative_blocks"` // blocks this router placed there recently
	MatchedTokens       int     `json:"matched_tokens"`
	Running             int     `json:"running"`
	Waiting             int     `json:"waiting"`
	KVUsage             float64 `json:"kv_usage"`
	InFlight            int     `json:"in_flight"`
	QueuedPrefillTokens int     `json:"queued_prefill_tokens"`
	Busy                float64 `json:"busy"` // fraction of the recent past a request sent there awaited its first byte
	Retain              float64 `json:"retain"`
	CachedTokens        float64 `json:"cached_tokens"`
	LoadedTokens        float64 `json:"loaded_tokens"`
	TransferMs          float64 `json:"transfer_ms"` // before the prefill; in total_ms, not in prefill_ms
	QueueMs             float64 `json:"queue_ms"`
	KVWaitMs            float64 `json:"kv_wait_ms"` // wait for running requests to free the KV blocks needed
	InterferenceMs      float64 `json:"interference_ms"`
	WaitMs              float64 `json:"wait_ms"`
	PrefillMs           float64 `json:"prefill_ms"`
	ColdPrefillMs       float64 `json:"cold_prefill_ms"`
	ExtraMs             float64 `json:"extra_ms"`    // delay its recomputation imposes on the requests waiting there
	FutureMs            float64 `json:"future_ms"`   // a new session's later requests' expected queueing there
	DisplaceMs          float64 `json:"displace_ms"` // recomputing the other sessions' content the placement would push out there
	TotalMs             float64 `json:"total_ms"`

	// PeerSpeculativeBlocks are the blocks other routers placed there
	// recently (their shared intents, in this block size),
	// PeerQueuedPrefillTokens and PeerInFlight their uncached tokens queued
	// there and their requests in flight; all 0 unless intents are shared.
	// MatchedBlocks, QueuedPrefillTokens and InFlight include them.
	PeerSpeculativeBlocks   int `json:"peer_speculative_blocks"`
	PeerQueuedPrefillTokens int `json:"peer_queued_prefill_tokens"`
	PeerInFlight            int `json:"peer_in_flight"`
	// CacheMismatch is the misconfiguration check's verdict while the
	// worker is flagged (see the router's README).
	CacheMismatch *MismatchState `json:"cache_mismatch,omitempty"`
}

// serveExplain scores a chat or completion request (told apart by the
// presence of "messages") without placing it.
func (s *Server) serveExplain(w http.ResponseWriter, r *http.Request) {
	if !s.explainAllowed(r.Header) {
		msg := "the explain endpoint is off on this router (--explain off, the default without an --explain-token: it would tell any client what other clients recently sent)"
		if s.cfg.Explain == ExplainToken {
			msg = "the explain endpoint needs the operator's token in the " + HeaderExplainToken + " header (--explain token)"
		}
		writeError(w, &apiError{status: http.StatusForbidden, kind: "PermissionDeniedError", msg: msg})
		return
	}
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := openai.Unmarshal(body, &probe); err != nil {
		writeError(w, badRequest("malformed JSON body: %v", jsonErr(err)))
		return
	}
	req, aerr := parseRequest(body, len(probe.Messages) > 0)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	req.session = r.Header.Get(s.cfg.SessionHeader)
	d, aerr := s.decideExplained(r.Context(), req)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.explain(req, d))
}

// explain builds the Explanation of d.
func (s *Server) explain(req *request, d *decision) Explanation {
	e := Explanation{Model: req.model, SessionID: req.session, Policy: d.policy, PromptTokens: d.tokens,
		BlockSize: d.blockSize, ChainBlocks: len(d.chain), Fallback: d.fallback, MatchSource: d.matchSource, Pick: d.pick.Worker,
		PredictedCachedTokens: d.pick.PredictedCachedTokens, LoRA: d.ns.at(d.pick.Index).LoRA,
		DecisionMicros: float64((d.renderDur + d.hashDur + d.matchDur + d.scoreDur).Nanoseconds()) / 1e3,
		RenderMicros:   us(d.renderDur), HashMicros: us(d.hashDur), MatchMicros: us(d.matchDur), ScoreMicros: us(d.scoreDur),
		Profile: s.explainProfile(d.policy), Workers: make([]WorkerScore, len(d.cands))}
	if len(s.groups) > 1 {
		e.Group = d.group.name
	}
	for i, c := range d.cands {
		ws := WorkerScore{Worker: c.Worker, Address: d.workers[i].address, MatchedBlocks: c.MatchedBlocks,
			HostBlocks: c.HostBlocks, DiskBlocks: c.DiskBlocks,
			BlockSize: d.bs[i], DirectoryBlocks: d.dir[i], SpeculativeBlocks: s.speculativeBlocks(d, i),
			MatchedTokens: min(c.MatchedBlocks*d.blockSize, max(d.tokens-1, 0)),
			Running:       c.Load.Running, Waiting: c.Load.Waiting, KVUsage: c.Load.KVUsage, InFlight: c.Load.InFlight,
			QueuedPrefillTokens: c.Load.QueuedPrefillTokens, Busy: c.Load.Busy, CacheMismatch: s.mismatch.state(c.Worker)}
		if d.peerSpec != nil {
			ws.PeerSpeculativeBlocks, ws.PeerQueuedPrefillTokens, ws.PeerInFlight = s.peerSpeculativeBlocks(d, i), d.peerQueued[i], d.peerInFlight[i]
		}
		if i < len(d.pick.Scores) {
			sc := d.pick.Scores[i]
			ws.Retain, ws.CachedTokens, ws.QueueMs, ws.InterferenceMs = sc.Retain, sc.CachedTokens, sc.QueueMs, sc.InterferenceMs
			ws.WaitMs, ws.PrefillMs, ws.ColdPrefillMs, ws.ExtraMs, ws.TotalMs = sc.WaitMs, sc.PrefillMs, sc.ColdPrefillMs, sc.ExtraMs, sc.TotalMs
			ws.FutureMs, ws.KVWaitMs, ws.DisplaceMs = sc.FutureMs, sc.KVWaitMs, sc.DisplaceMs
			ws.LoadedTokens, ws.TransferMs = sc.LoadedTokens, sc.TransferMs
		}
		e.Workers[i] = ws
	}
	return e
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// Explain modes (Config.Explain): who may see what the router predicts a
// worker has cached for a prompt. The prediction is an oracle across users
// (it tells whether anyone recently sent a prefix), so the default is
// private (DefaultExplain).
const (
	ExplainOpen  = "open"  // every client: explain and HeaderPredicted
	ExplainToken = "token" // requests carrying Config.ExplainToken in HeaderExplainToken
	ExplainOff   = "off"   // nobody
)

// DefaultExplain is the explain mode of a router not told one: ExplainToken
// when it has an operator token, else ExplainOff (not ExplainToken with no
// token, which would refuse everyone while saying a token helps).
func DefaultExplain(token string) string {
	if token != "" {
		return ExplainToken
	}
	return ExplainOff
}

// HeaderExplainToken carries the operator's explain token; the router never
// forwards it to an engine.
const HeaderExplainToken = "X-Kvdir-Explain-Token"

// explainAllowed reports whether a request with headers h may see predictions of what is cached
// (the explain endpoint and HeaderPredicted): they tell whether another
// client recently sent a prompt with the same prefix.
func (s *Server) explainAllowed(h http.Header) bool {
	switch s.cfg.Explain {
	case ExplainOpen:
		return true
	case ExplainToken:
		got := h.Get(HeaderExplainToken)
		return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.ExplainToken)) == 1
	}
	return false
}
