package openai

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

func TestPromptUnmarshal(t *testing.T) {
	good := []struct {
		in     string
		text   string
		tokens []uint32
	}{
		{`"hello"`, "hello", nil},
		{`["hello"]`, "hello", nil},
		{`[1, 2, 3]`, "", []uint32{1, 2, 3}},
		{`[[4, 5]]`, "", []uint32{4, 5}},
		{`[]`, "", []uint32{}},
	}
	for _, c := range good {
		var p Prompt
		if err := json.Unmarshal([]byte(c.in), &p); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if !p.Set || p.Text != c.text || p.IsTokens != (c.tokens != nil) || !slices.Equal(p.Tokens, c.tokens) {
			t.Fatalf("%s: got %+v", c.in, p)
		}
	}
	for _, in := range []string{`{"a":1}`, `["a","b"]`, `[1,"a"]`, `[-1]`, `[1.5]`, `[4294967296]`, `[[1],[2]]`, `[["a"]]`, `true`} {
		var p Prompt
		if err := json.Unmarshal([]byte(in), &p); !errors.Is(err, ErrBadPrompt) {
			t.Errorf("%s: err %v, want ErrBadPrompt", in, err)
		}
	}
	var req CompletionRequest
	if err := json.Unmarshal([]byte(`{"prompt":null,"extra":{"x":1}}`), &req); err != nil || req.Prompt.Set {
		t.Fatalf("null prompt: %+v %v", req, err)
	}
}
