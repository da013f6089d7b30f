package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/clitable"
	"github.com/kvdir/kvdir/internal/router"
)

// explainPath is the router's endpoint that scores a request without
// placing it.
const explainPath = router.PathExplain

// explainTokenHeader carries the router's operator token (--explain-token).
const explainTokenHeader = router.HeaderExplainToken

// maxExplainBody bounds the router's answer.
const maxExplainBody = 8 << 20

// explanation is the router's answer (router.Explanation, the type the
// router encodes; -o json passes the router's bytes through unchanged).
type explanation = router.Explanation

// routerError is a failed explain call, with what to try.
type routerError struct{ msg string }

func (e *routerError) Error() string { return e.msg }

func (a *app) explainCommand() *cobra.Command {
	var (
		in            promptInput
		router        string
		session       string
		sessionHeader string
		explainToken  string
	)
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Ask the router how it would place a request, without sending it",
		Long: `explain sends the request to the router's POST /v1/kvdir/explain, which
tokenizes, hashes and scores it exactly as it would place it, but proxies
nothing. It shows, per candidate worker: the prefix it holds (matched
tokens), its load (running, waiting, KV usage, and the router's own requests
in flight and their queued prefill tokens), and under the kvdir policy the
expected wait, the prefill with its cached prefix (PREFILL-MS) and without
(COLD-MS), and the expected time to first token (TTFT-MS); then the pick.

Other policies than kvdir leave the cost columns at zero. FALLBACK says why
the router did not use the directory (unreachable, too slow), if it did not.`,
		Example: `  kvdirctl explain --model llama3-8b --chat "What does a prefix cache save?" --session chat-7f3a
  kvdirctl explain --router http://router.kvdir:8080 --messages request.json -o json`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := in.parse()
			if err != nil {
				return err
			}
			if p.model == "" {
				return usageErrorf("--model is required (or a messages file with \"model\")")
			}
			u, err := url.Parse(router)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageErrorf("--router %q: give the router's base URL, e.g. http://127.0.0.1:8080", router)
			}
			return a.explain(cmd.Context(), strings.TrimRight(router, "/"), sessionHeader, session, explainToken, p)
		},
	}
	in.addFlags(cmd, "the model (the OpenAI \"model\" name; required unless the messages file names it)")
	cmd.Flags().StringVar(&router, "router", "http://127.0.0.1:8080", "the router's base URL")
	cmd.Flags().StringVar(&session, "session", "", "session id, sent in --session-header")
	cmd.Flags().StringVar(&sessionHeader, "session-header", "X-Session-Id", "header the router reads the session id from")
	cmd.Flags().StringVar(&explainToken, "explain-token", "", "the router's operator token, sent in "+explainTokenHeader+": a router given an --explain-token answers explain only with it (prefer KVDIR_CTL_EXPLAIN_TOKEN: flags show in ps)")
	markEnv(cmd.Flags(), "router")
	markEnv(cmd.Flags(), "session-header")
	markEnv(cmd.Flags(), "explain-token")
	return cmd
}

func (a *app) explain(ctx context.Context, routerURL, sessionHeader, session, token string, p *prompt) error {
	body, err := json.Marshal(p.body())
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, routerURL+explainPath, bytes.NewReader(body))
	if err != nil {
		return &routerError{fmt.Sprintf("explain: %v", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set(sessionHeader, session)
	}
	if token != "" {
		req.Header.Set(explainTokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return &routerError{fmt.Sprintf("explain: the router at %s did not answer: %v\n"+
			"  Check --router (or KVDIR_CTL_ROUTER) and that the router runs (its /healthz).", routerURL, err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxExplainBody))
	if err != nil {
		return &routerError{fmt.Sprintf("explain: read the router's answer: %v", err)}
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(raw))
		var oe struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(raw, &oe) == nil && oe.Error.Message != "" {
			msg = oe.Error.Message
		}
		hint := ""
		switch resp.StatusCode {
		case http.StatusNotFound:
			hint = " (a 404 for the path means this router predates explain, or --router is not a kvdir router; for the model, check --model)"
		case http.StatusUnauthorized, http.StatusForbidden:
			hint = " (the router refused the call: explain is private by default; a router given an --explain-token needs it in --explain-token or KVDIR_CTL_EXPLAIN_TOKEN, and one without a token answers only with --explain open)"
		}
		return &routerError{fmt.Sprintf("explain: the router answered %s: %s%s", resp.Status, msg, hint)}
	}
	var e explanation
	if err := json.Unmarshal(raw, &e); err != nil {
		return &routerError{fmt.Sprintf("explain: the router's answer is not an explanation: %v", err)}
	}
	if a.format == clitable.JSON {
		// The router's answer as it is, every field in its order.
		var buf bytes.Buffer
		if err := json.Indent(&buf, bytes.TrimSpace(raw), "", "  "); err != nil {
			return &routerError{fmt.Sprintf("explain: the router's answer is not JSON: %v", err)}
		}
		buf.WriteByte('\n')
		_, err := a.out.Write(clitable.JSONSafe(buf.Bytes()))
		return err
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return &routerError{fmt.Sprintf("explain: the router's answer is not JSON: %v", err)}
	}
	return a.write(a.out, doc, func(out io.Writer) error { return writeExplanation(out, &e) })
}

func writeExplanation(w io.Writer, e *explanation) error {
	session := e.SessionID
	if session == "" {
		session = "(none)"
	}
	fmt.Fprintf(w, "model %s, session %s, policy %s: %d prompt tokens, %d full blocks of %d\n",
		e.Model, session, e.Policy, e.PromptTokens, e.ChainBlocks, e.BlockSize)
	if e.Fallback != "" {
		fmt.Fprintf(w, "fallback: %s (the directory was not used for this decision)\n", e.Fallback)
	}
	fmt.Fprintln(w)
	if len(e.Workers) == 0 {
		fmt.Fprintln(w, "No candidate worker.")
		return nil
	}
	best := 0.0
	for _, s := range e.Workers {
		if s.Worker == e.Pick {
			best = s.TotalMs
		}
	}
	t := clitable.NewTab("WORKER", "MATCHED", "RUNNING", "WAITING", "KV-USAGE", "IN-FLIGHT", "QUEUED", "EXP-CACHED", "WAIT-MS", "PREFILL-MS", "COLD-MS", "TTFT-MS", "VS-PICK", "")
	for _, s := range e.Workers {
		mark, vs := "", "-"
		if s.Worker == e.Pick {
			mark = "pick"
		} else if e.Policy == "kvdir" {
			vs = fmt.Sprintf("%+.1f ms", s.TotalMs-best)
		}
		t.Add(s.Worker, s.MatchedTokens, s.Running, s.Waiting, clitable.Percent(s.KVUsage, 1), s.InFlight, s.QueuedPrefillTokens,
			fmt.Sprintf("%.0f", s.CachedTokens), clitable.Millis(s.WaitMs), clitable.Millis(s.PrefillMs), clitable.Millis(s.ColdPrefillMs),
			clitable.Millis(s.TotalMs), vs, mark)
	}
	if _, err := t.WriteTo(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npick: %s, predicted cached tokens %d", e.Pick, e.PredictedCachedTokens)
	if e.DecisionMicros > 0 {
		fmt.Fprintf(w, " (decided in %.0f µs)", e.DecisionMicros)
	}
	fmt.Fprintln(w)
	return nil
}
