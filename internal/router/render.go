package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// Renderer turns a request's prompt into the token ids the engine will see.
// It must render exactly as the engine does, or the hashes will not match.
type Renderer interface {
	// RenderChat renders chat messages; session (may be empty) lets an
	// implementation reuse the previous turn's work.
	RenderChat(ctx context.Context, session string, msgs []tokenize.Message, addGenerationPrompt bool) ([]uint32, error)
	// RenderCompletion renders a completions prompt (text or token ids).
	RenderCompletion(ctx context.Context, p openai.Prompt) ([]uint32, error)
}

// LocalRenderer renders with an in-process template, incrementally per
// session.
type LocalRenderer struct {
	tmpl  tokenize.Template
	cache *tokenize.SessionCache
}

// NewLocalRenderer returns a renderer over tmpl whose session cache holds
// at most maxSessions sessions and maxBytes bytes of token ids and message
// text (tokenize.SessionCache; the block hashes the router attaches, 8
// bytes per block, are not charged).
func NewLocalRenderer(tmpl tokenize.Template, maxSessions, maxBytes int) (*LocalRenderer, error) {
	c, err := tokenize.NewSessionCache(tmpl, maxSessions, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("router: session cache: %w", err)
	}
	return &LocalRenderer{tmpl: tmpl, cache: c}, nil
}

// RenderChat implements Renderer.
func (l *LocalRenderer) RenderChat(_ context.Context, session string, msgs []tokenize.Message, addGen bool) ([]uint32, error) {
	ids, _, err := l.cache.Render(session, msgs, addGen)
	return ids, err
}

// RenderSession renders a turn of a session as pieces shared with the
// session's previous rendering, and returns that rendering (nil if none)
// and the ids the two share (tokenize.SessionCache.RenderSession): the
// router hashes only the blocks past them.
func (l *LocalRenderer) RenderSession(_ context.Context, session string, msgs []tokenize.Message, addGen bool) (r, base *tokenize.Rendering, shared int, err error) {
	return l.cache.RenderSession(session, msgs, addGen)
}

// sessionRenderer is a Renderer that renders a session's turns
// incrementally (LocalRenderer).
type sessionRenderer interface {
	RenderSession(ctx context.Context, session string, msgs []tokenize.Message, addGen bool) (r, base *tokenize.Rendering, shared int, err error)
}

// RenderCompletion implements Renderer.
func (l *LocalRenderer) RenderCompletion(_ context.Context, p openai.Prompt) ([]uint32, error) {
	if p.IsTokens {
		return p.Tokens, nil
	}
	return l.tmpl.RenderCompletion(p.Text), nil
}

// RemoteRenderer asks an engine's POST /tokenize endpoint (served by vLLM and
// by the engine simulator) to render, so the router needs no copy of the
// model's tokenizer. It costs one HTTP round trip per request.
type RemoteRenderer struct {
	url    string // full URL of the /tokenize endpoint
	model  string
	client *http.Client
}

// NewRemoteRenderer returns a renderer that posts to url (e.g.
// "http://engine:8000/tokenize") for model.
func NewRemoteRenderer(url, model string, timeout time.Duration) *RemoteRenderer {
	return &RemoteRenderer{url: url, model: model, client: &http.Client{Timeout: timeout}}
}

// RenderChat implements Renderer.
func (r *RemoteRenderer) RenderChat(ctx context.Context, _ string, msgs []tokenize.Message, addGen bool) ([]uint32, error) {
	return r.tokenize(ctx, openai.TokenizeRequest{Model: r.model, Messages: msgs, AddGenerationPrompt: &addGen})
}

// RenderCompletion implements Renderer.
func (r *RemoteRenderer) RenderCompletion(ctx context.Context, p openai.Prompt) ([]uint32, error) {
	if p.IsTokens {
		return p.Tokens, nil
	}
	return r.tokenize(ctx, openai.TokenizeRequest{Model: r.model, Prompt: &p.Text})
}

func (r *RemoteRenderer) tokenize(ctx context.Context, tr openai.TokenizeRequest) ([]uint32, error) {
	body, err := json.Marshal(tr)
	if err != nil {
		return nil, fmt.Errorf("router: encode tokenize request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("router: tokenize request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("router: tokenize at %s: %w", r.url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("router: read tokenize answer from %s: %w", r.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("router: tokenize at %s: %s: %s", r.url, resp.Status, bytes.TrimSpace(data))
	}
	var out openai.TokenizeResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("router: decode tokenize answer from %s: %w", r.url, err)
	}
	return out.Tokens, nil
}
