package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Errors returned for requests the chat template cannot render.
var (
	ErrUnsupportedRole    = errors.New("unsupported role")
	ErrUnsupportedContent = errors.New("unsupported content")
)

// Message is one OpenAI chat message. Fields other than role and content
// (name, tool_calls, tool_call_id, ...) are not part of the rendering.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// Content is a message's content: a plain string (Text) or, when Parts is
// non-nil, a list of OpenAI content parts. In JSON it is a string, null or an
// array of parts.
type Content struct {
	Text  string
	Parts []ContentPart
}

// ContentPart is one OpenAI content part; only type "text" can be rendered.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// TextContent returns string content.
func TextContent(s string) Content { return Content{Text: s} }

// PlainText returns the text to render: Text, or the text parts concatenated.
// Parts of any other type make it fail with an error wrapping
// ErrUnsupportedContent that names their types.
func (c Content) PlainText() (string, error) {
	if c.Parts == nil {
		return c.Text, nil
	}
	if len(c.Parts) == 1 && c.Parts[0].Type == "text" {
		return c.Parts[0].Text, nil
	}
	var sb strings.Builder
	var bad []string
	for _, p := range c.Parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
			continue
		}
		q := strconv.Quote(p.Type)
		if !contains(bad, q) {
			bad = append(bad, q)
		}
	}
	if bad != nil {
		return "", fmt.Errorf("%w: content part type %s", ErrUnsupportedContent, strings.Join(bad, ", "))
	}
	return sb.String(), nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// UnmarshalJSON accepts a string, null (empty content) or an array of parts.
func (c *Content) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case bytes.Equal(data, []byte("null")):
		*c = Content{}
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("tokenize: content string: %w", err)
		}
		*c = Content{Text: s}
		return nil
	case len(data) > 0 && data[0] == '[':
		parts := []ContentPart{}
		if err := json.Unmarshal(data, &parts); err != nil {
			return fmt.Errorf("tokenize: content parts: %w", err)
		}
		*c = Content{Parts: parts}
		return nil
	}
	return fmt.Errorf("tokenize: content: %w: want a string, null or an array of parts", ErrUnsupportedContent)
}

// MarshalJSON writes Parts as an array when non-nil, else Text as a string.
func (c Content) MarshalJSON() ([]byte, error) {
	if c.Parts != nil {
		return json.Marshal(c.Parts)
	}
	return json.Marshal(c.Text)
}

// Template renders prompts into token ids. Implementations must be
// message-separable: RenderChat(msgs, g) equals the concatenation of
// AppendMessage for each message followed, when g is true, by
// AppendGenerationPrompt. SessionCache relies on it.
type Template interface {
	// Name names the template, e.g. "chatml".
	Name() string
	// Tokenizer returns the tokenizer the template encodes text with.
	Tokenizer() Tokenizer
	// RenderChat renders a chat conversation, optionally followed by the
	// prompt that asks for the assistant's reply.
	RenderChat(msgs []Message, addGenerationPrompt bool) ([]uint32, error)
	// RenderCompletion renders a completions-API text prompt.
	RenderCompletion(prompt string) []uint32
	// AppendMessage appends the rendering of one message to dst; on error it
	// returns dst unchanged and an error wrapping ErrUnsupportedRole or
	// ErrUnsupportedContent.
	AppendMessage(dst []uint32, m Message) ([]uint32, error)
	// AppendGenerationPrompt appends the generation prompt to dst.
	AppendGenerationPrompt(dst []uint32) []uint32
}

// appendEncoder is implemented by tokenizers that can encode without an
// intermediate slice, such as *BPE.
type appendEncoder interface {
	AppendEncode(dst []uint32, text string) []uint32
}

// ChatML renders messages as
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//
// where the special tokens are single ids and every other part is encoded as
// ordinary text, so text containing "<|im_start|>" cannot forge them. Each
// message is encoded separately between special tokens, which makes the
// rendering of a conversation a prefix of the rendering of its continuation.
// Roles are system, user, assistant and tool. ChatML is safe for concurrent
// use.
type ChatML struct {
	tok            Tokenizer
	enc            func(dst []uint32, text string) []uint32
	imStart, imEnd uint32
	sep            []uint32 // encode("\n") after <|im_end|>
	gen            []uint32 // <|im_start|> encode("assistant\n")
}

// NewChatML returns a ChatML template over tok with the given special ids,
// which must be distinct and must not be ids tok produces for text.
func NewChatML(tok Tokenizer, imStartID, imEndID uint32) (*ChatML, error) {
	if tok == nil {
		return nil, errors.New("tokenize: chatml: nil tokenizer")
	}
	if imStartID == imEndID {
		return nil, fmt.Errorf("tokenize: chatml: im_start and im_end share id %d", imStartID)
	}
	t := &ChatML{tok: tok, imStart: imStartID, imEnd: imEndID}
	if a, ok := tok.(appendEncoder); ok {
		t.enc = a.AppendEncode
	} else {
		t.enc = func(dst []uint32, text string) []uint32 { return append(dst, tok.Encode(text)...) }
	}
	t.sep = t.enc(nil, "\n")
	t.gen = t.enc([]uint32{imStartID}, "assistant\n")
	return t, nil
}

var (
	chatMLOnce sync.Once
	chatML     *ChatML
	chatMLErr  error
)

// ChatMLCL100K returns the ChatML template over CL100K with IMStartID and
// IMEndID. It is created once and shared.
func ChatMLCL100K() (*ChatML, error) {
	chatMLOnce.Do(func() {
		tok, err := CL100K()
		if err != nil {
			chatMLErr = fmt.Errorf("tokenize: chatml: %w", err)
			return
		}
		chatML, chatMLErr = NewChatML(tok, IMStartID, IMEndID)
	})
	return chatML, chatMLErr
}

// Name returns "chatml".
func (t *ChatML) Name() string { return "chatml" }

// Tokenizer returns the template's tokenizer.
func (t *ChatML) Tokenizer() Tokenizer { return t.tok }

// RenderChat renders msgs; errors name the offending message's index.
func (t *ChatML) RenderChat(msgs []Message, addGenerationPrompt bool) ([]uint32, error) {
	sp := scratchPool.Get().(*[]uint32)
	defer putScratch(sp)
	ids := (*sp)[:0]
	for i, m := range msgs {
		var err error
		if ids, err = t.AppendMessage(ids, m); err != nil {
			*sp = ids
			return nil, fmt.Errorf("tokenize: chatml: message %d: %w", i, err)
		}
	}
	if addGenerationPrompt {
		ids = t.AppendGenerationPrompt(ids)
	}
	*sp = ids
	return slices.Clone(ids), nil
}

// RenderCompletion encodes prompt as ordinary text, with no template.
func (t *ChatML) RenderCompletion(prompt string) []uint32 {
	return t.enc(make([]uint32, 0, len(prompt)/4+1), prompt)
}

// AppendMessage appends <|im_start|>{role}\n{content}<|im_end|>\n to dst.
func (t *ChatML) AppendMessage(dst []uint32, m Message) ([]uint32, error) {
	text, err := m.Content.PlainText()
	if err != nil {
		return dst, err
	}
	return t.appendText(dst, m.Role, text)
}

func (t *ChatML) appendText(dst []uint32, role, text string) ([]uint32, error) {
	switch role {
	case "system", "user", "assistant", "tool":
	default:
		return dst, fmt.Errorf("%w %q", ErrUnsupportedRole, role)
	}
	dst = append(dst, t.imStart)
	dst = t.enc(dst, role+"\n"+text)
	dst = append(dst, t.imEnd)
	return append(dst, t.sep...), nil
}

// AppendGenerationPrompt appends <|im_start|>assistant\n to dst.
func (t *ChatML) AppendGenerationPrompt(dst []uint32) []uint32 {
	return append(dst, t.gen...)
}

var _ Template = (*ChatML)(nil)
