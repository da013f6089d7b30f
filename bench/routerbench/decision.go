package routerbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/router"
	"github.com/kvdir/kvdir/internal/testkit"
	"github.com/kvdir/kvdir/internal/testkit/fleet"
)

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatReq struct {
	Model     string `json:"model"`
	Messages  []msg  `json:"messages"`
	MaxTokens int    `json:"max_tokens"`
}

// words is text of about one cl100k token per word.
var words = strings.Fields(`the cache prefix token block worker router engine session agent model tensor batch queue
latency memory request response stream replica cluster leader follower index chain hash snapshot lease epoch
prefill decode schedule evict store match score place route serve trace replay profile metric budget`)

func text(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	for i := range tokens {
		if i%12 == 11 {
			fmt.Fprintf(&b, " %d.", rng.IntN(1000))
			continue
		}
		b.WriteByte(' ')
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024, DisableCompression: true}, Timeout: 60 * time.Second}

// post sends a JSON body with a session header and returns the body.
func post(ctx context.Context, url, session string, body []byte) ([]byte, *http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, resp, fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	return b, resp, nil
}

// decisionRouter is a router whose decisions are timed, and what it
// measured.
type decisionRouter struct {
	name string // "directory" (asks a directory node) or "local" (--follow-log)
	url  string
	// wantSource is the match source every warm decision should report
	// (router.MatchLocal), or "" for any.
	wantSource                             string
	warm, cold                             []float64
	parts                                  map[string][]float64
	matched, fallbacks, otherSource, count int
}

// explain asks r to explain a chat request and times the round trip.
func (r *decisionRouter) explain(ctx context.Context, session string, ms []msg, rtt *[]float64) (router.Explanation, error) {
	body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: ms, MaxTokens: 1})
	t0 := time.Now()
	out, _, err := post(ctx, r.url+router.PathExplain, session, body)
	if rtt != nil {
		*rtt = append(*rtt, float64(time.Since(t0).Microseconds()))
	}
	var e router.Explanation
	if err == nil {
		err = json.Unmarshal(out, &e)
	}
	return e, err
}

// benchDecision builds long sessions turn by turn through both routers
// (the turns alternate between them), then times on each, interleaved,
// the decision for one more turn (warm) and for the whole prompt under a
// new session id (cold) with the explain endpoint.
func benchDecision(ctx context.Context, log *slog.Logger, c Options, f *fleet.Fleet, res *Measures) error {
	routers := []*decisionRouter{
		{name: "directory", url: f.Routers[0].URL, parts: map[string][]float64{}},
		{name: "local", url: f.Routers[1].URL, wantSource: router.MatchLocal, parts: map[string][]float64{}},
	}
	if err := waitLocal(ctx, routers[1]); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var rtt []float64
	var tokens int
	for s := range c.Sessions {
		sess := fmt.Sprintf("long-%d", s)
		msgs := []msg{{Role: "system", Content: fmt.Sprintf("Session %d.", s) + text(rng, 1000)}}
		prompt := 0
		for turn := 0; prompt < c.SessionTokens-512; turn++ {
			msgs = append(msgs, msg{Role: "user", Content: text(rng, min(c.TurnTokens, (c.SessionTokens-prompt)*9/10))})
			body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: msgs, MaxTokens: 1})
			out, _, err := post(ctx, routers[turn%2].url+router.PathChat, sess, body)
			if err != nil {
				return fmt.Errorf("build session %s: %w", sess, err)
			}
			var cc struct {
				Choices []struct {
					Message msg `json:"message"`
				} `json:"choices"`
				Usage struct {
					Prompt int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(out, &cc); err != nil || len(cc.Choices) == 0 {
				return fmt.Errorf("decode turn answer %q: %v", out, err)
			}
			prompt = cc.Usage.Prompt
			msgs = append(msgs, cc.Choices[0].Message)
		}
		tokens += prompt
		log.Info("session built", "session", sess, "prompt_tokens", prompt, "messages", len(msgs))
		// The last turn's prompt is a prefix of the session's rendering:
		// wait until both routers see its blocks in the directory.
		for _, r := range routers {
			if err := waitBlocks(ctx, r, sess, msgs, prompt); err != nil {
				return err
			}
		}
		for j := range c.Warm {
			next := append(slices.Clip(msgs), msg{Role: "user", Content: text(rng, 60)})
			for k := range routers {
				r := routers[(j+k)%2] // alternate which router goes first
				e, err := r.explain(ctx, sess, next, &rtt)
				if err != nil {
					return fmt.Errorf("warm decision in %s on the %s router: %w", sess, r.name, err)
				}
				if j == 0 { // the first one also renders the last turn's answer (and, on one router, the last turn)
					continue
				}
				r.count++
				r.warm = append(r.warm, e.DecisionMicros)
				r.parts["render"] = append(r.parts["render"], e.RenderMicros)
				r.parts["hash"] = append(r.parts["hash"], e.HashMicros)
				r.parts["match"] = append(r.parts["match"], e.MatchMicros)
				r.parts["score"] = append(r.parts["score"], e.ScoreMicros)
				if e.Fallback != "" {
					r.fallbacks++
				}
				if r.wantSource != "" && e.MatchSource != r.wantSource {
					r.otherSource++
				}
				for _, w := range e.Workers {
					if w.Worker == e.Pick && w.DirectoryBlocks > 0 {
						r.matched++
					}
				}
			}
		}
		for j := range c.Cold {
			for k := range routers {
				r := routers[(j+k)%2]
				e, err := r.explain(ctx, fmt.Sprintf("cold-%d-%d", s, j), msgs, nil)
				if err != nil {
					return fmt.Errorf("cold decision for %s on the %s router: %w", sess, r.name, err)
				}
				r.cold = append(r.cold, e.DecisionMicros)
			}
		}
	}
	d, l := routers[0], routers[1]
	res.DecisionP50, res.DecisionP99 = pct(d.warm, 50), pct(d.warm, 99)
	res.DecisionParts = partsOf(d)
	res.DecisionColdP50, res.DecisionColdP99 = pct(d.cold, 50), pct(d.cold, 99)
	res.DecisionSamples, res.DecisionColdSamples, res.DecisionFallbacks = len(d.warm), len(d.cold), d.fallbacks
	res.DecisionMatchedFrac = float64(d.matched) / float64(max(d.count, 1))
	res.LocalDecisionP50, res.LocalDecisionP99 = pct(l.warm, 50), pct(l.warm, 99)
	res.LocalDecisionParts = partsOf(l)
	res.LocalDecisionColdP50, res.LocalDecisionColdP99 = pct(l.cold, 50), pct(l.cold, 99)
	res.LocalDecisionSamples, res.LocalDecisionFallbacks, res.LocalDecisionOtherSource = len(l.warm), l.fallbacks, l.otherSource
	res.LocalDecisionMatchedFrac = float64(l.matched) / float64(max(l.count, 1))
	res.SessionPromptTokens = float64(tokens) / float64(c.Sessions)
	res.ExplainRoundTripP50 = pct(rtt, 50)
	res.DecisionMethod = fmt.Sprintf("%d sessions built turn by turn to ~%d prompt tokens through two kvdir routers (default 5 ms match deadline), "+
		"the turns alternating between them: one asks a directory node over gRPC for every match, the other (--follow-log) answers "+
		"from its local replica of the directory; 4 enginesims (--time-scale 0) with agents and a 3-node directory (processes on loopback). "+
		"Once both routers see the last turn's blocks in the directory, per session %d warm decisions on each router, interleaved "+
		"(the session plus one new ~60-token user message: render + tokenize the new messages + hash + match + kvdir score; "+
		"the first one per router, which also renders the last answer, not counted) and %d cold ones (the whole prompt under a new session id), "+
		"each timed by the router itself (decision_us of POST /v1/kvdir/explain, which excludes reading and JSON-decoding the body); "+
		"decision_* is the router asking the directory, decision_local_* the one with the local replica",
		c.Sessions, c.SessionTokens, c.Warm, c.Cold)
	return nil
}

// partsOf returns the p50 and p99 of each part of r's warm decisions.
func partsOf(r *decisionRouter) map[string]float64 {
	out := map[string]float64{}
	for k, v := range r.parts {
		out[k+"_p50_us"], out[k+"_p99_us"] = pct(v, 50), pct(v, 99)
	}
	return out
}

// waitLocal waits until r answers a match from its local replica.
func waitLocal(ctx context.Context, r *decisionRouter) error {
	ms := []msg{{Role: "user", Content: strings.Repeat("Is the replica in sync yet? ", 20)}}
	return testkit.Poll(ctx, 30*time.Second, "the "+r.name+" router to answer from its local replica", func() (bool, string) {
		e, err := r.explain(ctx, "", ms, nil)
		if err != nil {
			return false, err.Error()
		}
		return e.MatchSource == r.wantSource, "match source " + e.MatchSource
	})
}

// waitBlocks waits until r's pick for the session's rendering holds, in
// the directory, the full blocks of its last turn's prompt of
// promptTokens tokens (but one: the engine may keep the last for the
// reply).
func waitBlocks(ctx context.Context, r *decisionRouter, session string, ms []msg, promptTokens int) error {
	what := fmt.Sprintf("the %s router to see the last turn of %s in the directory", r.name, session)
	return testkit.Poll(ctx, 20*time.Second, what, func() (bool, string) {
		e, err := r.explain(ctx, session, ms, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, w := range e.Workers {
			if w.Worker == e.Pick && w.BlockSize > 0 {
				want := promptTokens/w.BlockSize - 1
				return w.DirectoryBlocks >= want, fmt.Sprintf("%s holds %d blocks, want %d", w.Worker, w.DirectoryBlocks, want)
			}
		}
		return false, "no pick"
	})
}

// pct returns the p-th percentile of xs (nearest rank).
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}
