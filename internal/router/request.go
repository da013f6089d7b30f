package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/kvdir/kvdir/internal/openai"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// Endpoint paths the router proxies.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathExplain     = "/v1/kvdir/explain"
	PathView        = "/v1/kvdir/view"
)

// request is a parsed client request: what placement needs, plus the body
// forwarded unchanged.
type request struct {
	path      string // upstream path: PathChat or PathCompletions
	body      []byte // the client's bytes, forwarded as they are
	model     string
	stream    bool
	cacheSalt string
	session   string // session key from the configured header; may be empty
	// subset, when not nil, limits the request to the workers at its
	// endpoints (an endpoint picker's subset hint).
	subset *endpointSubset

	chat     bool
	messages []tokenize.Message
	addGen   bool
	prompt   openai.Prompt
}

// initialBodyBuffer is the most readBody reserves before bytes arrive: a
// client's Content-Length alone never makes the router hold more, the
// buffer grows with the bytes actually read.
const initialBodyBuffer = 64 << 10

// readBody reads at most Config.MaxBodyBytes of r's body, within
// Config.BodyTimeout of the call.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	limit := s.cfg.MaxBodyBytes
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, kind: "BadRequestError",
		msg: "request body is larger than the router's limit of " + strconv.FormatInt(limit, 10) + " bytes"}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	if t := s.cfg.BodyTimeout; t > 0 {
		// Not every ResponseWriter supports deadlines (ErrNotSupported);
		// net/http's HTTP/1 and HTTP/2 servers do.
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(t)) == nil {
			// Cleared once the body is in: the rest of the request (a
			// streamed answer) is not bounded by it.
			defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
		}
	}
	s.metrics.bodiesReading.Inc()
	defer s.metrics.bodiesReading.Dec()
	buf := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 512), initialBodyBuffer)+1))
	n, err := io.Copy(buf, io.LimitReader(r.Body, limit+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, &apiError{status: http.StatusRequestTimeout, kind: "BadRequestError",
			msg: fmt.Sprintf("request body not received within the router's body timeout of %v (%d bytes arrived)", s.cfg.BodyTimeout, n)}
	}
	if err != nil {
		return nil, badRequest("reading the request body: %v", err)
	}
	if n > limit {
		return nil, tooLarge
	}
	return buf.Bytes(), nil
}

// parseRequest decodes body as a chat request (chat true) or a text
// completion request and checks the fields placement needs. Unknown fields
// are left for the engine, as vLLM ignores them; keys match exactly, the
// last of duplicates winning, as the engine's Python reads them
// (openai.Unmarshal).
func parseRequest(body []byte, chat bool) (*request, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest("the request body is empty; expected a JSON object")
	}
	req := &request{body: body, chat: chat}
	if chat {
		var c openai.ChatCompletionRequest
		if err := openai.Unmarshal(body, &c); err != nil {
			return nil, badRequest("malformed JSON body: %v", jsonErr(err))
		}
		if len(c.Messages) == 0 {
			return nil, badRequest("messages must be a non-empty array")
		}
		req.path, req.model, req.stream, req.cacheSalt = PathChat, c.Model, c.Stream, c.CacheSalt
		req.messages = c.Messages
		req.addGen = c.AddGenerationPrompt == nil || *c.AddGenerationPrompt
	} else {
		var c openai.CompletionRequest
		if err := openai.Unmarshal(body, &c); err != nil {
			return nil, badRequest("malformed JSON body: %v", jsonErr(err))
		}
		if !c.Prompt.Set {
			return nil, badRequest("prompt is required")
		}
		req.path, req.model, req.stream, req.cacheSalt = PathCompletions, c.Model, c.Stream, c.CacheSalt
		req.prompt = c.Prompt
	}
	if req.model == "" {
		return nil, badRequest("model is required")
	}
	return req, nil
}

// jsonErr makes decoding errors readable: a type error names the field.
func jsonErr(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return "field " + te.Field + ": expected " + te.Type.String() + ", got " + te.Value
	}
	return err.Error()
}
