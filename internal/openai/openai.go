// Package openai holds the request and response types of the subset of the
// OpenAI-compatible HTTP API that vLLM serves and kvdir's engine simulator
// implements: chat and text completions (plain and streamed), models,
// tokenize and errors. Unknown request fields are ignored, as vLLM does;
// Unmarshal decodes request bodies with Python's key matching (exact, the
// last duplicate winning).
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/kvdir/kvdir/internal/tokenize"
)

// Object names of the responses.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectTextCompletion      = "text_completion"
	ObjectList                = "list"
	ObjectModel               = "model"
)

// Error is the body of every error response: {"error": {...}}.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody describes one error. Code is the HTTP status, as in vLLM.
type ErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// StreamOptions are the stream_options of a completion request.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	Model               string             `json:"model"`
	Messages            []tokenize.Message `json:"messages"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Stream              bool               `json:"stream"`
	StreamOptions       *StreamOptions     `json:"stream_options"`
	N                   *int               `json:"n"`
	CacheSalt           string             `json:"cache_salt"`
	AddGenerationPrompt *bool              `json:"add_generation_prompt"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	Model         string         `json:"model"`
	Prompt        Prompt         `json:"prompt"`
	MaxTokens     *int           `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *StreamOptions `json:"stream_options"`
	N             *int           `json:"n"`
	CacheSalt     string         `json:"cache_salt"`
}

// ErrBadPrompt is wrapped by errors about prompts that are neither a string
// nor an array of token ids (or a one-element array of either).
var ErrBadPrompt = errors.New("prompt must be a string or an array of token ids")

// Prompt is a completions prompt: text, or token ids when IsTokens. Batched
// prompts (arrays of several prompts) are rejected.
type Prompt struct {
	Set      bool // the field was present and not null
	Text     string
	Tokens   []uint32
	IsTokens bool
}

// UnmarshalJSON accepts "text", [1, 2, 3], ["text"] and [[1, 2, 3]].
func (p *Prompt) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("null")) {
		*p = Prompt{}
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*p = Prompt{Set: true, Text: s}
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(data, &items); err != nil {
		return ErrBadPrompt
	}
	if len(items) == 1 {
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			var inner Prompt
			if err := inner.UnmarshalJSON(first); err != nil {
				return err
			}
			if !inner.IsTokens && first[0] == '[' {
				return ErrBadPrompt
			}
			*p = inner
			return nil
		}
	}
	ids := make([]uint32, len(items))
	for i, it := range items {
		var f float64
		if err := json.Unmarshal(it, &f); err != nil {
			return fmt.Errorf("%w (item %d)", ErrBadPrompt, i)
		}
		if f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
			return fmt.Errorf("%w: token id %v at %d is not a non-negative integer", ErrBadPrompt, f, i)
		}
		ids[i] = uint32(f)
	}
	*p = Prompt{Set: true, Tokens: ids, IsTokens: true}
	return nil
}

// MarshalJSON writes the prompt in the form UnmarshalJSON reads back to
// the same Prompt: null when not Set, the token ids when IsTokens, else
// the text.
func (p Prompt) MarshalJSON() ([]byte, error) {
	switch {
	case !p.Set:
		return []byte("null"), nil
	case p.IsTokens && p.Tokens == nil:
		return []byte("[]"), nil
	case p.IsTokens:
		return json.Marshal(p.Tokens)
	}
	return json.Marshal(p.Text)
}

// PromptTokensDetails breaks prompt_tokens down.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Usage counts the tokens of a request.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// ChatMessage is an assistant message in a chat completion.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int         `json:"index"`
	Message      ChatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

// ChatCompletion is the non-streamed chat response.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage"`
}

// ChatDelta is the incremental message of a chunk; empty in the final one.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a chat chunk.
type ChatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// ChatCompletionChunk is one streamed chat event. The usage chunk has no
// choices.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// CompletionChoice is one choice of a text completion or chunk.
type CompletionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// Completion is a text completion, or one streamed chunk of it.
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// Model describes a served model.
type Model struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	MaxModelLen int    `json:"max_model_len"`
	// Parent is, for a LoRA adapter, the served name of its base model;
	// nil (null) for a base model, as vLLM lists them.
	Parent *string `json:"parent"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// TokenizeRequest is the body of POST /tokenize: either Prompt or Messages.
type TokenizeRequest struct {
	Model               string             `json:"model"`
	Prompt              *string            `json:"prompt"`
	Messages            []tokenize.Message `json:"messages"`
	AddGenerationPrompt *bool              `json:"add_generation_prompt"`
}

// TokenizeResponse is the body of a /tokenize reply.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
}
