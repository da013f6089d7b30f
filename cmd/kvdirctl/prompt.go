package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvdir/kvdir/internal/cli"
	"github.com/kvdir/kvdir/internal/tokenize"
)

// maxPromptFile bounds a messages file (the engines' request limit is
// 8 MiB).
const maxPromptFile = 16 << 20

// promptInput is the prompt given to match and explain: exactly one of
// completion text, chat text (one user message, with an optional system
// message), a messages file, or token ids.
type promptInput struct {
	text         string
	chat         string
	system       string
	messagesFile string
	tokens       string
	model        string
	cacheSalt    string
	lora         string
	noGenPrompt  bool

	stdin io.Reader
}

func (p *promptInput) addFlags(cmd *cobra.Command, modelHelp string) {
	fs := cmd.Flags()
	fs.StringVar(&p.model, "model", "", modelHelp)
	fs.StringVar(&p.text, "prompt", "", "completion prompt text, tokenized as /v1/completions does (no chat template)")
	fs.StringVar(&p.chat, "chat", "", "one user message, rendered with the chat template as /v1/chat/completions does")
	fs.StringVar(&p.system, "system", "", "with --chat: a system message before it")
	fs.StringVar(&p.messagesFile, "messages", "", "JSON file ('-' for stdin): a messages array, or a whole chat or completion request body")
	fs.StringVar(&p.tokens, "tokens", "", "token ids, comma- or space-separated, used as they are")
	fs.StringVar(&p.cacheSalt, "cache-salt", "", "the request's cache_salt (a separate prefix-cache namespace)")
	fs.StringVar(&p.lora, "lora", "", "LoRA adapter name, for match's hashing namespace")
	fs.BoolVar(&p.noGenPrompt, "no-generation-prompt", false, "do not append the assistant generation prompt to chat messages (add_generation_prompt=false)")
	cmd.RegisterFlagCompletionFunc("messages", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"json"}, cobra.ShellCompDirectiveFilterFileExt
	})
}

// prompt is a parsed prompt: either chat messages or completion text or
// token ids.
type prompt struct {
	messages    []tokenize.Message // chat
	text        string             // completion text
	tokens      []uint32           // completion token ids
	isTokens    bool
	isChat      bool
	addGenerate bool
	model       string
	cacheSalt   string
}

// kind names the kind of prompt for a header line.
func (p *prompt) kind() string {
	switch {
	case p.isChat:
		return fmt.Sprintf("chat, %d message(s), ChatML over cl100k", len(p.messages))
	case p.isTokens:
		return "token ids"
	}
	return "completion text, cl100k"
}

// requestFile is a chat or completion request body, or just its messages.
type requestFile struct {
	Model               string             `json:"model"`
	Messages            []tokenize.Message `json:"messages"`
	Prompt              json.RawMessage    `json:"prompt"`
	CacheSalt           string             `json:"cache_salt"`
	AddGenerationPrompt *bool              `json:"add_generation_prompt"`
}

// parse checks that exactly one prompt source is given and reads it.
func (p *promptInput) parse() (*prompt, error) {
	n := 0
	for _, s := range []string{p.text, p.chat, p.messagesFile, p.tokens} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return nil, usageErrorf("give exactly one of --prompt, --chat, --messages or --tokens (got %d)", n)
	}
	if p.system != "" && p.chat == "" {
		return nil, usageErrorf("--system goes with --chat")
	}
	out := &prompt{model: p.model, cacheSalt: p.cacheSalt, addGenerate: !p.noGenPrompt}
	switch {
	case p.text != "":
		out.text = p.text
	case p.chat != "":
		out.isChat = true
		if p.system != "" {
			out.messages = append(out.messages, tokenize.Message{Role: "system", Content: tokenize.TextContent(p.system)})
		}
		out.messages = append(out.messages, tokenize.Message{Role: "user", Content: tokenize.TextContent(p.chat)})
	case p.tokens != "":
		ids, err := parseTokenIDs(p.tokens)
		if err != nil {
			return nil, cli.Usage(fmt.Errorf("--tokens: %w", err))
		}
		out.tokens, out.isTokens = ids, true
	default:
		if err := p.readMessages(out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (p *promptInput) readMessages(out *prompt) error {
	var r io.Reader
	name := p.messagesFile
	if name == "-" {
		r = p.stdin
		if r == nil {
			r = os.Stdin
		}
		name = "stdin"
	} else {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("--messages: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxPromptFile+1))
	if err != nil {
		return fmt.Errorf("--messages: read %s: %w", name, err)
	}
	if len(data) > maxPromptFile {
		return fmt.Errorf("--messages: %s is larger than %d MiB", name, maxPromptFile>>20)
	}
	data = bytes.TrimSpace(data)
	bad := func(err error) error {
		return cli.Usage(fmt.Errorf("--messages %s: %w (want a JSON array of {\"role\",\"content\"} messages, or a request body with \"messages\" or \"prompt\")", name, err))
	}
	if len(data) == 0 {
		return bad(errors.New("empty"))
	}
	var rf requestFile
	if data[0] == '[' {
		if err := json.Unmarshal(data, &rf.Messages); err != nil {
			return bad(err)
		}
		if len(rf.Messages) == 0 {
			return bad(errors.New("no messages"))
		}
	} else if err := json.Unmarshal(data, &rf); err != nil {
		return bad(err)
	}
	if out.model == "" {
		out.model = rf.Model
	}
	if out.cacheSalt == "" {
		out.cacheSalt = rf.CacheSalt
	}
	if rf.AddGenerationPrompt != nil && !p.noGenPrompt {
		out.addGenerate = *rf.AddGenerationPrompt
	}
	switch {
	case len(rf.Messages) > 0:
		out.isChat, out.messages = true, rf.Messages
		for i, m := range rf.Messages {
			if _, err := m.Content.PlainText(); err != nil {
				return bad(fmt.Errorf("message %d: %w", i, err))
			}
		}
	case len(rf.Prompt) > 0 && string(rf.Prompt) != "null":
		if err := decodePrompt(rf.Prompt, out); err != nil {
			return bad(err)
		}
	default:
		return bad(errors.New("neither \"messages\" nor \"prompt\""))
	}
	return nil
}

// decodePrompt reads an OpenAI "prompt": a string, token ids, or a
// one-element array holding either.
func decodePrompt(raw json.RawMessage, out *prompt) error {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		out.text = s
		return nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		out.tokens, out.isTokens = ids, true
		return nil
	}
	var one []json.RawMessage
	if json.Unmarshal(raw, &one) == nil && len(one) == 1 {
		return decodePrompt(one[0], out)
	}
	return errors.New("\"prompt\" must be a string, an array of token ids, or a one-element array of either")
}

// parseTokenIDs reads ids separated by commas and/or white space, with
// optional surrounding brackets.
func parseTokenIDs(s string) ([]uint32, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
	if len(fields) == 0 {
		return nil, errors.New("no token ids")
	}
	ids := make([]uint32, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %d (%q) is not a non-negative 32-bit integer", i, f)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

// tokenIDs renders the prompt as the engine simulator (and the router) do:
// chat messages with the ChatML template over cl100k, completion text with
// cl100k and no template, token ids as given.
func (p *prompt) tokenIDs() ([]uint32, error) {
	if p.isTokens {
		return p.tokens, nil
	}
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if !p.isChat {
		return tmpl.RenderCompletion(p.text), nil
	}
	ids, err := tmpl.RenderChat(p.messages, p.addGenerate)
	if err != nil {
		return nil, cli.Usage(fmt.Errorf("render the chat messages: %w", err))
	}
	return ids, nil
}

// body is the OpenAI request body of the prompt, for the router.
func (p *prompt) body() map[string]any {
	b := map[string]any{"model": p.model}
	switch {
	case p.isChat:
		b["messages"] = p.messages
		if !p.addGenerate {
			b["add_generation_prompt"] = false
		}
	case p.isTokens:
		b["prompt"] = p.tokens
	default:
		b["prompt"] = p.text
	}
	if p.cacheSalt != "" {
		b["cache_salt"] = p.cacheSalt
	}
	return b
}
