package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/simengine"
)

// cl100kRanks is the number of ordinary cl100k tokens; generated ids are
// folded into this range for the response text.
const cl100kRanks = 100256

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.Handler
	}{
		{http.MethodPost, "/v1/chat/completions", s.onRank((*server).handleChat)},
		{http.MethodPost, "/v1/completions", s.onRank((*server).handleCompletion)},
		{http.MethodGet, "/v1/models", http.HandlerFunc(s.handleModels)},
		{http.MethodGet, "/health", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })},
		{http.MethodPost, "/tokenize", http.HandlerFunc(s.handleTokenize)},
		{http.MethodGet, "/metrics", s.metrics.handler},
		{http.MethodPost, "/reset_prefix_cache", http.HandlerFunc(s.handleResetPrefixCache)},
		{http.MethodGet, "/admin/faults", http.HandlerFunc(s.handleGetFaults)},
		{http.MethodPost, "/admin/faults", http.HandlerFunc(s.handleSetFaults)},
		{http.MethodPost, "/admin/restart", http.HandlerFunc(s.handleRestart)},
	}
	// trtllm-serve's routes: events pulled, /metrics as JSON.
	if s.trt != nil {
		routes = append(routes, struct {
			method, path string
			h            http.Handler
		}{http.MethodPost, "/kv_cache_events", http.HandlerFunc(s.handleKVCacheEvents)})
	}
	if s.cfg.metricsFormat == metricsTRTLLM {
		for i := range routes {
			if routes[i].path == "/metrics" {
				routes[i].h = http.HandlerFunc(s.handleTRTMetrics)
			}
		}
	}
	paths := map[string]bool{}
	for _, r := range routes {
		mux.Handle(r.method+" "+r.path, r.h)
		if !paths[r.path] {
			paths[r.path] = true
			mux.HandleFunc(r.path, func(w http.ResponseWriter, r *http.Request) {
				writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowedError", r.Method+" is not allowed on "+r.URL.Path)
			})
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NotFoundError", "no route for "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// writeJSON writes v with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"message":"encoding failed","type":"InternalServerError","code":500}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// writeError writes an OpenAI-style error.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, openai.Error{Error: openai.ErrorBody{Message: msg, Type: typ, Code: status}})
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, args...))
}

// bodyReadTimeout bounds reading a request body (the server has no
// whole-request read timeout, which would cancel long streams).
const bodyReadTimeout = 30 * time.Second

// decodeBody reads a JSON body into v, writing the error response itself.
func (s *server) decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(bodyReadTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.maxBodyBytes)
	dec := json.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError",
				fmt.Sprintf("request body exceeds %d bytes", s.cfg.maxBodyBytes))
			return false
		}
		badRequest(w, "invalid JSON body: %v", err)
		return false
	}
	if dec.More() {
		badRequest(w, "invalid JSON body: trailing data")
		return false
	}
	// Keys match exactly, the last duplicate winning, as Python reads them.
	if err := openai.Unmarshal(raw, v); err != nil {
		badRequest(w, "invalid JSON body: %v", err)
		return false
	}
	return true
}

// checkModel answers 404 (as vLLM) if model names neither the served
// model nor one of its LoRA adapters.
func (s *server) checkModel(w http.ResponseWriter, model string) bool {
	if _, _, ok := s.adapterOf(model); ok {
		return true
	}
	if model != "" && model != s.cfg.model {
		writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model))
		return false
	}
	return true
}

// useModel fills g's model and LoRA adapter from the request's model
// (checked by checkModel): responses name the adapter, as vLLM's do.
func (s *server) useModel(g *genRequest, model string) {
	g.model = s.cfg.model
	if name, id, ok := s.adapterOf(model); ok {
		g.model, g.lora, g.loraID = name, name, id
	}
}

// genRequest is a validated completion request of either API.
type genRequest struct {
	chat         bool
	prompt       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
	cacheSalt    string
	model        string // the name responses carry: the served model or the adapter
	lora         string // LoRA adapter, "" for the base model
	loraID       int64  // its integer id (vLLM's lora_int_id), 0 without one
}

func (s *server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req openai.ChatCompletionRequest
	if !s.decodeBody(w, r, &req) || !s.checkModel(w, req.Model) {
		return
	}
	if len(req.Messages) == 0 {
		badRequest(w, "messages must be a non-empty array")
		return
	}
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	ids, err := s.tmpl.RenderChat(req.Messages, addGen)
	if err != nil {
		badRequest(w, "cannot render messages: %v", err)
		return
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	g := genRequest{chat: true, prompt: ids, stream: req.Stream, cacheSalt: req.CacheSalt}
	s.useModel(&g, req.Model)
	if !s.finishValidation(w, &g, maxTokens, req.N, req.StreamOptions) {
		return
	}
	s.generate(w, r, g)
}

func (s *server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req openai.CompletionRequest
	if !s.decodeBody(w, r, &req) || !s.checkModel(w, req.Model) {
		return
	}
	if !req.Prompt.Set {
		badRequest(w, "prompt is required")
		return
	}
	ids := req.Prompt.Tokens
	if !req.Prompt.IsTokens {
		ids = s.tmpl.RenderCompletion(req.Prompt.Text)
	}
	for i, id := range ids {
		if id >= simengine.VocabSize {
			badRequest(w, "token id %d at position %d is out of vocabulary (size %d)", id, i, simengine.VocabSize)
			return
		}
	}
	g := genRequest{prompt: ids, stream: req.Stream, cacheSalt: req.CacheSalt}
	s.useModel(&g, req.Model)
	if !s.finishValidation(w, &g, req.MaxTokens, req.N, req.StreamOptions) {
		return
	}
	s.generate(w, r, g)
}

// finishValidation checks the fields both APIs share.
func (s *server) finishValidation(w http.ResponseWriter, g *genRequest, maxTokens, n *int, so *openai.StreamOptions) bool {
	if len(g.prompt) == 0 {
		badRequest(w, "the prompt is empty")
		return false
	}
	if n != nil && *n != 1 {
		badRequest(w, "n=%d is not supported; only n=1", *n)
		return false
	}
	g.maxTokens = s.cfg.defaultMaxTokens
	if maxTokens != nil {
		if *maxTokens < 1 {
			badRequest(w, "max_tokens must be at least 1, got %d", *maxTokens)
			return false
		}
		g.maxTokens = *maxTokens
	}
	if so != nil {
		if !g.stream {
			badRequest(w, "stream_options is only allowed when stream is true")
			return false
		}
		g.includeUsage = so.IncludeUsage
	}
	if len(g.prompt) > s.cfg.maxModelLen-g.maxTokens || g.maxTokens > s.cfg.maxModelLen {
		badRequest(w, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.cfg.maxModelLen, len(g.prompt)+g.maxTokens, len(g.prompt), g.maxTokens)
		return false
	}
	return true
}

// namespace is the engine's hashing namespace of a request: the model and
// the cache salt.
func (s *server) namespace(salt string) string {
	if salt == "" {
		return s.cfg.model
	}
	return s.cfg.model + "\x00" + salt
}

// tokenText returns the text of one generated token: ids are folded into
// cl100k's ordinary range and decoded; broken UTF-8 becomes U+FFFD.
func (s *server) tokenText(ids ...uint32) string {
	folded := make([]uint32, len(ids))
	for i, id := range ids {
		folded[i] = id % cl100kRanks
	}
	return strings.ToValidUTF8(s.tok.Decode(folded), "\uFFFD")
}

func usageOf(res simengine.Result, generated int) *openai.Usage {
	return &openai.Usage{
		PromptTokens:        res.PromptTokens,
		CompletionTokens:    generated,
		TotalTokens:         res.PromptTokens + generated,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: max(res.CachedTokens, 0)},
	}
}

// generate submits g to the engine and writes the response.
func (s *server) generate(w http.ResponseWriter, r *http.Request, g genRequest) {
	f := s.faults()
	if f.FailFraction > 0 && rand.Float64() < f.FailFraction {
		writeError(w, http.StatusInternalServerError, "InternalServerError", "injected failure (fail_fraction)")
		return
	}
	prefix := "cmpl-"
	if g.chat {
		prefix = "chatcmpl-"
	}
	id := prefix + strconv.FormatUint(uint64(s.start.UnixNano()), 36) + "-" + strconv.FormatUint(s.nextID.Add(1), 10)
	in := s.current()
	st, err := in.runner.Submit(simengine.Request{
		ID: id, Tokens: g.prompt, MaxTokens: g.maxTokens, Namespace: s.namespace(g.cacheSalt), CacheSalt: g.cacheSalt,
		LoRAName: g.lora, LoRAID: g.loraID,
	})
	switch {
	case errors.Is(err, simengine.ErrTooLong), errors.Is(err, simengine.ErrInvalidRequest):
		badRequest(w, "%v", err)
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", err.Error())
		return
	}
	s.log.Debug("request", "id", id, "prompt_tokens", len(g.prompt), "max_tokens", g.maxTokens, "stream", g.stream)
	ctx := r.Context()
	aborted := false
	abort := func() {
		if !aborted {
			aborted = true
			in.runner.Abort(id)
			s.log.Debug("request aborted by client", "id", id)
		}
	}
	created := time.Now().Unix()
	wallStart := time.Now()
	var sw *sseWriter
	if g.stream {
		sw = newSSEWriter(w)
		sw.model = g.model
		if g.chat {
			sw.chatChunk(s, id, created, openai.ChatDelta{Role: "assistant", Content: ptr("")}, nil)
		}
	}
	var out []uint32
	ctxDone := ctx.Done()
	for tokens := stamp(st.Tokens, g.maxTokens); tokens != nil; {
		select {
		case <-ctxDone:
			ctxDone = nil
			abort()
			continue
		case tk, ok := <-tokens:
			if !ok {
				tokens = nil
				continue
			}
			tok := tk.id
			out = append(out, tok)
			if aborted {
				continue
			}
			if f.SlowFactor > 1 && !slowDown(ctx, wallStart, tk.at, f.SlowFactor) {
				abort()
				continue
			}
			if sw == nil {
				continue
			}
			text := s.tokenText(tok)
			var ok2 bool
			if g.chat {
				ok2 = sw.chatChunk(s, id, created, openai.ChatDelta{Content: &text}, nil)
			} else {
				ok2 = sw.completionChunk(s, id, created, text, nil)
			}
			if !ok2 {
				abort()
			}
		}
	}
	res := <-st.Done
	if len(res.Output) > 0 {
		s.metrics.ttft.Observe(res.TTFT().Seconds() * f.SlowFactor)
	}
	if aborted || ctx.Err() != nil {
		if !aborted {
			abort()
		}
		return
	}
	if res.FinishReason == simengine.FinishAbort && sw == nil {
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "request aborted by the engine (restart or shutdown)")
		return
	}
	usage := usageOf(res, len(out))
	reason := res.FinishReason
	if sw != nil {
		if g.chat {
			sw.chatChunk(s, id, created, openai.ChatDelta{}, &reason)
		} else {
			sw.completionChunk(s, id, created, "", &reason)
		}
		if g.includeUsage {
			if g.chat {
				sw.event(openai.ChatCompletionChunk{ID: id, Object: openai.ObjectChatCompletionChunk, Created: created,
					Model: g.model, Choices: []openai.ChatChunkChoice{}, Usage: usage})
			} else {
				sw.event(openai.Completion{ID: id, Object: openai.ObjectTextCompletion, Created: created,
					Model: g.model, Choices: []openai.CompletionChoice{}, Usage: usage})
			}
		}
		sw.done()
		return
	}
	text := s.tokenText(out...)
	if g.chat {
		writeJSON(w, http.StatusOK, openai.ChatCompletion{
			ID: id, Object: openai.ObjectChatCompletion, Created: created, Model: g.model,
			Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: text}, FinishReason: reason}},
			Usage:   usage,
		})
		return
	}
	writeJSON(w, http.StatusOK, openai.Completion{
		ID: id, Object: openai.ObjectTextCompletion, Created: created, Model: g.model,
		Choices: []openai.CompletionChoice{{Text: text, FinishReason: &reason}},
		Usage:   usage,
	})
}

// slowDown delays a token the engine produced at the given time so that the
// client sees the engine's latency since start stretched by factor. It
// reports false if ctx ended first.
func slowDown(ctx context.Context, start, produced time.Time, factor float64) bool {
	wait := time.Until(start.Add(time.Duration(float64(produced.Sub(start)) * factor)))
	if wait <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// stampedToken is a generated token and when the engine delivered it.
type stampedToken struct {
	id uint32
	at time.Time
}

// stamp forwards the stream's tokens with their arrival times; the returned
// channel is closed after the stream's. It never blocks the engine.
func stamp(tokens <-chan uint32, n int) <-chan stampedToken {
	out := make(chan stampedToken, n)
	go func() {
		defer close(out)
		for t := range tokens {
			out <- stampedToken{id: t, at: time.Now()}
		}
	}()
	return out
}

func ptr[T any](v T) *T { return &v }

// sseWriter writes server-sent events, flushing each one.
type sseWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	err   error
	model string // the model name chunks carry
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// write sends one "data: ...\n\n" event; it reports false once a write
// failed (the client went away).
func (sw *sseWriter) write(data []byte) bool {
	if sw.err != nil {
		return false
	}
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := sw.w.Write(buf); err != nil {
		sw.err = fmt.Errorf("write event: %w", err)
		return false
	}
	if err := sw.rc.Flush(); err != nil {
		sw.err = fmt.Errorf("flush event: %w", err)
		return false
	}
	return true
}

func (sw *sseWriter) event(v any) bool {
	data, err := json.Marshal(v)
	if err != nil {
		sw.err = fmt.Errorf("encode event: %w", err)
		return false
	}
	return sw.write(data)
}

func (sw *sseWriter) done() bool { return sw.write([]byte("[DONE]")) }

func (sw *sseWriter) chatChunk(s *server, id string, created int64, d openai.ChatDelta, finish *string) bool {
	return sw.event(openai.ChatCompletionChunk{
		ID: id, Object: openai.ObjectChatCompletionChunk, Created: created, Model: sw.model,
		Choices: []openai.ChatChunkChoice{{Delta: d, FinishReason: finish}},
	})
}

func (sw *sseWriter) completionChunk(s *server, id string, created int64, text string, finish *string) bool {
	return sw.event(openai.Completion{
		ID: id, Object: openai.ObjectTextCompletion, Created: created, Model: sw.model,
		Choices: []openai.CompletionChoice{{Text: text, FinishReason: finish}},
	})
}

func (s *server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req openai.TokenizeRequest
	if !s.decodeBody(w, r, &req) || !s.checkModel(w, req.Model) {
		return
	}
	var ids []uint32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		badRequest(w, "give either prompt or messages, not both")
		return
	case req.Prompt != nil:
		ids = s.tmpl.RenderCompletion(*req.Prompt)
	case req.Messages != nil:
		addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		var err error
		if ids, err = s.tmpl.RenderChat(req.Messages, addGen); err != nil {
			badRequest(w, "cannot render messages: %v", err)
			return
		}
	default:
		badRequest(w, "prompt or messages is required")
		return
	}
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(w, http.StatusOK, openai.TokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.maxModelLen, Tokens: ids})
}

func (s *server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	for _, rs := range s.all() { // every data-parallel rank's cache
		if err := rs.current().runner.Reset(); err != nil {
			if errors.Is(err, simengine.ErrCacheBusy) {
				writeError(w, http.StatusConflict, "ConflictError", "cannot reset the prefix cache while requests are running")
				return
			}
			writeError(w, http.StatusInternalServerError, "InternalServerError", err.Error())
			return
		}
	}
	s.log.Info("prefix cache reset")
	w.WriteHeader(http.StatusOK)
}

func (s *server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.faults())
}

// faultsUpdate is the body of POST /admin/faults; absent fields keep their
// value.
type faultsUpdate struct {
	DropEventFraction *float64 `json:"drop_event_fraction"`
	LossFraction      *float64 `json:"loss_fraction"`
	SlowFactor        *float64 `json:"slow_factor"`
	FailFraction      *float64 `json:"fail_fraction"`
}

func (s *server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var u faultsUpdate
	if !s.decodeBody(w, r, &u) {
		return
	}
	for name, p := range map[string]*float64{
		"drop_event_fraction": u.DropEventFraction, "loss_fraction": u.LossFraction, "fail_fraction": u.FailFraction,
	} {
		if p != nil && !(*p >= 0 && *p <= 1) {
			badRequest(w, "%s must be in [0, 1], got %v", name, *p)
			return
		}
	}
	if u.SlowFactor != nil && !(*u.SlowFactor >= 1 && *u.SlowFactor <= 1000) {
		badRequest(w, "slow_factor must be in [1, 1000], got %v", *u.SlowFactor)
		return
	}
	var f faults
	for _, rs := range s.all() { // every data-parallel rank alike
		f = rs.setFaults(u)
	}
	s.log.Info("faults set", "drop_event_fraction", f.DropEventFraction, "loss_fraction", f.LossFraction,
		"slow_factor", f.SlowFactor, "fail_fraction", f.FailFraction)
	writeJSON(w, http.StatusOK, f)
}

func (s *server) handleRestart(w http.ResponseWriter, _ *http.Request) {
	for _, rs := range s.all() { // every data-parallel rank restarts
		if err := rs.restart(); err != nil {
			writeError(w, http.StatusInternalServerError, "InternalServerError", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]bool{"restarted": true})
}

// setFaults applies u to s's switches and returns them.
func (s *server) setFaults(u faultsUpdate) faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.DropEventFraction != nil {
		s.fault.DropEventFraction = *u.DropEventFraction
	}
	if u.LossFraction != nil {
		s.fault.LossFraction = *u.LossFraction
	}
	if u.SlowFactor != nil {
		s.fault.SlowFactor = *u.SlowFactor
	}
	if u.FailFraction != nil {
		s.fault.FailFraction = *u.FailFraction
	}
	if s.pub != nil {
		s.pub.SetDropRate(s.fault.DropEventFraction)
		s.pub.SetLossRate(s.fault.LossFraction)
	}
	return s.fault
}
