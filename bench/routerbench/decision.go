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

// benchDecision builds long sessions through the router, then times the
// decision for one more turn (warm) and for the whole prompt under a new
// session id (cold) with the explain endpoint.
func benchDecision(ctx context.Context, log *slog.Logger, c Options, f *fleet.Fleet, res *Measures) error {
	r := f.Routers[0].URL
	rng := rand.New(rand.NewPCG(1, 2))
	var warm, cold, rtt []float64
	parts := map[string][]float64{}
	var matched, fallbacks, tokens int
	for s := range c.Sessions {
		sess := fmt.Sprintf("long-%d", s)
		msgs := []msg{{Role: "system", Content: fmt.Sprintf("Session %d.", s) + text(rng, 1000)}}
		prompt := 0
		for prompt < c.SessionTokens-512 {
			msgs = append(msgs, msg{Role: "user", Content: text(rng, min(c.TurnTokens, (c.SessionTokens-prompt)*9/10))})
			body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: msgs, MaxTokens: 1})
			out, _, err := post(ctx, r+router.PathChat, sess, body)
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
		// Let the directory catch up with the last turn's blocks.
		time.Sleep(200 * time.Millisecond)
		explain := func(session string, ms []msg) (router.Explanation, error) {
			body, _ := json.Marshal(chatReq{Model: "llama3-8b", Messages: ms, MaxTokens: 1})
			t0 := time.Now()
			out, _, err := post(ctx, r+router.PathExplain, session, body)
			rtt = append(rtt, float64(time.Since(t0).Microseconds()))
			var e router.Explanation
			if err == nil {
				err = json.Unmarshal(out, &e)
			}
			return e, err
		}
		for j := range c.Warm {
			next := append(slices.Clip(msgs), msg{Role: "user", Content: text(rng, 60)})
			e, err := explain(sess, next)
			if err != nil {
				return fmt.Errorf("warm decision in %s: %w", sess, err)
			}
			if j > 0 { // the first one also renders the previous turn's answer
				warm = append(warm, e.DecisionMicros)
				parts["render"] = append(parts["render"], e.RenderMicros)
				parts["hash"] = append(parts["hash"], e.HashMicros)
				parts["match"] = append(parts["match"], e.MatchMicros)
				parts["score"] = append(parts["score"], e.ScoreMicros)
			}
			if e.Fallback != "" {
				fallbacks++
			}
			for _, w := range e.Workers {
				if w.Worker == e.Pick && w.DirectoryBlocks > 0 {
					matched++
				}
			}
		}
		for j := range c.Cold {
			e, err := explain(fmt.Sprintf("cold-%d-%d", s, j), msgs)
			if err != nil {
				return fmt.Errorf("cold decision for %s: %w", sess, err)
			}
			cold = append(cold, e.DecisionMicros)
		}
	}
	res.DecisionP50, res.DecisionP99 = pct(warm, 50), pct(warm, 99)
	res.DecisionParts = map[string]float64{}
	for k, v := range parts {
		res.DecisionParts[k+"_p50_us"], res.DecisionParts[k+"_p99_us"] = pct(v, 50), pct(v, 99)
	}
	res.DecisionColdP50, res.DecisionColdP99 = pct(cold, 50), pct(cold, 99)
	res.DecisionSamples, res.DecisionColdSamples, res.DecisionFallbacks = len(warm), len(cold), fallbacks
	res.DecisionMatchedFrac = float64(matched) / float64(c.Sessions*c.Warm)
	res.SessionPromptTokens = float64(tokens) / float64(c.Sessions)
	res.ExplainRoundTripP50 = pct(rtt, 50)
	res.DecisionMethod = fmt.Sprintf("%d sessions built turn by turn through the router (kvdir policy, default 5 ms match deadline) to ~%d prompt tokens "+
		"on 4 enginesims (--time-scale 0) with agents and a 3-node directory (processes on loopback); then per session %d warm decisions "+
		"(the session plus one new ~60-token user message: render + tokenize the new messages + hash the whole chain + directory Match + kvdir score) "+
		"and %d cold ones (the whole prompt under a new session id), each timed by the router itself (decision_us of POST /v1/kvdir/explain, "+
		"which excludes reading and JSON-decoding the body)", c.Sessions, c.SessionTokens, c.Warm, c.Cold)
	return nil
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
